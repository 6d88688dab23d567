"""The window starts or says why: a missing X11 library of Qt's xcb plugin is one line, no core dump."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from app.ui.shell.platform_check import debian_package, missing_libraries, uses_xcb, xcb_problem


@pytest.mark.parametrize("soname, package", [
    ("libxcb-cursor.so.0", "libxcb-cursor0"),
    ("libxcb-icccm.so.4", "libxcb-icccm4"),
    ("libxkbcommon-x11.so.0", "libxkbcommon-x11-0"),
    ("libX11-xcb.so.1", "libx11-xcb1"),
    ("libEGL.so.1", "libegl1"),
])
def test_debian_package_names(soname, package):
    assert debian_package(soname) == package


def test_xcb_is_what_qt_uses_on_an_x11_session_or_when_asked():
    if not sys.platform.startswith("linux"):
        pytest.skip("xcb is Linux's")
    assert uses_xcb({"DISPLAY": ":0"})
    assert uses_xcb({"QT_QPA_PLATFORM": "xcb"})
    assert not uses_xcb({"DISPLAY": ":0", "WAYLAND_DISPLAY": "wayland-0"})
    assert not uses_xcb({"QT_QPA_PLATFORM": "offscreen", "DISPLAY": ":0"})
    assert xcb_problem({"QT_QPA_PLATFORM": "offscreen"}) is None


@pytest.mark.skipif(shutil.which("cc") is None or not sys.platform.startswith("linux"), reason="needs a C compiler on Linux")
def test_a_library_that_needs_a_missing_library_is_named(tmp_path):
    """A real ELF file linked against a library that is then removed: what a desktop without
    libxcb-cursor0 has for Qt's plugin."""
    (tmp_path / "gone.c").write_text("int gone(void) { return 1; }\n")
    (tmp_path / "plugin.c").write_text("int gone(void); int plugin(void) { return gone(); }\n")
    subprocess.run(["cc", "-shared", "-fPIC", "-o", tmp_path / "libspecula-gone.so.3", tmp_path / "gone.c",
                    "-Wl,-soname,libspecula-gone.so.3"], check=True)
    subprocess.run(["cc", "-shared", "-fPIC", "-o", tmp_path / "libplugin.so", tmp_path / "plugin.c",
                    tmp_path / "libspecula-gone.so.3"], check=True)
    (tmp_path / "libspecula-gone.so.3").unlink()
    assert missing_libraries([tmp_path / "libplugin.so"]) == ["libspecula-gone.so.3"]
    assert debian_package("libspecula-gone.so.3") == "libspecula-gone3"


def test_the_window_says_what_is_missing_instead_of_aborting(tmp_path):
    env = {**os.environ, "QT_QPA_PLATFORM": "xcb", "DISPLAY": ":97", "SPECULA_DATA_DIR": str(tmp_path)}
    if xcb_problem(env) is None:
        pytest.skip("this machine has every library of Qt's X11 plugin: nothing to report")
    done = subprocess.run([sys.executable, "-m", "app"], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "apt install" in lines[0] and ".so" in lines[0]
