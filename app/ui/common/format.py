"""Short human-readable strings for the window: the stats line under a reply, relative times,
byte sizes, model names shortened to a width.

Plain Python (no Qt, no torch) so they are trivially testable and reusable.
"""

from __future__ import annotations

import html
import math
import re
import time
from typing import Any, Callable, Iterable, Mapping

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


# --- model names shortened to a width ---------------------------------------------------------

ELLIPSIS = "\u2026"
_TAIL = re.compile(r"^(?P<core>.*?)(?P<tail>\s\([^()]*\))?$")  # "name (Q4_K_M)": the quantization
_SEPARATOR = re.compile(r"([-_ ])")
_SIZE_WORD = re.compile(r"^(?:\d+x)?\d+(?:\.\d+)?[BMK]$", re.IGNORECASE)  # "1.5B", "135M", "8x7B"


def short_model_name(title: str, fits: Callable[[str], bool], others: Iterable[str] = (),
                     cut_words: bool = True) -> str:
    """`title` (a model's name as the library gives it, "org/Name-1.5B-Instruct-GGUF (Q4_K_M)")
    shortened until fits(text) says it fits, keeping what tells it apart from `others` (the names
    shown beside it) and its quantization: first the organisation goes (unless another name differs
    only there), then "-GGUF" and a repeat of the quantization, then the words it shares with the
    most similar of `others`, from the right; the parameter count stays. A middle cut
    ("qwen2.5-...ruct-q4_k_m-GGUF") made two sizes of one model read the same. Where even that
    does not fit, the quantization goes and the rest is cut at the end; with cut_words False the
    shortest whole-word form is returned instead (for a caller that cuts the text around it)."""
    others = [o for o in others if o != title]
    core, tail = _split_tail(title)
    org, name = core.rsplit("/", 1) if "/" in core else ("", core)
    names_apart = {_plain_name(*_split_tail(o)) for o in others}
    plain = _plain_name(core, tail)
    if org and (plain in names_apart or (name, tail) in {_split_name_only(o) for o in others}):
        name, plain = core, f"{org}/{plain}"  # another org's model of the same name: the org tells them apart
    for candidate in (title, name + tail, plain + tail):
        if fits(candidate):
            return candidate
    return _drop_shared_words(plain, tail, fits, [_plain_name(*_split_tail(o)) for o in others], cut_words)


def _split_tail(title: str) -> tuple[str, str]:
    match = _TAIL.match(title)
    return match["core"], match["tail"] or ""


def _split_name_only(title: str) -> tuple[str, str]:
    core, tail = _split_tail(title)
    return core.rsplit("/", 1)[-1], tail


def _plain_name(core: str, tail: str) -> str:
    """The name without its organisation, "-GGUF" and the quantization the tail repeats."""
    name = core.rsplit("/", 1)[-1]
    name = re.sub(r"[-_ ]gguf$", "", name, flags=re.IGNORECASE)
    quant = tail.strip(" ()")
    if quant and name.lower().endswith(quant.lower()) and len(name) > len(quant) + 1:
        name = name[: -len(quant) - 1]
    return name


def _words(name: str) -> list[str]:
    return [w.lower() for w in _SEPARATOR.split(name)[::2] if w]


def _drop_shared_words(name: str, tail: str, fits: Callable[[str], bool], others: list[str],
                       cut_words: bool) -> str:
    """Words the nearest other names share go first (right to left), then the quantization,
    then characters."""
    parts = _SEPARATOR.split(name)  # words at even places, separators between
    words = _words(name)
    shared_with = [set(_words(o)) for o in others]
    overlap = max((len(set(words) & s) for s in shared_with), default=0)
    nearest = [s for s in shared_with if overlap and len(set(words) & s) == overlap]
    dropped: set[int] = set()
    for index in range(len(parts) - 1, -1, -2):
        word = parts[index].lower()
        # Kept: the size, and what differs from the nearest names (with none near, the family name).
        apart = not all(word in s for s in nearest) if nearest else index == 0
        if not word or _SIZE_WORD.match(word) or apart:
            continue
        dropped.add(index)
        text = _joined(parts, dropped) + tail
        if fits(text):
            return text
    kept = _joined(parts, dropped)
    if not cut_words:
        return kept + tail
    # Then the quantization, then characters from the right.
    for text in (kept + tail, kept, *(kept[:n].rstrip(" -_") + ELLIPSIS for n in range(len(kept) - 1, 0, -1))):
        if fits(text):
            return text
    return ELLIPSIS


def _joined(parts: list[str], dropped: set[int]) -> str:
    """The words with each run of dropped ones, and the separators around it, as one …."""
    out: list[str] = []
    for index in range(0, len(parts), 2):
        if index in dropped:
            if not out or out[-1] != ELLIPSIS:
                out.append(ELLIPSIS)
        else:
            if index > 0 and (not out or out[-1] != ELLIPSIS):
                out.append(parts[index - 1])
            out.append(parts[index])
    return "".join(out)
