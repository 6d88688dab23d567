"""Where downloads go and whether they fit there.

The Hugging Face cache folder is huggingface_hub's own (HF_HUB_CACHE, else HF_HOME/hub), read from
its constants at call time so that every tool on the machine shares one cache.

Free space comes from shutil.disk_usage. Tests cannot make a small real filesystem without root,
so SPECULA_FAKE_FREE_BYTES (a byte count) stands in for the free space when it is set; nothing
else reads it.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from huggingface_hub import constants

from app.engine.gguf.format import format_bytes
from app.hub.errors import DiskFullError

FAKE_FREE_ENV = "SPECULA_FAKE_FREE_BYTES"


def hub_cache_dir() -> Path:
    return Path(constants.HF_HUB_CACHE)


def free_bytes(path: Path) -> int:
    """Free bytes on the filesystem that holds `path` (or its nearest existing parent)."""
    fake = os.environ.get(FAKE_FREE_ENV)
    if fake:
        return int(fake)
    probe = Path(path).absolute()
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return shutil.disk_usage(probe).free


def check_free_space(needed: int, folder: Path, what: str) -> None:
    """DiskFullError before anything is written when `needed` bytes do not fit in `folder`."""
    free = free_bytes(folder)
    if needed > free:
        raise DiskFullError(f"not enough disk space for {what}: needs {format_bytes(needed)}, "
                            f"{format_bytes(free)} free in {folder}")


def size_or_zero(path: Path) -> int:
    """A file's size in bytes; 0 where it is missing or cannot be read (a partial download not
    started, a blob removed meanwhile)."""
    try:
        return path.stat().st_size
    except OSError:
        return 0
