"""The speculative counters of a server's Prometheus /metrics, read with prometheus_client's own
text parser, and their change over one reply.

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

from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from app.engine.errors import ServerError

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
    counters as {sample name: {position: value}}."""
    wanted = {name for family in _FAMILIES for name in family[1:] if name}
    per_pos_names = {family[4] for family in _FAMILIES if family[4]}
    totals: dict = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name not in wanted:
                    continue
                value = _checked(sample.name, sample.value)
                if sample.name in per_pos_names:
                    position = _position(sample.name, sample.labels.get("position"))
                    slots = totals.setdefault(sample.name, {})
                    slots[position] = slots.get(position, 0.0) + value
                else:
                    totals[sample.name] = totals.get(sample.name, 0.0) + value
    except (ValueError, TypeError, KeyError, IndexError) as exc:
        raise ServerError(f"/metrics is not Prometheus's text format ({str(exc)[:120]})") from None
    return totals


def _checked(name: str, value: float) -> float:
    if not 0 <= value < _MAX_COUNT:  # also NaN
        raise ServerError(f"/metrics: {name} is not a count: {value!r}")
    return value


def _position(name: str, label: str | None) -> int:
    if label is None or not label.isdigit() or int(label) >= _MAX_POSITIONS:
        raise ServerError(f"/metrics: {name} has a position that is not a small number: {str(label)[:20]!r}")
    return int(label)


def _positions(by_position: dict[int, float]) -> tuple[float, ...]:
    return tuple(by_position.get(i, 0.0) for i in range(max(by_position) + 1)) if by_position else ()


def _count(value: float) -> int:
    return int(round(value))
