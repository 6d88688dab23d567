"""Why a drafter pays here or not, in words a coder reads without knowing the papers: what a
drafted token and a verify of k tokens cost against one main-model token (the schedule's own
prices), the acceptance at which a draft of k breaks even, and the acceptance seen.

A step with k drafts each accepted with probability a (given the ones before it were) yields
E(k, a) = 1 + a + ... + a^k tokens for cost(k) plain steps: drafting pays where E / cost > 1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

PAY_LENGTHS = tuple(range(1, 17))


@dataclass(frozen=True)
class BreakEven:
    draft_token: float  # a drafted token's cost against one main-model step (0: free, n-gram)
    verify_4: float  # a verify of 4 drafts against one main-model step
    length: int  # the draft length with the lowest break-even acceptance (0: none pays)
    acceptance: float | None  # that acceptance; None where no length pays even at 100%
    seen: float | None  # the acceptance of the drafts verified so far (None: none yet)

    def sentence(self) -> str:
        prices = (f"a drafted token costs {self.draft_token:.2f}x a main-model token here and a verify of "
                  f"4 drafts {self.verify_4:.1f}x" if self.draft_token else
                  f"drafts are free (n-gram) and a verify of 4 drafts costs {self.verify_4:.1f}x a main-model token")
        seen = f"; you are at {self.seen:.0%}" if self.seen is not None else "; nothing drafted yet"
        if self.acceptance is None:
            return f"{prices}: no draft can pay on this machine, even with every token accepted{seen}"
        verdict = ""
        if self.seen is not None:
            verdict = ": drafting pays" if self.seen > self.acceptance else ": below it, plain decoding is faster"
        return (f"{prices}: a draft pays here above {self.acceptance:.0%} acceptance at length "
                f"{self.length}{seen}{verdict}")


    def short(self) -> str:
        """A table cell: 'pays above 62% at k=3 (at 80%)', 'no draft pays here'."""
        if self.acceptance is None:
            return "no draft pays here"
        seen = f" (at {self.seen:.0%})" if self.seen is not None else ""
        return f"pays above {self.acceptance:.0%} at k={self.length}{seen}"


def expected_tokens(acceptance: float, k: int) -> float:
    return sum(acceptance ** j for j in range(k + 1))


def break_even_acceptance(cost_k: float, k: int) -> float | None:
    """The acceptance a at which E(k, a) equals cost_k (plain steps); None above k + 1."""
    if cost_k >= k + 1:
        return None
    if cost_k <= 1.0:
        return 0.0
    low, high = 0.0, 1.0
    for _ in range(40):
        middle = (low + high) / 2
        low, high = (middle, high) if expected_tokens(middle, k) < cost_k else (low, middle)
    return high


def break_even(relative_cost: Callable[[int], float], draft_token: float, seen: float | None,
               lengths: tuple[int, ...] = PAY_LENGTHS) -> BreakEven:
    """`relative_cost(k)`: a step of k drafts (drafting included) against one of none. The
    length named is the best one at the acceptance seen (where drafting pays), else the one
    that needs the least acceptance to pay."""
    best_k, best = 0, None
    for k in lengths:
        needed = break_even_acceptance(relative_cost(k), k)
        if needed is not None and (best is None or needed < best - 1e-9):
            best_k, best = k, needed
    if seen is not None and best is not None and seen > best:
        best_k = max(lengths, key=lambda k: expected_tokens(seen, k) / relative_cost(k))
        best = break_even_acceptance(relative_cost(best_k), best_k)
    verify_4 = relative_cost(4) - 4 * draft_token
    return BreakEven(draft_token, verify_4, best_k, best, seen)


@dataclass(frozen=True)
class Prices:
    """What a reply's adaptive schedule knew at its end: the cost of a step of k drafts against
    one of none (k = 0 .. len - 1, drafting included) and of one drafted token; the acceptance
    seen. Plain numbers, so a summary carries them to the window, Compare and JSON."""

    step_costs: tuple[float, ...]
    draft_token: float
    seen: float | None

    def break_even(self, seen: float | None = None) -> BreakEven:
        """At the acceptance seen in the reply, or at `seen` (the window's, as a reply streams)."""
        lengths = tuple(range(1, len(self.step_costs)))
        return break_even(lambda k: self.step_costs[k], self.draft_token, self.seen if seen is None else seen,
                          lengths)

    def speedup(self, acceptance: float, k: int) -> float:
        """Tokens per plain step's time with drafts of k at this acceptance (1.0: plain's rate)."""
        return expected_tokens(acceptance, k) / self.step_costs[k]


def schedule_prices(schedule) -> Prices | None:
    """A reply's adaptive schedule's prices (a SplitSchedule: its draft model's), or None where
    the schedule prices nothing (a fixed length, plain decoding)."""
    schedule = getattr(schedule, "model", schedule)
    cost = getattr(schedule, "relative_cost", None)
    if cost is None:
        return None
    costs = (1.0, *(round(cost(k), 4) for k in PAY_LENGTHS))
    return Prices(costs, round(schedule.draft_token_relative(), 4), schedule.seen_acceptance)


def explain_schedule(schedule) -> str | None:
    """The sentence for a reply's adaptive schedule, or None where it prices nothing."""
    prices = schedule_prices(schedule)
    return prices.break_even().sentence() if prices is not None else None
