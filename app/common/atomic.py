"""Write a file whole or not at all, through a staging file no one else can have planted; and
make the folders and files that hold a user's chats, caches and runs private to them.

A fixed staging name beside the target (`<out>.part`) follows a link planted there and lets two
writers clobber each other; `tempfile.mkstemp` in the target's folder creates a new file with
O_EXCL (never following a link) and mode 0600, and the rename then replaces the target itself,
never a file a link points to. No dependencies, so the CLI, the hub, the window and the
desktop installer all share it.

And read a small file a user names (a key file, a cache) without trusting what it is: a FIFO
must not hang the open, a device such as /dev/zero must not be read for ever, nor a 1 GB file
read whole.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

PRIVATE = 0o600
PRIVATE_DIR = 0o700


def write_atomic(target: str | os.PathLike[str], data: bytes, mode: int = PRIVATE, fsync: bool = False) -> Path:
    """Write data to target (replacing it) via a fresh temporary file in the same folder.

    The file ends with `mode` whatever the umask (0600 by default: what Specula writes about a
    user's chats and runs is theirs alone). fsync: on disk before the rename (a file a crash
    must not leave empty). Raises OSError; nothing is left behind on failure."""
    target = Path(target)
    handle, name = tempfile.mkstemp(prefix=f".{target.name[:40]}.", suffix=".tmp", dir=target.parent)
    staging = Path(name)
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
            if fsync:
                out.flush()
                os.fsync(out.fileno())
            if mode != PRIVATE:
                os.chmod(staging, mode)
        os.replace(staging, target)
    except BaseException:
        staging.unlink(missing_ok=True)
        raise
    return target


def read_capped(path: str | os.PathLike[str], cap: int, first: int | None = None, what: str = "the file") -> bytes:
    """The file's bytes (its `first` bytes only, where given): ValueError for what is not a
    regular file (opened O_NONBLOCK: a FIFO does not block) or is larger than `cap`; OSError
    where it cannot be opened (missing, a folder on some systems, no permission)."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
    fd = os.open(path, flags)
    with os.fdopen(fd, "rb", buffering=0) as handle:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ValueError("not a regular file")
        if first is not None:
            return handle.read(first)
        if info.st_size > cap:
            raise ValueError(f"{info.st_size} bytes, more than {what} can be ({cap})")
        data = handle.read(cap + 1)  # the file may have grown since fstat
    if len(data) > cap:
        raise ValueError(f"more than {cap} bytes, more than {what} can be")
    return data


def read_json_object(path: str | os.PathLike[str]) -> dict:
    """A JSON object cached in a file; {} where the file is missing, unreadable, damaged or
    holds something else (a cache miss, never an error)."""
    import json

    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError, RecursionError):
        return {}
    return data if isinstance(data, dict) else {}


def write_json_object(path: str | os.PathLike[str], data: dict) -> None:
    """Replace the file with this JSON object, in a private folder (raises OSError)."""
    import json

    private_dir(Path(path).parent)
    write_atomic(path, json.dumps(data).encode())


def private_dir(folder: str | os.PathLike[str], tighten: bool = False) -> Path:
    """Create folder, and any missing parent, as 0700 whatever the umask (chats and what was
    learned from them are private data, as a browser profile is). tighten: the folder is
    Specula's own, so one an earlier version made 0755 loses its group and other bits too;
    never for a folder the user named. Raises OSError."""
    folder = Path(folder)
    missing = []
    parent = folder
    while not parent.is_dir() and parent != parent.parent:
        missing.append(parent)
        parent = parent.parent
    for path in reversed(missing):
        path.mkdir(mode=PRIVATE_DIR, exist_ok=True)
        _restrict(path)
    if tighten:
        _restrict(folder)
    return folder


def private_file(path: str | os.PathLike[str]) -> None:
    """Create path empty as 0600 if it is missing, else take its group and other bits away (if
    it is ours): a file that SQLite then opens, whose -wal and -shm files take its mode."""
    fd = os.open(path, os.O_RDONLY | os.O_CREAT, PRIVATE)
    try:
        if os.name == "posix":
            st = os.fstat(fd)
            if st.st_uid == os.getuid() and st.st_mode & 0o077:
                os.fchmod(fd, st.st_mode & 0o700)
    finally:
        os.close(fd)


def _restrict(path: Path) -> None:
    """Take the group and other bits off a folder or file this user owns (POSIX only)."""
    if os.name != "posix":
        return
    st = path.stat()
    if st.st_uid == os.getuid() and st.st_mode & 0o077:
        os.chmod(path, st.st_mode & 0o700)
