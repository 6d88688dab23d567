"""`specula bench`'s verdict: per prompt, our fastest row beside llama-server's fastest, for the
first request and for the same request again, by each program's own decode rate (tokens after the
first over the time after the first: llama-server's `timings.predicted_per_second`).

With several rounds each row's decode rate is also taken against our plain decoding's in the same
round (its decode speedup, the median of the rounds' ratios), and the cell's ratio is ours over
theirs of those: the machine's speed drifts between rounds (a 32-token reply is a third of a
second), and medians of rates timed in different rounds put llama-server's ngram-mod at 1.16x our
plain decoding on SmolLM2's chat where, round by round, it ran at 0.99x."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol, Sequence

AGAIN = " (again)"
SERVER = "server "
_PEERS = ("hf ", "llama.cpp", SERVER)


class Row(Protocol):
    prompt: str
    config: str
    decode_tps: float | None
    tokens_per_s: float
    decode_speedup: float | None  # decode_tps over our plain decoding's in the same round (median)
    identical: bool  # the reply equals our plain decoding's


_OTHER_TEXT = "*"  # marks a cell's row whose reply parts from plain decoding: another text was timed


@dataclass(frozen=True)
class Verdict:
    prompt: str
    phase: str  # "first" or "again"
    ours: str
    ours_tps: float
    theirs: str
    theirs_tps: float
    ours_same: bool = True  # the row's reply equals plain decoding's
    theirs_same: bool = True
    ours_speedup: float | None = None  # each one's decode speedup over plain decoding, round by round
    theirs_speedup: float | None = None

    @property
    def ratio(self) -> float:
        if self.ours_speedup and self.theirs_speedup:
            return self.ours_speedup / self.theirs_speedup
        return self.ours_tps / self.theirs_tps if self.theirs_tps > 0 else math.inf


def _rate(row: Row) -> float:
    return row.decode_tps or row.tokens_per_s


def _best(rows: Sequence[Row]) -> Row:
    """The fastest row: by its speedup over the same round's plain decoding where every row has
    one, else by its rate."""
    if all(row.decode_speedup for row in rows):
        return max(rows, key=lambda row: row.decode_speedup)
    return max(rows, key=_rate)


def _phase_rows(rows: Sequence[Row], phase: str) -> tuple[list[Row], list[Row]]:
    """(ours, llama-server's) rows that answer `phase`. A row without an "again" twin answers
    both: it learns nothing, so the same request again is the same run (prompt lookup, none)."""
    configs = {row.config for row in rows}
    ours, theirs = [], []
    for row in rows:
        again = row.config.endswith(AGAIN)
        twin = row.config + AGAIN in configs
        answers = again if phase == "again" else not again
        if phase == "again" and not again and not twin:
            answers = True
        if not answers:
            continue
        if row.config.startswith(SERVER):
            theirs.append(row)
        elif not row.config.startswith(_PEERS):
            ours.append(row)
    return ours, theirs


def verdicts(rows: Sequence[Row]) -> list[Verdict]:
    out = []
    for prompt in dict.fromkeys(row.prompt for row in rows):
        mine = [row for row in rows if row.prompt == prompt]
        for phase in ("first", "again"):
            ours, theirs = _phase_rows(mine, phase)
            if not ours or not theirs:
                continue
            best_ours, best_theirs = _best(ours), _best(theirs)
            out.append(Verdict(prompt, phase, best_ours.config, _rate(best_ours),
                               best_theirs.config[len(SERVER):], _rate(best_theirs),
                               best_ours.identical, best_theirs.identical,
                               best_ours.decode_speedup, best_theirs.decode_speedup))
    return out


def format_verdict(found: Sequence[Verdict]) -> str:
    header = (f"{'prompt':<14} {'request':<7} {'ours best':<30} {'tok/s':>7}  {'llama-server best':<30} "
              f"{'tok/s':>7} {'ours/theirs':>11}")
    lines = ["decode tokens/s, ours best against llama-server's best (its own timings); ours/theirs is the ratio "
             "of their speedups over our plain decoding in the same round:", header, "-" * len(header)]
    for v in found:
        ours, theirs = _marked(v.ours, v.ours_same), _marked(v.theirs, v.theirs_same)
        lines.append(f"{v.prompt:<14} {v.phase:<7} {ours:<30} {v.ours_tps:>7.1f}  {theirs:<30} "
                     f"{v.theirs_tps:>7.1f} {v.ratio:>10.2f}x")
    ratios = [v.ratio for v in found if math.isfinite(v.ratio) and v.ratio > 0]
    if ratios:
        geo = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
        worst = min(found, key=lambda v: v.ratio)
        lines.append(f"geometric mean {geo:.2f}x over {len(ratios)} cells; worst {worst.ratio:.2f}x "
                     f"({worst.prompt}, {worst.phase} request)")
    if any(not (v.ours_same and v.theirs_same) for v in found):
        # llama-server's own plain decoding parts from ours at near-ties on Gemma's replies (its
        # rows' batches round them otherwise): such a cell times two different replies.
        lines.append(f"{_OTHER_TEXT}: that reply parts from plain decoding (the table above says where: "
                     "tie@N at a near-tie), so the cell times a different text")
    return "\n".join(lines)


def _marked(name: str, same: bool) -> str:
    return name[:30] if same else name[:29] + _OTHER_TEXT
