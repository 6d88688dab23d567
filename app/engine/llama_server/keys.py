"""API keys of servers at a URL, kept as the Hugging Face token is: in a file of their own that
only the user can read (0600, written whole through app.common.atomic), never in the settings
file, never logged, never shown back in clear.

One JSON object, URL -> key, in the folder the caller names (the window: its data folder)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from app.common.atomic import PRIVATE, read_capped, write_atomic

log = logging.getLogger(__name__)

KEYS_FILE = "server-keys.json"
MAX_KEYS_FILE_BYTES = 1 << 20  # keys for a few thousand servers; a larger file is not ours


def keys_path(folder: str | Path) -> Path:
    return Path(folder) / KEYS_FILE


def check_key(key: str) -> str:
    """The key, trimmed; ValueError (one line) for one that no header can carry."""
    key = key.strip()
    if not key or any(c.isspace() or not c.isprintable() for c in key):
        raise ValueError("an API key is one word of printable characters")
    return key


def _read_all(path: Path) -> dict[str, str]:
    try:
        data = json.loads(read_capped(path, MAX_KEYS_FILE_BYTES, what="a keys file").decode("utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, RecursionError) as exc:  # a FIFO, a device, too large, not UTF-8 or JSON
        log.warning("the server keys file %s cannot be read (%s); no key is sent", path, type(exc).__name__)
        return {}
    if not isinstance(data, dict):
        return {}
    return {k: v for k, v in data.items() if isinstance(k, str) and isinstance(v, str)}


def read_key(path: str | Path, url: str) -> str | None:
    """The key stored for `url`, or None."""
    return _read_all(Path(path)).get(url.rstrip("/"))


def save_key(path: str | Path, url: str, key: str) -> None:
    """Store `key` for `url` (replacing any), the file owner-only (raises OSError, ValueError)."""
    path = Path(path)
    keys = _read_all(path)
    keys[url.rstrip("/")] = check_key(key)
    write_atomic(path, json.dumps(keys).encode("utf-8"), mode=PRIVATE)
    log.info("an API key for %s was stored in %s", url, path)


