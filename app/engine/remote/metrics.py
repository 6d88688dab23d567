"""The speculative counters of a server's Prometheus /metrics, read by a small parser of the text
format's sample lines (linear in the text: prometheus_client's own took time quadratic in a
line's labels, 77 s for one line of 400,000), and their change over one reply. The parse is
bounded: at most MAX_LABELS labels a line, MAX_LINES lines and PARSE_S seconds; past any of
them the text is refused (one ServerError), and the reply's counts are unknown.

Counters known (a server exports one set; where several engines or models share a server their
series are summed; the names are the exporters' own):
- vLLM (vllm/v1/spec_decode/metrics.py, labels model_name, engine; per position also position):
  vllm:spec_decode_num_drafts_total, _num_draft_tokens_total, _num_accepted_tokens_total,
  vllm:spec_decode_num_accepted_tokens_per_pos_total{position="i"}.
- llama-server with --metrics (tools/server/server-task.cpp, the same names after vLLM's):
  llamacpp:spec_decode_num_drafts_total, ..., llamacpp:spec_decode_num_accepted_tokens_per_pos_total.
  It prints values with six significant digits, so past a million a difference is not exact:
  then the counts are unknown rather than wrong.
- Specula's own server (app/server/stats.py): specula:draft_tokens_total,
  specula:draft_tokens_accepted_total (no step count, no positions).
SGLang exports its acceptance only as gauges (an average accept length), which a difference
cannot turn into one reply's counts: there the counts are unknown."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Iterator

from app.engine.errors import ServerError, quoted

# (prefix, drafts, drafted tokens, accepted tokens, accepted per position) of each exporter
_FAMILIES = (
    ("vllm", "vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total",
     "vllm:spec_decode_num_accepted_tokens_total", "vllm:spec_decode_num_accepted_tokens_per_pos_total"),
    ("llamacpp", "llamacpp:spec_decode_num_drafts_total", "llamacpp:spec_decode_num_draft_tokens_total",
     "llamacpp:spec_decode_num_accepted_tokens_total", "llamacpp:spec_decode_num_accepted_tokens_per_pos_total"),
    ("specula", None, "specula:draft_tokens_total", "specula:draft_tokens_accepted_total", None),
)
_EXACT_BELOW = {"llamacpp": 1e6}  # llama-server's std::stringstream keeps 6 significant digits
_MAX_POSITIONS = 1024
_MAX_COUNT = float(1 << 53)
MAX_LABELS = 64  # vLLM's spec_decode series have 3; a line of thousands is no exporter's
MAX_LINES = 200_000  # a real /metrics has a few thousand (vLLM's histograms for every engine)
MAX_LINE_CHARS = 64 * 1024  # a sample line is a name, a few labels and a number
PARSE_S = 2.0
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
# One label: name="value" and its comma, the value's escapes (\\, \", \n) matched without backtracking.
_LABEL = re.compile(r'[ \t]*([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"([^"\\\n]*(?:\\.[^"\\\n]*)*)"[ \t]*(,?)')
_CLOSE = re.compile(r"[ \t]*\}")


@dataclass(frozen=True)
class SpecCounters:
    """A server's speculative counters at one moment (or their change over a reply). `drafts`
    (verify steps that drafted) is None where the exporter has no such counter."""

    exporter: str
    drafts: int | None
    draft_tokens: int
    accepted: int
    accepted_per_pos: tuple[int, ...] = ()

    def since(self, before: "SpecCounters") -> "SpecCounters | None":
        """The change from `before` to this; None where it cannot be known (another exporter, a
        counter that went down: the server restarted)."""
        if before.exporter != self.exporter:
            return None
        drafts = None if self.drafts is None or before.drafts is None else self.drafts - before.drafts
        per_pos = tuple(now - (before.accepted_per_pos[i] if i < len(before.accepted_per_pos) else 0)
                        for i, now in enumerate(self.accepted_per_pos))
        changes = (self.draft_tokens - before.draft_tokens, self.accepted - before.accepted, *per_pos,
                   *(() if drafts is None else (drafts,)))
        if any(c < 0 for c in changes) or len(before.accepted_per_pos) > len(self.accepted_per_pos):
            return None
        while per_pos and per_pos[-1] == 0:
            per_pos = per_pos[:-1]
        return SpecCounters(self.exporter, drafts, changes[0], changes[1], per_pos)


def parse_spec_counters(text: str) -> SpecCounters | None:
    """The first exporter's counters found in a /metrics text; None where it has none (or its
    values are past what it prints exactly). ServerError for text that is not Prometheus's format."""
    totals = _sample_totals(text)
    for exporter, drafts, drafted, accepted, per_pos in _FAMILIES:
        if drafted not in totals or accepted not in totals:
            continue
        values = [totals[drafted], totals[accepted]] + ([totals[drafts]] if drafts in totals else [])
        positions = _positions(totals.get(per_pos, {})) if per_pos else ()
        if max(values + list(positions)) >= _EXACT_BELOW.get(exporter, _MAX_COUNT):
            return None
        return SpecCounters(exporter, _count(totals[drafts]) if drafts in totals else None,
                            _count(totals[drafted]), _count(totals[accepted]), tuple(_count(v) for v in positions))
    return None


def _sample_totals(text: str) -> dict:
    """{sample name: value summed over its series} for the counters above; per-position
    counters as {sample name: {position: value}}. Every line is checked, the others' too: a text
    that is not Prometheus's format is no exporter's."""
    wanted = {name for family in _FAMILIES for name in family[1:] if name}
    per_pos_names = {family[4] for family in _FAMILIES if family[4]}
    totals: dict = {}
    deadline = time.monotonic() + PARSE_S
    for n, line in enumerate(_lines(text)):
        if n >= MAX_LINES or time.monotonic() > deadline:
            raise ServerError(f"/metrics is too long to read (more than {MAX_LINES} lines or {PARSE_S:g} s)")
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if len(line) > MAX_LINE_CHARS:  # bounds one line's parse, which the deadline cannot cut
            raise ServerError(f"/metrics has a line longer than {MAX_LINE_CHARS} characters")
        name, labels, value = _sample(line)
        if name not in wanted:
            continue
        value = _checked(name, value)
        if name in per_pos_names:
            position = _position(name, labels.get("position"))
            slots = totals.setdefault(name, {})
            slots[position] = slots.get(position, 0.0) + value
        else:
            totals[name] = totals.get(name, 0.0) + value
    return totals


def _lines(text: str) -> Iterator[str]:
    """The text's lines, one at a time (a list of them all may be millions of strings)."""
    start = 0
    while start < len(text):
        end = text.find("\n", start)
        end = len(text) if end < 0 else end
        yield text[start:end]
        start = end + 1


def _sample(line: str) -> tuple[str, dict[str, str], float]:
    """(name, labels, value) of a sample line: `name{label="value",...} value [timestamp]`."""
    match = _NAME.match(line)
    if match is None:
        raise _not_prometheus(f"a line that is not a sample: {quoted(line, 40)}")
    name, pos, labels = match.group(), match.end(), {}
    if line.startswith("{", pos):
        labels, pos = _labels(line, pos + 1, name)
    fields = line[pos:].split()
    if line[pos:pos + 1] not in (" ", "\t") or not 1 <= len(fields) <= 2:
        raise _not_prometheus(f"{quoted(name, 80)} has no value, or more than a value and a time")
    try:
        value = float(fields[0])
        if len(fields) == 2:
            float(fields[1])  # its timestamp
    except ValueError:
        raise _not_prometheus(f"{quoted(name, 80)} has a value that is not a number: {quoted(fields[0], 40)}") from None
    return name, labels, value


def _labels(line: str, pos: int, name: str) -> tuple[dict[str, str], int]:
    """The labels from `pos` (just past the brace) and where the line goes on past the closing
    brace; more than MAX_LABELS is refused after reading MAX_LABELS + 1 of them."""
    labels: dict[str, str] = {}
    n_read = 0  # not len(labels): a name repeated is a label read too
    while (label := _LABEL.match(line, pos)) is not None:
        n_read += 1
        if n_read > MAX_LABELS:
            raise ServerError(f"/metrics: {quoted(name, 80)} has more than {MAX_LABELS} labels")
        labels[label.group(1)] = label.group(2)
        pos = label.end()
        if not label.group(3):
            break
    close = _CLOSE.match(line, pos)
    if close is None:
        raise _not_prometheus(f"{quoted(name, 80)} has labels that do not parse")
    return labels, close.end()


def _not_prometheus(why: str) -> ServerError:
    return ServerError(f"/metrics is not Prometheus's text format ({why})")


def _checked(name: str, value: float) -> float:
    if not 0 <= value < _MAX_COUNT:  # also NaN
        raise ServerError(f"/metrics: {name} is not a count: {quoted(repr(value), 40)}")
    return value


def _position(name: str, label: str | None) -> int:
    if label is None or not label.isdigit() or int(label) >= _MAX_POSITIONS:
        raise ServerError(f"/metrics: {name} has a position that is not a small number: {quoted(str(label), 20)}")
    return int(label)


def _positions(by_position: dict[int, float]) -> tuple[float, ...]:
    return tuple(by_position.get(i, 0.0) for i in range(max(by_position) + 1)) if by_position else ()


def _count(value: float) -> int:
    return int(round(value))
