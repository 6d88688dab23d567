"""The freedesktop menu entry and icons (`specula install-desktop`), without Qt.

Installing writes `applications/io.github.specula.Specula.desktop` and the icons under
`icons/hicolor/` of a data folder (default `$XDG_DATA_HOME`, i.e. ~/.local/share), then a manifest,
`specula/installed-files.txt`, listing every file and folder it created (files with their sha256).
Uninstalling removes exactly those: files still as written, then the folders it created if they
are empty, so the folder is left as it was found. A desktop-tool cache (`mimeinfo.cache`,
`icon-theme.cache`) goes only when the install created it and nobody rewrote it since (its
sha256 is recorded too); otherwise it is refreshed in place. Installing never overwrites an
entry or icon of ours by name that it did not write (`force` to replace it). Every file is
written under a temporary name and renamed, and a failed install removes what it had written:
never a half-written entry.

The application's name, desktop-file id and icon folder live here too (the window sets them), so
the entry's `Icon` and `StartupWMClass` always match what the running app announces.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import app
from app.common.atomic import write_atomic
from app.engine.errors import SpeculaError

log = logging.getLogger(__name__)

APP_NAME = app.APP_NAME  # QApplication's name: Qt's X11 WM_CLASS class part, hence StartupWMClass
APP_ID = "io.github.specula.Specula"  # the desktop file's name, QGuiApplication.desktopFileName, the icon name
ICON_SIZES = (16, 32, 48, 64, 128, 256, 512)
MANIFEST = Path("specula") / "installed-files.txt"
CATEGORIES = "Science;ArtificialIntelligence;"  # one main category: listed once in menus
KEYWORDS = "LLM;GGUF;AI;chat;language model;speculative decoding;llama;"

# The Exec key's reserved characters (Desktop Entry spec, "The Exec key"): an argument holding
# any of them must be double-quoted, and inside the quotes these four need a backslash.
_EXEC_RESERVED = set(" \t\n\"'\\><~|&;$*?#()`")
_EXEC_QUOTED_ESCAPES = set('"`$\\')


_DIGEST = re.compile(r"[0-9a-f]{64}")
_CACHE_FILES = {"mimeinfo.cache": Path("applications"), "icon-theme.cache": Path("icons") / "hicolor"}


class DesktopInstallError(SpeculaError):
    """The entry or the icons cannot be installed or removed (one line, with the path)."""


# --- what gets installed ------------------------------------------------------------------------

def resources_dir() -> Path:
    """`resources/` next to the `app` package: the source tree (editable install) and the
    PyInstaller bundle (where the spec puts it beside `app`) both have it there."""
    return Path(app.__file__).resolve().parent.parent / "resources"


def icon_theme_dir() -> Path:
    """The hicolor theme folder the icons ship in (the same layout they are installed with)."""
    return resources_dir() / "icons" / "hicolor"


def icon_png(size: int) -> Path:
    return icon_theme_dir() / f"{size}x{size}" / "apps" / f"{APP_ID}.png"


def icon_svg() -> Path:
    return icon_theme_dir() / "scalable" / "apps" / f"{APP_ID}.svg"


def icon_sources() -> dict[str, Path]:
    """Path inside `hicolor/` -> the shipped icon file: one PNG per size, plus the SVG."""
    theme = icon_theme_dir()
    return {path.relative_to(theme).as_posix(): path for path in [*map(icon_png, ICON_SIZES), icon_svg()]}


def default_prefix() -> Path:
    """$XDG_DATA_HOME, else ~/.local/share: where a user's menu entries live."""
    return Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")


def launcher_command() -> list[str]:
    """The absolute command that starts the window: the bundle's own executable, else the
    `specula` console script beside this Python (a venv's bin/), else `python -m app`."""
    if getattr(sys, "frozen", False):
        return [os.path.abspath(sys.executable)]
    bin_dir = Path(os.path.abspath(sys.executable)).parent
    for name in ("specula", "specula.exe"):
        script = bin_dir / name
        if script.is_file() and os.access(script, os.X_OK):
            return [str(script)]
    return [os.path.abspath(sys.executable), "-m", "app"]


def _string_value(text: str) -> str:
    """A desktop-file string value: backslash escapes (the spec's \\\\, \\n, \\t, \\r)."""
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace("\t", "\\t").replace("\r", "\\r")


def exec_argument(arg: str) -> str:
    """One argument of the Exec key: quoted when it holds a reserved character, `%` doubled (a
    literal percent, not a field code), then string-escaped: a literal backslash in a quoted
    argument ends up as four, as the spec says."""
    if "\n" in arg or "\r" in arg:
        raise DesktopInstallError(f"cannot put a path with a line break in a desktop entry: {arg!r}")
    if arg and not any(c in _EXEC_RESERVED for c in arg):
        quoted = arg
    else:
        quoted = '"' + "".join("\\" + c if c in _EXEC_QUOTED_ESCAPES else c for c in arg) + '"'
    return _string_value(quoted.replace("%", "%%"))


def desktop_entry_text(command: list[str]) -> str:
    """The .desktop file for launching `command` (absolute argv)."""
    for arg in command:  # desktop files are UTF-8; a path that is not cannot be written in one
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError:
            raise DesktopInstallError(
                f"cannot put a path that is not valid UTF-8 in a desktop entry: "
                f"{os.fsencode(arg).decode('utf-8', 'backslashreplace')}") from None
    lines = [
        "[Desktop Entry]",
        "Type=Application",
        "Version=1.4",
        f"Name={APP_NAME}",
        "GenericName=Local language models",
        "Comment=Run local GGUF language models with speculative decoding",
        "Exec=" + " ".join(exec_argument(a) for a in command),
        f"TryExec={_string_value(command[0])}",  # menus hide the entry if the launcher is gone
        *_working_dir(command),
        f"Icon={APP_ID}",
        "Terminal=false",
        f"Categories={CATEGORIES}",
        f"Keywords={KEYWORDS}",
        "StartupNotify=true",
        f"StartupWMClass={APP_NAME}",
    ]
    return "\n".join(lines) + "\n"


def _working_dir(command: list[str]) -> list[str]:
    """`python -m app` finds the package from the folder holding it when Specula is not
    pip-installed into that Python (a source checkout): run it there."""
    if command[1:] == ["-m", "app"]:
        return [f"Path={_string_value(str(Path(app.__file__).resolve().parent.parent))}"]
    return []


# --- the manifest -------------------------------------------------------------------------------

@dataclass
class Manifest:
    """What one install created: folders (top-down), files with their sha256, and caches that
    the desktop tools generated where there were none, with their sha256 then (absolute paths;
    a cache recorded without one, by an older version, is never removed)."""

    dirs: list[Path] = field(default_factory=list)
    files: dict[Path, str] = field(default_factory=dict)
    caches: dict[Path, str | None] = field(default_factory=dict)

    def text(self) -> str:
        out = ["# Written by `specula install-desktop`; `specula install-desktop --uninstall` removes these."]
        out += [f"dir {d}" for d in self.dirs]
        out += [f"file {digest} {path}" for path, digest in self.files.items()]
        out += [f"cache {digest} {c}" for c, digest in self.caches.items()]
        return "\n".join(out) + "\n"

    @classmethod
    def parse(cls, text: str, where: Path) -> "Manifest":
        manifest = cls()
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip() or line.startswith("#"):
                continue
            kind, _, rest = line.partition(" ")
            if kind == "dir":
                manifest.dirs.append(Path(rest))
            elif kind == "cache":
                digest, _, path = rest.partition(" ")
                if _DIGEST.fullmatch(digest) and path:
                    manifest.caches[Path(path)] = digest
                else:
                    manifest.caches[Path(rest)] = None
            elif kind == "file" and _DIGEST.fullmatch(rest.partition(" ")[0]) and rest.partition(" ")[2]:
                digest, _, path = rest.partition(" ")
                manifest.files[Path(path)] = digest
            else:
                raise DesktopInstallError(f"{where}: line {number} is not a manifest entry: {line[:60]!r}")
        return manifest


def manifest_path(prefix: Path) -> Path:
    return prefix / MANIFEST


# --- install / uninstall ------------------------------------------------------------------------

@dataclass(frozen=True)
class InstallResult:
    entry: Path
    command: list[str]
    files: list[Path]


def install(prefix: Path | None = None, command: list[str] | None = None, force: bool = False) -> InstallResult:
    """Write the entry, the icons and the manifest under `prefix` (replacing an earlier install
    there). DesktopInstallError with one line when something is missing or not writable, or
    when a file of that name is there that Specula did not write (unless `force`)."""
    prefix = Path(os.path.abspath(prefix or default_prefix()))
    command = command or launcher_command()
    sources = icon_sources()
    missing = [str(p) for p in sources.values() if not p.is_file()]
    if missing:
        raise DesktopInstallError(f"icon not found: {missing[0]} (run packaging/render_icons.py)")
    _check_utf8_path(prefix)

    entry = prefix / "applications" / f"{APP_ID}.desktop"
    payload: dict[Path, bytes] = {entry: desktop_entry_text(command).encode("utf-8")}
    for name, source in sources.items():
        payload[prefix / "icons" / "hicolor" / name] = source.read_bytes()
    if not force:
        _refuse_foreign(payload, _read_manifest(prefix))
    if manifest_path(prefix).exists():
        uninstall(prefix)

    manifest = Manifest()
    try:
        for target, data in payload.items():
            _make_dirs(target.parent, manifest)
            _write_atomic(target, data)
            manifest.files[target] = hashlib.sha256(data).hexdigest()
        manifest.caches = _refresh_caches(prefix)
        _make_dirs(manifest_path(prefix).parent, manifest)
        _write_atomic(manifest_path(prefix), manifest.text().encode("utf-8"))
    except OSError as exc:
        _remove(manifest, prefix)
        raise DesktopInstallError(f"cannot install under {prefix}: {_os_reason(exc)}") from exc
    return InstallResult(entry, command, list(payload))


def _check_utf8_path(prefix: Path) -> None:
    try:
        str(prefix).encode("utf-8")
    except UnicodeEncodeError:
        raise DesktopInstallError(f"cannot install under a folder whose name is not valid UTF-8: "
                                  f"{os.fsencode(prefix).decode('utf-8', 'backslashreplace')}") from None


def _read_manifest(prefix: Path) -> Manifest | None:
    where = manifest_path(prefix)
    if not where.is_file():
        return None
    try:
        return Manifest.parse(where.read_text(encoding="utf-8"), where)
    except (OSError, UnicodeDecodeError) as exc:
        raise DesktopInstallError(f"cannot read {where}: {exc}") from exc


def _refuse_foreign(payload: dict[Path, bytes], earlier: Manifest | None) -> None:
    """A file where ours would go that an earlier install of ours did not write as it is now
    (another packaging of Specula, the user's own edit) is not ours to replace."""
    for target in payload:
        if not (target.exists() or target.is_symlink()):
            continue
        digest = earlier.files.get(target) if earlier else None
        if target.is_symlink() or not target.is_file() or digest is None or _sha256(target) != digest:
            raise DesktopInstallError(f"{target} exists and was not written by `specula install-desktop`; "
                                      f"not replacing it (use --force to replace it)")


def uninstall(prefix: Path | None = None) -> list[Path]:
    """Remove what the install under `prefix` wrote; the removed files ([] if none was there)."""
    prefix = Path(os.path.abspath(prefix or default_prefix()))
    manifest = _read_manifest(prefix)
    if manifest is None:
        return []
    manifest.files[manifest_path(prefix)] = ""  # the manifest goes too (in a folder the install created)
    return _remove(manifest, prefix)


def _remove(manifest: Manifest, prefix: Path) -> list[Path]:
    removed = []
    for path, digest in manifest.files.items():
        if not _inside(path, prefix):
            log.warning("not removing %s: outside %s", path, prefix)
            continue
        if path.is_symlink() or not path.is_file():
            continue
        if digest and _sha256(path) != digest:
            log.warning("keeping %s: it was changed after it was installed", path)
            continue
        path.unlink()
        removed.append(path)
    for cache, digest in manifest.caches.items():
        # Ours only while nobody rewrote it: another app's refresh makes it describe their files.
        expected = _CACHE_FILES.get(cache.name)
        if (digest is not None and expected is not None and Path(os.path.abspath(cache)) == prefix / expected / cache.name
                and cache.is_file() and not cache.is_symlink() and _sha256(cache) == digest):
            cache.unlink()
    _refresh_caches(prefix, only_existing=True)
    for folder in reversed(manifest.dirs):
        if not _inside(folder, prefix):  # a hand-edited manifest line is not ours to act on
            log.warning("not removing %s: outside %s", folder, prefix)
            continue
        try:
            folder.rmdir()  # only when empty: anything the user put there stays
        except OSError:
            pass
    return removed


def _refresh_caches(prefix: Path, only_existing: bool = False) -> dict[Path, str]:
    """Run update-desktop-database and gtk-update-icon-cache where they exist (failures are
    ignored: the entry works without them). The cache files they created where there were
    none, with their sha256, so that uninstalling can remove them if they are still as made.
    `only_existing`: refresh existing caches only."""
    jobs = [
        ("update-desktop-database", prefix / "applications", "mimeinfo.cache", ["-q"]),
        ("gtk-update-icon-cache", prefix / "icons" / "hicolor", "icon-theme.cache", ["-q"]),
    ]
    created = {}
    for tool, folder, cache_name, flags in jobs:
        program = shutil.which(tool)
        cache = folder / cache_name
        existed = cache.exists()
        if program is None or not folder.is_dir() or (only_existing and not existed):
            continue
        try:
            subprocess.run([program, *flags, str(folder)], capture_output=True, timeout=60, check=False)
        except (OSError, subprocess.SubprocessError) as exc:
            log.info("%s failed: %s", tool, exc)
        if not existed and cache.is_file():
            created[cache] = _sha256(cache)
    return created


def _make_dirs(folder: Path, manifest: Manifest) -> None:
    """mkdir -p, recording each folder it creates (top-down) so uninstall can remove it."""
    missing = []
    while not folder.exists():
        missing.append(folder)
        folder = folder.parent
    for path in reversed(missing):
        path.mkdir()
        manifest.dirs.append(path)


def _write_atomic(target: Path, data: bytes) -> None:
    # Menu entries and icons are read by the desktop, as any installed package's are: 0644.
    write_atomic(target, data, mode=0o644)


def _inside(path: Path, prefix: Path) -> bool:
    """Whether path lies under prefix once links are followed: a folder on the way that links
    elsewhere (`<prefix>/x -> /outside`) must not let a manifest line reach outside. The last
    part is not followed, so a link inside the prefix is itself still inside."""
    path = Path(os.path.abspath(path))
    real_parent = Path(os.path.realpath(path.parent))
    return (real_parent / path.name).is_relative_to(os.path.realpath(prefix))


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _os_reason(exc: OSError) -> str:
    return f"{exc.filename}: {exc.strerror}" if exc.filename and exc.strerror else str(exc)
