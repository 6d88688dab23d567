"""Replay a recorded greedy reply under a cost curve: what a draft-length schedule would earn on a
machine we do not have (a GPU, many cores), with the acceptance a real pair showed.

A greedy draft depends only on its context, so one pass over a reply records, at each position,
how many tokens the draft would get right (`matches[i]`: the draft's greedy continuation from
the reply's first i tokens agrees with the main model's next `matches[i]` tokens). Replaying a
schedule then needs no model: a step at position i that drafts k keeps min(k, matches[i]) and
the main model's token after them, for the price the cost curve gives. The schedule is the one
the loop runs (AdaptiveDraftLength, fed the same update() a real step gives it), so what the
replay shows is what the loop would choose where a verify is cheap.

A combination drafts free n-gram tokens where an n-gram drafter has a match (`free[i]`: its
draft's length and how many of it agree) and the draft model elsewhere, each source with its
own schedule, as CombinedDrafter proposes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

from app.engine.loop.schedule import AdaptiveDraftLength, DraftSchedule, FixedDraftLength, SplitSchedule

UNIT_S = 0.01  # seconds of one plain step in a replay: any unit works, the schedule reads ratios


@dataclass(frozen=True)
class CostCurve:
    """What a step costs against one plain step: `verify(n)` for a main-model step feeding n
    tokens (verify(1) == 1), `draft_token` for each token a draft model drafts (0: free, n-gram)."""

    name: str
    verify: Callable[[int], float]
    draft_token: float

    def step(self, k: int, draft_token: float | None = None) -> float:
        """A step that drafted k tokens and verified them."""
        per_draft = self.draft_token if draft_token is None else draft_token
        return self.verify(k + 1) + k * per_draft


def linear_curve(name: str, verify_of_8: float, draft_token: float) -> CostCurve:
    """A memory-bound machine's curve: a verify of 8 tokens costs `verify_of_8` plain steps,
    growing linearly in between and beyond (a GPU, or a main model many times its draft)."""
    slope = (verify_of_8 - 1.0) / 7
    return CostCurve(name, lambda n: 1.0 + slope * (n - 1), draft_token)


def measured_curve(name: str, points: dict[int, float], draft_token: float) -> CostCurve:
    """A curve measured at some lengths (`specula calibrate`: {1: 1.0, 2: 1.79, ...}), linear
    between them and beyond the last two."""
    xs = sorted(points)

    def verify(n: int) -> float:
        for lo, hi in zip(xs, xs[1:]):
            if n <= hi:
                return points[lo] + (points[hi] - points[lo]) * (n - lo) / (hi - lo)
        lo, hi = xs[-2], xs[-1]
        return points[hi] + (points[hi] - points[lo]) * (n - hi) / (hi - lo)

    return CostCurve(name, verify, draft_token)


@dataclass
class ReplayResult:
    tokens: int = 0
    cost: float = 0.0  # in plain steps
    steps: int = 0
    drafted: int = 0
    accepted: int = 0
    lengths: list[int] = field(default_factory=list)

    @property
    def speedup(self) -> float:
        """Tokens per plain step: plain decoding's speed is 1."""
        return self.tokens / self.cost if self.cost else 0.0

    def add(self, k: int, kept: int, cost: float) -> None:
        self.tokens += kept + 1
        self.cost += cost
        self.steps += 1
        self.drafted += k
        self.accepted += kept
        self.lengths.append(k)


def adaptive(curve: CostCurve, draft_max: int, draft_token: float | None = None) -> AdaptiveDraftLength:
    """The schedule the loop builds for a drafter of this price on this curve."""
    per_draft = curve.draft_token if draft_token is None else draft_token
    return AdaptiveDraftLength(draft_max, lambda n: UNIT_S * curve.verify(n), UNIT_S * per_draft if per_draft else None)


def replay(matches: Sequence[int], curve: CostCurve, schedule: DraftSchedule) -> ReplayResult:
    """The reply replayed step by step with a draft model's drafts (`matches`), `schedule` choosing."""
    result, i = ReplayResult(), 0
    while i < len(matches):
        k = schedule.length(len(matches) - i - 1)
        kept = min(k, matches[i])
        _step(result, schedule, curve, k, kept, curve.draft_token)
        i += kept + 1
    return result


def replay_combined(matches: Sequence[int], free: Sequence[Sequence], curve: CostCurve,
                    model_schedule: AdaptiveDraftLength, free_schedule: AdaptiveDraftLength) -> ReplayResult:
    """Free n-gram drafts and the draft model's, chosen step by step as the loop's SplitSchedule
    chooses: `free[i]` is the n-gram draft's length, how many of it agree, and whether the
    drafter saw a copy running (absent: it could not tell)."""
    result, i, step = ReplayResult(), 0, {}
    split = SplitSchedule(free_schedule, model_schedule, lambda: bool(free[i][0]),
                          lambda chosen: step.update(free=chosen))
    while i < len(matches):
        seen = free[i][2] if len(free[i]) > 2 else None
        k = split.length(len(matches) - i - 1, lambda: seen)
        offered, agreeing = free[i][0], free[i][1]
        if step["free"]:
            k = min(k, offered)
            kept, draft_token = min(k, agreeing), 0.0
        else:
            kept, draft_token = min(k, matches[i]), curve.draft_token
        _step(result, split, curve, k, kept, draft_token)
        i += kept + 1
    return result


def best_fixed(matches: Sequence[int], curve: CostCurve, draft_max: int) -> tuple[int, ReplayResult]:
    """The fixed draft length (0 to draft_max) that replays fastest, found by trying each."""
    results = [(k, replay(matches, curve, FixedDraftLength(k))) for k in range(draft_max + 1)]
    return max(results, key=lambda kr: kr[1].speedup)


def _step(result: ReplayResult, schedule: DraftSchedule, curve: CostCurve, k: int, kept: int,
          draft_token: float) -> None:
    cost = curve.step(k, draft_token)
    schedule.update(k, kept, UNIT_S * cost, n_asked=k, draft_s=UNIT_S * k * draft_token)
    result.add(k, kept, cost)
