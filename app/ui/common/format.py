"""Short human-readable strings for the window: the stats line under a reply, relative times,
byte sizes.

Plain Python (no Qt, no torch) so they are trivially testable and reusable.
"""

from __future__ import annotations

import html
import math
import time
from typing import Any, Mapping

# Byte sizes read the same in the window as in the CLI and the hub's messages: one definition, the
# GGUF reader's, which the window's files take from here with the rest of their text formats.
from app.engine.gguf.format import format_bytes  # re-exported for the window


# How a reply ended, when it was not the model's own choice (eos or a stop string).
_ENDINGS = {"cancelled": "stopped", "length": "token limit", "context": "context full"}


def _number(summary: Mapping[str, Any], key: str) -> float | None:
    """summary[key] as a finite number, or None (stats saved by an older version may lack keys)."""
    value = summary.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _seconds(value: float) -> str:
    return f"{value:.2f} s" if value < 10 else f"{value:.1f} s"


def _decode_tps(summary: Mapping[str, Any]) -> float | None:
    tps = _number(summary, "decode_tps")
    if tps is not None:
        return tps
    n, seconds = _number(summary, "n_predicted"), _number(summary, "decode_s")
    return (n - 1) / seconds if n is not None and n > 1 and seconds else None


PLAIN_DRAFTERS = ("none", "llama-server none")  # RunSummary.drafter where plain decoding was chosen


def stats_line(summary: Mapping[str, Any]) -> str:
    """'42.1 tok/s · first token in 0.31 s · drafted 120 / accepted 84 (70%) · 3.2 accepted per step'
    (plain words: TTFT and mean accepted length are llama.cpp's names for the two).

    `summary` is RunSummary.to_dict() (or the same numbers as saved in the history); missing
    numbers are left out rather than shown as zeros.
    """
    parts = []
    tps = _decode_tps(summary)
    if tps is not None:
        parts.append(f"{tps:.1f} tok/s")
    ttft = _number(summary, "ttft_s")
    if ttft is not None:
        parts.append(f"first token in {_seconds(ttft)}")
    drafted, accepted = _number(summary, "n_drafted"), _number(summary, "n_accepted")
    if drafted and accepted is not None:
        parts.append(f"drafted {drafted:.0f} / accepted {accepted:.0f} ({accepted / drafted:.0%})")
        mean = _number(summary, "mean_accepted_length")
        if mean is not None:
            parts.append(f"{mean:.1f} accepted per step")
    elif drafted == 0 and summary.get("drafter") not in PLAIN_DRAFTERS:  # plain chosen: nothing to say
        parts.append("no drafts")
    ending = _ENDINGS.get(str(summary.get("stop_reason", "")))
    if ending:
        parts.append(ending)
    return " · ".join(parts)


def relative_time(timestamp: float, now: float | None = None) -> str:
    """'just now', '5 min ago', '3 h ago', 'yesterday', 'Tue', '12 Mar', '12 Mar 2024'."""
    now = time.time() if now is None else now
    then, today = local_time(timestamp), local_time(now)
    if then is None or today is None:
        return ""  # a time no calendar can show (a damaged history row): nothing, not a crash
    age = now - timestamp
    if age < 60:
        return "just now"
    if age < 3600:
        return f"{int(age // 60)} min ago"
    days = (_day_number(today) - _day_number(then))
    if days == 0:
        return f"{int(age // 3600)} h ago"
    if days == 1:
        return "yesterday"
    if days < 7:
        return time.strftime("%a", then)
    if then.tm_year == today.tm_year:
        return f"{then.tm_mday} {time.strftime('%b', then)}"
    return f"{then.tm_mday} {time.strftime('%b %Y', then)}"


def local_time(timestamp: float) -> time.struct_time | None:
    """time.localtime, or None for a value it cannot convert (NaN, 1e308, a negative time on
    some platforms): such values come from files, and a window must not abort on one."""
    try:
        return time.localtime(timestamp)
    except (OverflowError, ValueError, OSError, TypeError):
        return None


def date_time_text(timestamp: float) -> str:
    """'2024-03-12 14:05', or 'unknown' for a time that cannot be shown."""
    moment = local_time(timestamp)
    return "unknown" if moment is None else time.strftime("%Y-%m-%d %H:%M", moment)


def _day_number(moment: time.struct_time) -> int:
    """Calendar days since the epoch in local time (for 'yesterday' across midnight)."""
    return int(time.mktime((moment.tm_year, moment.tm_mon, moment.tm_mday, 12, 0, 0, 0, 0, -1)) // 86400)


def html_text(text: str) -> str:
    """Plain text for a Qt rich-text label: <, > and & escaped. Quotes are left alone, because Qt's
    rich text does not decode html.escape's &#x27; and would show it literally."""
    return html.escape(text, quote=False)
