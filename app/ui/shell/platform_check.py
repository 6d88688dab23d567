"""Before Qt starts on Linux/X11: can its xcb platform plugin load? Qt itself aborts the process
(a core dump) when a system library of that plugin is missing, most often libxcb-cursor0, which
PySide6 >= 6.5 needs and many desktops lack. Here the plugin's libraries are looked up first, and
a missing one is one line naming it and the command that installs it.

Torch-free and Qt-free (the plugin is found on disk beside the PySide6 package, not imported).
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

# Qt's xcb plugin is libqxcb.so, which links libQt6XcbQpa: the X11 libraries are needed by both.
_PLUGIN = Path("plugins") / "platforms" / "libqxcb.so"
_QPA_LIBRARY = Path("lib") / "libQt6XcbQpa.so.6"


def uses_xcb(environ: dict[str, str] | None = None) -> bool:
    """Whether Qt will start on its xcb (X11) platform: asked for, or the default on an X11
    session (on Wayland Qt picks its wayland plugin first)."""
    env = os.environ if environ is None else environ
    if not sys.platform.startswith("linux"):
        return False
    platform = env.get("QT_QPA_PLATFORM", "")
    if platform:
        return platform.split(":")[0].split(";")[0] == "xcb"
    return bool(env.get("DISPLAY")) and not env.get("WAYLAND_DISPLAY")


def qt_folder() -> Path | None:
    spec = importlib.util.find_spec("PySide6")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "Qt"


def missing_libraries(binaries: list[Path]) -> list[str]:
    """The shared libraries (sonames) these ELF files need and the system does not have, by
    `ldd` where it exists; else the first that dlopen reports."""
    existing = [b for b in binaries if b.is_file()]
    ldd = shutil.which("ldd")
    if ldd is not None and existing:
        try:
            out = subprocess.run([ldd, *map(str, existing)], capture_output=True, text=True, timeout=10).stdout
        except (OSError, subprocess.SubprocessError):
            out = ""
        found = re.findall(r"^\s*(\S+) => not found", out, flags=re.MULTILINE)
        return list(dict.fromkeys(found))
    for binary in existing:
        try:
            ctypes.CDLL(str(binary))
        except OSError as exc:
            match = re.match(r"([^:\s]+\.so[.\d]*)", str(exc))
            return [match.group(1)] if match else [str(exc)]
    return []


def debian_package(soname: str) -> str:
    """Debian's package of a library: its name and major version (a digit-ended name takes a dash):
    libxcb-cursor.so.0 -> libxcb-cursor0, libxkbcommon-x11.so.0 -> libxkbcommon-x11-0."""
    match = re.match(r"(.+?)\.so\.(\d+)", soname)
    if match is None:
        return soname
    stem, major = match.group(1).lower(), match.group(2)
    return f"{stem}-{major}" if stem[-1].isdigit() else f"{stem}{major}"


def xcb_problem(environ: dict[str, str] | None = None) -> str | None:
    """One line saying what keeps Qt's xcb platform from loading, or None when nothing does (or
    xcb is not what Qt will use)."""
    if not uses_xcb(environ):
        return None
    qt = qt_folder()
    if qt is None:
        return None
    missing = missing_libraries([qt / _PLUGIN, qt / _QPA_LIBRARY])
    if not missing:
        return None
    packages = " ".join(dict.fromkeys(debian_package(m) for m in missing))
    them = "them" if len(missing) > 1 else "it"
    return (f"the window cannot open: Qt's X11 platform needs {', '.join(missing)}, missing on this system; "
            f"install {them} (Debian/Ubuntu: sudo apt install {packages}; elsewhere: your system's package "
            f"of that library) or use the command line (`specula --help`)")
