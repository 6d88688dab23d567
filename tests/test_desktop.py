"""`specula install-desktop`: the menu entry validates and launches something real, the icons are
real PNGs of every size, and uninstalling leaves the data folder exactly as it was found."""

from __future__ import annotations

import configparser
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from app import desktop_entry
from app.desktop_entry import APP_ID, ICON_SIZES, DesktopInstallError

ROOT = Path(__file__).resolve().parent.parent
VALIDATOR = shutil.which("desktop-file-validate")
NO_VALIDATOR = "desktop-file-validate is not installed (Debian/Ubuntu: apt-get install desktop-file-utils)"


def tree(folder: Path) -> dict[str, str]:
    """Every folder and file under `folder` (relative path -> 'dir' or the file's sha256)."""
    if not folder.exists():
        return {}
    out = {}
    for path in sorted(folder.rglob("*")):
        key = path.relative_to(folder).as_posix()
        out[key] = "dir" if path.is_dir() else hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def read_entry(path: Path) -> dict[str, str]:
    parser = configparser.RawConfigParser(strict=True)
    parser.optionxform = str  # keys are case-sensitive
    parser.read(path, encoding="utf-8")
    return dict(parser["Desktop Entry"])


def unescape_string(value: str) -> str:
    """The spec's string escapes: \\s \\n \\t \\r \\\\."""
    out, i = [], 0
    while i < len(value):
        if value[i] == "\\" and i + 1 < len(value):
            out.append({"s": " ", "n": "\n", "t": "\t", "r": "\r", "\\": "\\"}.get(value[i + 1], value[i + 1]))
            i += 2
        else:
            out.append(value[i])
            i += 1
    return "".join(out)


def parse_exec(value: str) -> list[str]:
    """The Exec key back to argv, as a launcher reads it: string escapes, then the quoting rule
    (inside double quotes a backslash escapes " ` $ \\), then %% -> %."""
    text, args, current, quoted, i, started = unescape_string(value), [], [], False, 0, False
    while i < len(text):
        c = text[i]
        if quoted:
            if c == "\\" and i + 1 < len(text) and text[i + 1] in '"`$\\':
                current.append(text[i + 1])
                i += 1
            elif c == '"':
                quoted = False
            else:
                current.append(c)
        elif c == '"':
            quoted, started = True, True
        elif c == " ":
            if started or current:
                args.append("".join(current))
            current, started = [], False
        else:
            current.append(c)
        i += 1
    assert not quoted, f"unterminated quote in Exec={value!r}"
    if started or current:
        args.append("".join(current))
    return [a.replace("%%", "%") for a in args]


def validate(path: Path) -> None:
    result = subprocess.run([VALIDATOR, str(path)], capture_output=True, text=True)
    assert result.returncode == 0 and not result.stdout.strip(), result.stdout + result.stderr


# --- the entry ------------------------------------------------------------------------------

def test_installed_entry_launches_an_existing_executable_and_names_the_app(tmp_path):
    result = desktop_entry.install(tmp_path / "share")
    entry = read_entry(result.entry)
    assert result.entry == tmp_path / "share" / "applications" / f"{APP_ID}.desktop"
    assert entry["Type"] == "Application" and entry["Name"] == "Specula"
    assert entry["Icon"] == APP_ID and entry["Terminal"] == "false"
    # Qt's X11 WM_CLASS class is the application name; on Wayland the app id is the file name.
    assert entry["StartupWMClass"] == "Specula"
    argv = parse_exec(entry["Exec"])
    assert argv == desktop_entry.launcher_command()
    program = Path(argv[0])
    assert program.is_absolute() and program.is_file() and os.access(program, os.X_OK)
    assert unescape_string(entry["TryExec"]) == argv[0]


def test_the_entry_command_really_starts_specula(tmp_path):
    """Run what the menu would run (with --version: no window needed), from another folder."""
    entry = read_entry(desktop_entry.install(tmp_path / "share").entry)
    argv = parse_exec(entry["Exec"])
    cwd = unescape_string(entry["Path"]) if "Path" in entry else str(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([*argv, "--version"], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.startswith("specula "), done.stderr


@pytest.mark.skipif(VALIDATOR is None, reason=NO_VALIDATOR)
def test_entry_passes_desktop_file_validate(tmp_path):
    validate(desktop_entry.install(tmp_path).entry)


@pytest.mark.parametrize("program", [
    "/opt/My Apps/specula",
    "/home/a'b/$HOME/100%/x\\y/\"q\"/`t`/specula",
    "/plain/path/specula",
])
def test_exec_quoting_round_trips_awkward_paths(tmp_path, program):
    command = [program, "-m", "app"]
    path = tmp_path / f"{APP_ID}.desktop"
    path.write_text(desktop_entry.desktop_entry_text(command), encoding="utf-8")
    entry = read_entry(path)
    assert parse_exec(entry["Exec"]) == command
    if VALIDATOR is not None:
        validate(path)


def test_a_path_with_a_line_break_is_refused_in_one_line():
    with pytest.raises(DesktopInstallError, match="line break"):
        desktop_entry.desktop_entry_text(["/tmp/a\nb/specula"])


# --- install / uninstall --------------------------------------------------------------------

def populated_prefix(prefix: Path) -> None:
    """A data folder in use: another app's entry and icons, an icon theme index (so that
    gtk-update-icon-cache, where present, really writes a cache), a user file."""
    (prefix / "applications").mkdir(parents=True)
    (prefix / "applications" / "other.desktop").write_text(
        "[Desktop Entry]\nType=Application\nName=Other\nExec=/bin/true\n", encoding="utf-8")
    apps48 = prefix / "icons" / "hicolor" / "48x48" / "apps"
    apps48.mkdir(parents=True)
    (apps48 / "other.png").write_bytes(desktop_entry.icon_png(48).read_bytes())
    (prefix / "icons" / "hicolor" / "index.theme").write_text(
        "[Icon Theme]\nName=Hicolor\nDirectories=48x48/apps\n\n[48x48/apps]\nSize=48\n", encoding="utf-8")
    (prefix / "notes.txt").write_text("mine", encoding="utf-8")


@pytest.mark.parametrize("state", ["missing", "empty", "populated"])
def test_install_then_uninstall_leaves_the_prefix_as_found(tmp_path, state):
    prefix = tmp_path / "share"
    if state != "missing":
        prefix.mkdir()
    if state == "populated":
        populated_prefix(prefix)
    before = tree(prefix)

    result = desktop_entry.install(prefix)
    after_install = tree(prefix)
    for size in ICON_SIZES:
        assert f"icons/hicolor/{size}x{size}/apps/{APP_ID}.png" in after_install
    assert f"icons/hicolor/scalable/apps/{APP_ID}.svg" in after_install
    assert f"applications/{APP_ID}.desktop" in after_install
    assert "specula/installed-files.txt" in after_install
    assert {k: v for k, v in after_install.items() if k in before} == before  # nothing touched
    assert len(result.files) == len(ICON_SIZES) + 2

    removed = desktop_entry.uninstall(prefix)
    assert tree(prefix) == before
    assert prefix.exists() == (state != "missing")
    assert len(removed) == len(result.files) + 1  # and the manifest
    assert desktop_entry.uninstall(prefix) == []  # a second uninstall finds nothing to do


def test_reinstall_replaces_and_a_file_changed_since_is_kept(tmp_path):
    prefix = tmp_path / "share"
    desktop_entry.install(prefix)
    entry = desktop_entry.install(prefix, command=["/opt/specula/Specula"]).entry  # replaces
    assert parse_exec(read_entry(entry)["Exec"]) == ["/opt/specula/Specula"]
    entry.write_text(entry.read_text(encoding="utf-8") + "X-Mine=true\n", encoding="utf-8")
    desktop_entry.uninstall(prefix)
    assert set(tree(prefix)) == {"applications", f"applications/{APP_ID}.desktop"}
    assert "X-Mine=true" in entry.read_text(encoding="utf-8")


def test_a_failed_install_leaves_nothing_behind(tmp_path):
    prefix = tmp_path / "share"
    (prefix / "icons").mkdir(parents=True)
    (prefix / "icons" / "hicolor").write_text("a file where the theme folder should be", encoding="utf-8")
    before = tree(prefix)
    with pytest.raises(DesktopInstallError, match="cannot install under"):
        desktop_entry.install(prefix)
    assert tree(prefix) == before


# --- the command line -----------------------------------------------------------------------

def specula(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "app", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env={**os.environ, **(env or {})})


def test_cli_installs_into_xdg_data_home_and_uninstalls(tmp_path):
    data_home = tmp_path / "data-home"
    done = specula("install-desktop", env={"XDG_DATA_HOME": str(data_home)})
    assert done.returncode == 0, done.stderr
    assert f"installed {data_home}/applications/{APP_ID}.desktop" in done.stdout
    assert (data_home / "icons" / "hicolor" / "256x256" / "apps" / f"{APP_ID}.png").is_file()
    done = specula("install-desktop", "--uninstall", env={"XDG_DATA_HOME": str(data_home)})
    assert done.returncode == 0 and "removed" in done.stdout, done.stderr
    assert not data_home.exists()


def test_cli_bad_manifest_is_one_line_and_removes_nothing(tmp_path):
    prefix = tmp_path / "share"
    desktop_entry.install(prefix)
    manifest = desktop_entry.manifest_path(prefix)
    manifest.write_text(manifest.read_text(encoding="utf-8") + "rm -rf /\n", encoding="utf-8")
    before = tree(prefix)
    done = specula("install-desktop", "--uninstall", "--prefix", str(prefix))
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1 and "is not a manifest entry" in done.stderr
    assert tree(prefix) == before


def test_desktop_entry_code_needs_no_qt():
    code = "import sys, app.cli.desktop, app.desktop_entry; print('PySide6' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "False", done.stderr


# --- the icons ------------------------------------------------------------------------------

def test_icons_are_real_pngs_of_every_size():
    from PySide6.QtGui import QImage
    from PySide6.QtSvg import QSvgRenderer

    for size in ICON_SIZES:
        path = desktop_entry.icon_png(size)
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", path
        image = QImage(str(path))
        assert not image.isNull() and (image.width(), image.height()) == (size, size), path
        assert image.hasAlphaChannel()
        corner, centre = image.pixelColor(0, 0), image.pixelColor(size // 2, size // 2)
        assert corner.alpha() == 0 and centre.alpha() == 255, path  # a rounded tile, not a blank
    svg = QSvgRenderer(str(desktop_entry.icon_svg()))
    assert svg.isValid() and svg.defaultSize().width() == svg.defaultSize().height()


# --- files Specula did not write ------------------------------------------------------------

FOREIGN = "[Desktop Entry]\nType=Application\nName=Specula (packaged)\nExec=/usr/bin/specula\n"


def test_an_entry_it_did_not_write_is_neither_replaced_nor_removed(tmp_path):
    prefix = tmp_path / "share"
    entry = prefix / "applications" / f"{APP_ID}.desktop"
    entry.parent.mkdir(parents=True)
    entry.write_text(FOREIGN, encoding="utf-8")
    before = tree(prefix)
    with pytest.raises(DesktopInstallError, match="was not written by `specula install-desktop`.*--force"):
        desktop_entry.install(prefix)
    assert tree(prefix) == before
    assert desktop_entry.uninstall(prefix) == [] and entry.read_text(encoding="utf-8") == FOREIGN
    done = specula("install-desktop", "--prefix", str(prefix))
    assert done.returncode == 1 and done.stderr.count("\n") == 1 and "--force" in done.stderr
    assert tree(prefix) == before
    # --force replaces it, knowingly; from then on it is ours and uninstall removes it
    desktop_entry.install(prefix, command=["/opt/specula/Specula"], force=True)
    assert parse_exec(read_entry(entry)["Exec"]) == ["/opt/specula/Specula"]
    desktop_entry.uninstall(prefix)
    assert not entry.exists()


def test_an_entry_edited_since_install_is_not_replaced_without_force(tmp_path):
    prefix = tmp_path / "share"
    entry = desktop_entry.install(prefix).entry
    entry.write_text(entry.read_text(encoding="utf-8") + "X-Mine=true\n", encoding="utf-8")
    with pytest.raises(DesktopInstallError, match="--force"):
        desktop_entry.install(prefix)
    assert "X-Mine=true" in entry.read_text(encoding="utf-8")


@pytest.mark.parametrize("recorded", ["rewritten-since", "old-manifest-line", "not-a-cache-name"])
def test_uninstall_keeps_caches_it_did_not_write(tmp_path, recorded):
    prefix = tmp_path / "share"
    desktop_entry.install(prefix)
    apps = prefix / "applications"
    cache = apps / ("mimeinfo.cache" if recorded != "not-a-cache-name" else "notes.cache")
    ours = b"[MIME Cache]\n"
    theirs = b"[MIME Cache]\ntext/x-other=other.desktop;\n"
    # Another app installed its entry and ran update-desktop-database after ours; uninstalling
    # may refresh the cache (where the tool is installed), which must keep describing their entry.
    (apps / "other.desktop").write_text("[Desktop Entry]\nType=Application\nName=Other\nExec=other\n"
                                        "MimeType=text/x-other;\n", encoding="utf-8")
    cache.write_bytes(theirs)
    line = {"rewritten-since": f"cache {hashlib.sha256(ours).hexdigest()} {cache}",
            "old-manifest-line": f"cache {cache}",
            "not-a-cache-name": f"cache {hashlib.sha256(theirs).hexdigest()} {cache}"}[recorded]
    manifest = desktop_entry.manifest_path(prefix)
    manifest.write_text(manifest.read_text(encoding="utf-8") + line + "\n", encoding="utf-8")
    desktop_entry.uninstall(prefix)
    assert cache.read_bytes() == theirs
    assert not (apps / f"{APP_ID}.desktop").exists()


def test_a_cache_still_as_the_install_made_it_is_removed(tmp_path):
    prefix = tmp_path / "share"
    desktop_entry.install(prefix)
    cache = prefix / "applications" / "mimeinfo.cache"
    cache.write_bytes(b"[MIME Cache]\n")
    manifest = desktop_entry.manifest_path(prefix)
    manifest.write_text(manifest.read_text(encoding="utf-8")
                        + f"cache {hashlib.sha256(cache.read_bytes()).hexdigest()} {cache}\n", encoding="utf-8")
    desktop_entry.uninstall(prefix)
    assert not prefix.exists()


def test_a_launcher_or_folder_that_is_not_utf8_is_one_line(tmp_path):
    launcher = os.fsdecode(b"/opt/sp\xffecula/specula")
    with pytest.raises(DesktopInstallError, match="not valid UTF-8") as exc:
        desktop_entry.install(tmp_path / "share", command=[launcher])
    assert "\n" not in str(exc.value) and not (tmp_path / "share").exists()
    bad_prefix = os.fsencode(tmp_path) + b"/sh\xffare"
    done = subprocess.run([sys.executable, "-m", "app", "install-desktop", "--prefix", bad_prefix], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and done.stderr.count("\n") == 1 and "not valid UTF-8" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and not os.path.exists(bad_prefix)


@pytest.mark.parametrize("how", ["outside", "through-a-link"])
def test_uninstall_removes_no_folder_outside_the_prefix(tmp_path, how):
    """A manifest `dir` line naming an (empty) folder outside the prefix, directly or through a
    linked folder inside it, leaves that folder alone, as `file` lines already were."""
    prefix = tmp_path / "share"
    desktop_entry.install(prefix)
    outside = tmp_path / "outside"
    (outside / "empty").mkdir(parents=True)
    if how == "outside":
        line = f"dir {outside / 'empty'}"
    else:
        (prefix / "applications" / "link").symlink_to(outside)
        line = f"dir {prefix / 'applications' / 'link' / 'empty'}"
    manifest = desktop_entry.manifest_path(prefix)
    manifest.write_text(manifest.read_text(encoding="utf-8") + line + "\n", encoding="utf-8")
    desktop_entry.uninstall(prefix)
    assert (outside / "empty").is_dir()
