"""Every field the hub answers, checked before Specula uses or shows it: counts that are not
counts (`"downloads": "NaN"`), names a download would refuse (`../../x.gguf`, `/abs/path.gguf`),
and text holding terminal escapes (`ESC]0;...BEL`, `ESC[2J`), which would retitle a terminal or
clear it when printed, are each made harmless here, in one place, for the CLI and the window."""

from __future__ import annotations

import math
import unicodedata
from datetime import datetime
from typing import Any


def shown(value: Any) -> str:
    """`value` as text safe to print or show: control and format characters (C0, C1, DEL, bidi
    overrides) escaped as \\xNN / \\uNNNN, the rest as it is."""
    text = value if isinstance(value, str) else str(value)
    return "".join(c if unicodedata.category(c)[0] != "C" or c == " " else _escape(c) for c in text)


def _escape(c: str) -> str:
    code = ord(c)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def count(value: Any) -> int:
    """A count from the hub: a non-negative integer, or 0 for anything else (NaN, text, a bool)."""
    if isinstance(value, bool):
        return 0
    if isinstance(value, int):
        return max(value, 0)
    if isinstance(value, float) and math.isfinite(value) and value >= 0:
        return min(int(value), 1 << 62)
    return 0


def optional_int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return int(value) if value >= 0 else None


def optional_text(value: Any, limit: int = 200) -> str | None:
    return value[:limit] if isinstance(value, str) else None


def when(value: Any) -> datetime | None:
    return value if isinstance(value, datetime) else None


def texts(value: Any, limit: int = 200) -> tuple[str, ...]:
    return tuple(v[:limit] for v in value if isinstance(v, str)) if isinstance(value, (list, tuple)) else ()


def downloadable_name(name: Any) -> bool:
    """A repository file name a download would write (relative, no '..', no backslash, no
    control characters): what `hub files` and the window may list."""
    if not isinstance(name, str) or not name or len(name) > 1024:
        return False
    if name.startswith(("/", "~")) or "\\" in name or (len(name) > 1 and name[1] == ":"):
        return False
    if any(unicodedata.category(c)[0] == "C" for c in name):
        return False
    return all(part not in ("", ".", "..") for part in name.split("/"))
