"""Write a file whole or not at all, through a staging file no one else can have planted.

A fixed staging name beside the target (`<out>.part`) follows a link planted there and lets two
writers clobber each other; `tempfile.mkstemp` in the target's folder creates a new file with
O_EXCL (never following a link) and mode 0600, and the rename then replaces the target itself,
never a file a link points to. No dependencies, so the CLI, the hub, the window and the
desktop installer all share it.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

PRIVATE = 0o600


def write_atomic(target: str | os.PathLike[str], data: bytes, mode: int = PRIVATE) -> Path:
    """Write data to target (replacing it) via a fresh temporary file in the same folder.

    The file ends with `mode` whatever the umask (0600 by default: what Specula writes about a
    user's chats and runs is theirs alone). Raises OSError; nothing is left behind on failure."""
    target = Path(target)
    handle, name = tempfile.mkstemp(prefix=f".{target.name[:40]}.", suffix=".tmp", dir=target.parent)
    staging = Path(name)
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
            if mode != PRIVATE:
                os.chmod(staging, mode)
        os.replace(staging, target)
    except BaseException:
        staging.unlink(missing_ok=True)
        raise
    return target
