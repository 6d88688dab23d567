"""How many tokens to draft at each step.

Drafting k tokens pays when the tokens they are expected to add outweigh what feeding k more
tokens to the main model's verify costs. Both sides are measured while generating:

- acceptance: per draft position, the probability that it is accepted given that the earlier ones
  were, from decayed counts (acceptance is bursty: inside a copied passage the next token is far
  likelier to be accepted than the first);
- cost: where the backend measured a step curve (llama.cpp: steps of 1 to 65 tokens on this
  machine, app.engine.backends.llamacpp.cost), that curve scaled by how much dearer this reply's
  verifies are than it says, plus the drafting time the steps show or a draft model's own
  measured step; without one (torch) a line a + b * k fitted to the steps.

A step with k drafts yields E(k) = 1 + sum over j <= k of the product of the first j rates for a
cost c(k); the schedule picks the k <= draft_max maximising E(k) / c(k) over the whole curve
(Leviathan et al. 2023, section 3.4, with the cost measured: llama.cpp's curve is not convex, it
switches kernels by batch size), and never a k whose E(k) / c(k) is below a plain step's.

Where drafting does not pay it drafts nothing, and probes with one token now and then (at most
_PROBE_BUDGET of the time, backing off after rejected probes) so that a copy-heavy stretch is
noticed. A drafter that can tell at no cost whether a copy is running (Drafter.confident: prompt
lookup) is asked once a step: one that sees a copy drafts at once, the length its running copy's
acceptance (_COPY_RATE, then what such drafts earned) makes pay; one that sees none has a first-
position rate of its own (_unsure_rate) and drafts at most one position past the evidence. After a
step whose drafts were all accepted, positions up to _GROWTH times as far count as good as the
last accepted one, so a long copied passage drafts long. The length never changes what is
generated, only how fast.
"""

from __future__ import annotations

import functools
import math
from typing import Callable, Protocol

# The drafter's word on a draft now (Drafter.confident): True likely accepted, False not, None it cannot tell.
Confidence = Callable[[], bool | None] | None

_DECAY = 0.9  # weight of the previous cost estimate per step: about the last 10 steps count
_TRIAL_DECAY = 0.85  # weight of the previous acceptance counts per drafting step
_MIN_EVIDENCE = 0.5  # decayed visits below which a draft position has no rate of its own
_PROBE_EVERY = 4  # fewest steps between one-token probes while drafting does not pay
_PROBE_BUDGET = 0.02  # share of the time probes may cost
_PROBE_MAX_INTERVAL = 256  # steps: rejected probes back off up to this
_PRIOR_ALPHA = (0.45, 0.05)  # pseudo-counts (accepted, rejected), never decayed: start hopeful (0.9), stay off 0 and 1
# A draft model's prior: the same hope, worth three tokens of evidence, since its acceptance is
# steady where n-gram copies come in bursts (docs/performance.md, "The schedule's rules").
_MODEL_PRIOR = (2.7, 0.3)
_GROWTH = 4  # after a step with every draft accepted, draft at least this many times as many
_COPY_RATE = 0.9  # P(accepted) per position assumed where the drafter sees a copy running (the prior's hope)
_PRIOR_SLOPE = 0.08  # extra cost per drafted token, relative to a step without drafts, until measured
_SEEN_FACTOR = (0.8, 2.0)  # bounds of the measured curve's correction by the steps' own times
_UNSURE_PRIOR = 0.6  # the most P(accepted) hoped for where the drafter sees no copy, until seen
_WEAK_RATE = 0.5  # a position's own rate below which a run accepted whole does not outweigh it


class DraftSchedule(Protocol):
    def length(self, budget: int, confident: Confidence = None, catch_up: Callable[[], float] | None = None) -> int:
        """Most tokens to draft at this step (at most `budget`). `confident`, asked once a step
        at most, says whether the drafter sees a likely draft (Drafter.confident); `catch_up`, asked
        before a probe, the seconds it needs to read what it skipped (Drafter.catch_up_s)."""

    def update(self, n_drafted: int, n_accepted: int, step_s: float, n_asked: int | None = None,
               draft_s: float | None = None) -> None:
        """What the last step drafted and kept, how long drafting plus verifying took, how many
        drafts were asked for (None: as many as were drafted) and how long drafting took."""

    def declined_note(self) -> str | None:
        """One line saying why the reply drafted little, or None."""


class FixedDraftLength:
    """Always draft up to `draft_max` (llama.cpp's behaviour)."""

    def __init__(self, draft_max: int) -> None:
        self.draft_max = draft_max

    def length(self, budget: int, confident: Confidence = None, catch_up: Callable[[], float] | None = None) -> int:
        return min(self.draft_max, budget)

    def update(self, n_drafted: int, n_accepted: int, step_s: float, n_asked: int | None = None,
               draft_s: float | None = None) -> None:
        pass

    def declined_note(self) -> str | None:
        return None  # a fixed length declines nothing


class AdaptiveDraftLength:
    """Draft the length with the best expected tokens per second, from measured acceptance and cost."""

    def __init__(self, draft_max: int, verify_cost: Callable[[int], float] | None = None,
                 draft_token_s: float | None = None, prior: tuple[float, float] | None = None) -> None:
        """verify_cost(n): seconds of a main-model step feeding n tokens, as measured for the
        plan (CostCurve.cost), the prior for the cost of drafting until the steps show it.
        draft_token_s: seconds per drafted token of a draft model, from its own measured step
        (Drafter.token_cost_s); with verify_cost it prices drafting from the first step on.
        prior: pseudo-counts (accepted, rejected) of each position's rate; by default a draft
        model's (_MODEL_PRIOR) where draft_token_s prices one, else n-gram drafting's."""
        self.draft_max = draft_max
        self._prior = prior or (_MODEL_PRIOR if draft_token_s is not None else _PRIOR_ALPHA)
        self._verify_cost = verify_cost
        one = verify_cost(1) if verify_cost is not None else 0.0
        self._curve_table = [verify_cost(k + 1) / one for k in range(draft_max + 1)] if one > 0 else []
        self._draft_token_s = draft_token_s
        self._failed_probes = 0
        # Per draft position i: decayed counts of "reached" (every earlier draft accepted) and
        # "accepted". Acceptance is bursty - once a copied passage starts, the next tokens are
        # far more likely to be accepted than the first - so each position has its own rate.
        self.reached = [0.0] * draft_max
        self.accepted = [0.0] * draft_max
        self._fit = _DecayedLine()
        self._draft_fit = _DecayedLine()  # seconds of drafting against drafts asked for
        self._plain_s = _DecayedMean()  # a step without drafts, as seen in the verify times
        self._plain_step_s = _DecayedMean()  # a step that verified no drafts, as timed
        self._curve_factor = _DecayedMean()  # a verify's time against the curve's, per step
        self._idle_steps = 0
        self._all_accepted = 0  # drafts of the last step when all were accepted, else 0
        self.n_steps = self.n_drafting_steps = self.n_steps_drafted = self.n_empty_asks = 0
        self._seen_drafted = self._seen_accepted = 0
        self._drafted_cost = 0.0  # the drafting steps' price, relative to plain steps, as chosen
        # Decayed (accepted, reached) of the first draft position in steps where the drafter saw
        # no copy running, and whether the step now verified was one: its own rate (_unsure_rate).
        self._unsure = [0.0, 0.0]
        self._step_unsure = False
        # How the last length was chosen ("rates", "copy" or "probe") and the per-position
        # acceptance rates it was chosen on: what a test checks the arithmetic of.
        self.last_choice: tuple[str, list[float]] = ("rates", [])
        self._cost_memo: dict[int, float] = {}
        self._rates_memo: list[float] | None = None
        self._copy = [0.0, 0.0]  # decayed (accepted, reached) positions of drafts on a copy's hope

    def rates(self) -> list[float]:
        """P(draft position i is accepted | all earlier ones were), with a weak, hopeful prior
        (half a token: 0.9 accepted) so that a reply starts with long drafts, as llama.cpp's fixed
        length does, and evidence shortens them. A position seldom reached borrows the rate of the
        one before it: after a run of full acceptances the next position is most likely as good."""
        if self._rates_memo is None:  # kept until the next update: a step reads them up to 3 times
            a, r = self._prior
            rates: list[float] = []
            for acc, reach in zip(self.accepted, self.reached):
                if reach < _MIN_EVIDENCE and rates:
                    rates.append(rates[-1])
                else:
                    rates.append((acc + a) / (reach + a + r))
            self._rates_memo = rates
        return list(self._rates_memo)

    def draft_token_relative(self) -> float:
        """A drafted token's price against a plain step, as the schedule prices it."""
        return self._drafting_relative(1)

    @property
    def seen_acceptance(self) -> float | None:
        """Accepted over drafted tokens in this reply so far (None: nothing drafted yet)."""
        return self._seen_accepted / self._seen_drafted if self._seen_drafted else None

    def best_gain(self, budget: int) -> float:
        """Tokens a step is expected to yield per plain step's time at the best length within
        `budget`, on the rates and prices seen (1.0: plain decoding's)."""
        rates, best, expected, run = self.rates(), 1.0, 1.0, 1.0
        for k in range(1, min(self.draft_max, budget) + 1):
            run *= rates[k - 1]
            expected += run
            best = max(best, expected / self.relative_cost(k))
        return best

    @property
    def alpha(self) -> float:
        """Acceptance rate of the first draft position."""
        return self.rates()[0] if self.draft_max else 0.0

    def relative_cost(self, k: int) -> float:
        """A step of k drafts against one of none: the plan's measured curve plus the drafting
        time measured in the steps, where the loader measured a curve; else the line fitted to
        the steps where they show a slope, else a prior. A measured curve is not replaced by the
        line: verify costs may grow in steps (a kernel computing rows in blocks), which a line
        through a few lengths would put wrong at the others. Kept until the next update: a step
        prices up to draft_max lengths several times."""
        cost = self._cost_memo.get(k)
        if cost is None:
            cost = self._cost_memo[k] = self._relative_cost(k)
        return cost

    def _relative_cost(self, k: int) -> float:
        if self._verify_cost is None:
            slope = self._fit.relative_slope(default=None)
            if slope is not None:
                return 1.0 + slope * k
        return self._verify_relative(k) + self._drafting_relative(k)

    def _drafting_relative(self, k: int) -> float:
        """Drafting k tokens against a step of none: a draft model's measured step where it has
        one (measured beside the main model's curve, so one factor corrects both), else the
        drafting time seen in the steps. The seen time mixes in a draft model's reading of what
        it skipped while drafting paused (catch_up), which is priced on its own."""
        if k <= 0:
            return 0.0
        if self._draft_token_s is not None and self._verify_cost is not None:
            return k * self._draft_token_s / self._verify_cost(1) * self.curve_factor()
        plain = self._plain_s.value()
        if plain and self._draft_fit.w:
            return max(self._draft_fit.predict(k), 0.0) / plain
        return 0.0

    def _verify_relative(self, k: int) -> float:
        if self._verify_cost is not None:
            curve = self._curve_relative(k)
            # Never below a plain step: a verify feeds that step's token and more.
            return max(curve * self.curve_factor(), 1.0) if k > 0 else curve
        return 1.0 + _PRIOR_SLOPE * k

    def _curve_relative(self, k: int) -> float:
        """A verify of k drafts against a step of none, as the plan's measured curve has it
        (read once per length: the curve is fixed for the reply)."""
        if k < len(self._curve_table):
            return self._curve_table[k]
        return self._verify_cost(k + 1) / self._verify_cost(1)

    def curve_factor(self) -> float:
        """How much dearer (> 1) or cheaper the steps that verified drafts were than the curve
        says, against the steps without drafts timed in this reply. The curve is measured at load
        on a model of this shape with weights of zero and a short context; the real steps add the
        head's screening of real logits, a longer context, and whatever else the machine is doing
        (a busy machine's verifies ran 1.2x the curve's: docs/performance.md). One factor for
        every length: it moves the choice between drafting and not, not the best length once
        drafting pays."""
        factor = self._curve_factor.value()
        if factor is None or self._verify_cost is None:
            return 1.0
        return min(max(factor, _SEEN_FACTOR[0]), _SEEN_FACTOR[1])

    def _grown_min(self, run: int, k_max: int) -> int:
        """The fewest drafts after a step that had all its `run` drafts accepted: more than
        `run` where some longer draft, accepted whole, costs no more per token than the run's
        step did (no acceptance rates make one pay otherwise: E(k') / E(k) <= (k'+1) / (k+1));
        else `run` again: a verify one row into a new block of the kernel's rows costs that
        block for one token. None (0) where the budget is no longer than the run (the curve
        picks the length within it, filling a block), or where the run's step, accepted whole,
        cost more per token than a plain step (a draft model as dear as the main one)."""
        grown = run + 1
        per_token = self.relative_cost(run) / (run + 1)
        if grown > k_max or per_token >= 1.0:  # or even accepted whole, such drafts lose to plain steps
            return 0
        if any(self.relative_cost(k) / (k + 1) <= per_token for k in range(grown, k_max + 1)):
            return grown
        return run

    def _doubled_min(self, run: int, k_max: int, grown: int) -> int:
        """The length up to twice `run` that costs least per token accepted whole (the last of
        equals), where it costs no more per token than `grown`; else `grown`."""
        best, best_per_token = grown, self.relative_cost(grown) / (grown + 1)
        for k in range(grown + 1, min(2 * run, k_max) + 1):
            per_token = self.relative_cost(k) / (k + 1)
            if per_token <= best_per_token * 1.0001:
                best, best_per_token = k, min(per_token, best_per_token)
        return best

    def _weak_position(self, start: int) -> int:
        """The first position from `start` on where this reply's own recent evidence says
        copies break (rate below _WEAK_RATE); draft_max where none does."""
        rates = self.rates()
        for i in range(start, self.draft_max):
            if self.reached[i] >= _MIN_EVIDENCE and rates[i] < _WEAK_RATE:
                return i
        return self.draft_max

    def _depth_seen(self) -> int:
        """Leading draft positions with evidence of their own (reached recently enough)."""
        depth = 0
        while depth < self.draft_max and self.reached[depth] >= _MIN_EVIDENCE:
            depth += 1
        return depth

    def probe_interval(self) -> int:
        """Steps between one-token probes while drafting does not pay."""
        cost = self.relative_cost(1)
        if not math.isfinite(cost):  # a curve that is no measurement: probe as seldom as allowed
            return _PROBE_MAX_INTERVAL
        cheapest = max(_PROBE_EVERY, math.ceil((cost - 1.0) / _PROBE_BUDGET))
        return min(cheapest << min(self._failed_probes, 8), _PROBE_MAX_INTERVAL)

    def length(self, budget: int, confident: Confidence = None, catch_up: Callable[[], float] | None = None) -> int:
        """As DraftSchedule.length; `catch_up`, asked only before a probe, gives the seconds the
        drafter needs to read what it skipped since it last drafted (Drafter.catch_up_s)."""
        k_max = min(self.draft_max, budget)
        # The drafter is asked once a step at most.
        sees_copy = functools.cache(confident) if confident is not None else lambda: None
        rates, run = self.rates(), self._all_accepted
        self._step_unsure = sees_copy() is False
        if self._step_unsure and rates:
            rates[0] = self._unsure_rate()
        if run and sees_copy() is False:
            # Every draft was accepted, but the drafter sees no copy running (prompt lookup on a
            # match of a token or two): a chance hit, not the start of a run to draft far into.
            run = 0
        k_min = 0
        if run:
            # Acceptance comes in runs: after a step with every draft accepted, the positions up
            # to _GROWTH times as far count as good as the last one accepted (stale rejections
            # there would otherwise hold the length down for many steps of a copied passage), and
            # the next step drafts more where that can pay (_grown_min), as many as the cost
            # curve makes best. From a position where this reply's copies broke recently on, the
            # evidence counts for half beside that hope, and no length is forced past it (a reply
            # that rewords every few words).
            weak = self._weak_position(run)
            for i in range(run, min(_GROWTH * run, len(rates))):
                hope = rates[run - 1] if i < weak else (rates[i] + rates[run - 1]) / 2
                rates[i] = max(rates[i], hope)
            k_forced = min(k_max, weak)  # the longest length a run may force
            k_min = self._grown_min(run, k_forced)
            if k_min and sees_copy():
                # The drafter sees the copy still running (a continuation it saw before, whole): a
                # run accepted whole is evidence for twice as far, where the curve makes that no
                # dearer per token (llama.cpp's ngram-mod drafts its whole chain at once).
                k_min = self._doubled_min(run, k_forced, k_min)
        best = best_length_for(rates, self.relative_cost, k_max, k_min=k_min)
        self.last_choice = ("rates", rates)
        seen = self._depth_seen() + 1
        if best > seen and self._step_unsure:
            # The drafter sees no copy (prompt lookup on a 1-2 token match), and the length would
            # reach past the positions any evidence is about, on rates they borrow from the last
            # one seen (the hopeful prior where nothing is): most likely a chance match. At most
            # one position further than seen (one draft where nothing is).
            best = best_length_for(rates, self.relative_cost, min(k_max, seen))
        if best == 0 and budget > 0 and k_max > 0:
            # A drafter that sees a copy running (prompt lookup, at no cost) earns a draft now:
            # waiting out the back-off of earlier rejected probes would miss the copied passage.
            if sees_copy():
                self._idle_steps = 0
                return self._copy_length(k_max)
            self.last_choice = ("probe", rates)
            self._idle_steps += 1
            if self._idle_steps >= self.probe_interval() and self._probe_affordable(catch_up):
                self._idle_steps = 0
                return 1
        return best

    def _copy_length(self, k_max: int) -> int:
        """Drafts for a drafter that sees a copy running where the rates seen so far made no
        length pay: the best length at the rate a running copy earns (_COPY_RATE per position,
        or better where seen), over the whole measured curve; 0 where no length pays even then
        (a one-token probe loses where two tokens cost twice one and a long draft pays)."""
        copy_rate = self._copy_rate()
        rates = [max(rate, copy_rate) for rate in self.rates()[:k_max]]
        self.last_choice = ("copy", rates)
        return best_length_for(rates, self.relative_cost, k_max)

    def _copy_rate(self) -> float:
        """P(a draft position is accepted) where the drafter sees a copy running and the rates
        made no length pay: _COPY_RATE until such drafts are seen, then what they earned (a
        reply that restates the question and then goes its own way rejects them all)."""
        accepted, reached = self._copy
        weight = sum(self._prior)
        return (accepted + weight * _COPY_RATE) / (reached + weight)

    def _unsure_rate(self) -> float:
        """P(the first draft is accepted) where the drafter sees no copy running. Prompt lookup's
        match of a token or two where a copy has just ended (a word the reply corrected) is
        mostly wrong, where a running copy's next token is mostly right: one rate for both,
        raised by the copies, drafted long after each correction. Without such steps it is the
        rate of all steps."""
        accepted, reached = self._unsure
        weight = sum(self._prior)  # until such steps are seen, the first position's rate of all steps
        # Hope is capped for such steps (_UNSURE_PRIOR); where one token at 60% pays on the
        # curve it is still drafted.
        return (accepted + weight * min(self.alpha, _UNSURE_PRIOR)) / (reached + weight)

    def _probe_affordable(self, catch_up: Callable[[], float] | None) -> bool:
        """Whether a probe now, with what the drafter must first read, keeps probes within
        _PROBE_BUDGET of the steps since the last one. A draft model that skipped the steps since
        it last drafted reads them all before it drafts one token, which on a compute-bound CPU
        costs more than any budget of the time gives."""
        if catch_up is None or self._verify_cost is None:
            return True
        probe = self.relative_cost(1) - 1.0 + catch_up() / self._verify_cost(1)
        return probe <= _PROBE_BUDGET * self._idle_steps

    def update(self, n_drafted: int, n_accepted: int, step_s: float, n_asked: int | None = None,
               draft_s: float | None = None) -> None:
        asked = n_drafted if n_asked is None else n_asked
        verify_s = step_s - (draft_s or 0.0)
        if n_drafted:  # priced before the memo clears: as the step was chosen
            self._drafted_cost += self.relative_cost(n_drafted)
        if n_drafted or asked or self._verify_cost is None:
            # A step that asked for nothing changes neither the rates nor, on a measured curve,
            # the prices (the line fitted without one moves with every step): the memos stand,
            # and a reply where nothing copies prices no lengths again (40 us of a 10 ms step).
            self._cost_memo.clear()
            self._rates_memo = None
        self.n_steps += 1
        self.n_drafting_steps += int(n_drafted > 1)  # a one-token probe is not drafting
        self.n_steps_drafted += int(n_drafted > 0)  # ... but its token was drafted and verified
        self.n_empty_asks += int(asked > 1 and n_drafted == 0)  # asked for a draft, none came
        self._seen_drafted += n_drafted
        self._seen_accepted += n_accepted
        if n_drafted == 0:  # a step of one token, whether or not it asked for drafts
            self._plain_step_s.add(verify_s)
        elif self._verify_cost is not None and self._plain_step_s.w:
            self._curve_factor.add(verify_s / self._plain_step_s.value() / self._curve_relative(n_drafted))
        if draft_s is not None and asked > 0:
            self._draft_fit.add(asked, draft_s)
            self._plain_s.add((step_s - draft_s) / self._verify_relative(n_drafted))
        # A step that asked for drafts paid for drafting even when nothing came back (a draft
        # model unsure of its first token, a text-level draft with no stable cut): it counts as
        # at least one drafted token, so that the plain step's cost stays the line's intercept
        # and costly empty attempts show as slope, not as a dearer step without drafts.
        self._fit.add(max(n_drafted, 1) if asked > 0 else 0, step_s)
        if n_drafted == 0:
            if asked == 1:  # an empty probe backs off like a rejected one
                self._failed_probes += 1
            return
        if n_drafted == 1:  # a probe, or a one-token draft: rejected ones back off
            self._failed_probes = 0 if n_accepted else self._failed_probes + 1
        elif n_accepted:
            self._failed_probes = 0
        self._all_accepted = n_drafted if n_accepted >= n_drafted else 0
        for i in range(self.draft_max):  # stale positions drift back towards the prior
            self.reached[i] *= _TRIAL_DECAY
            self.accepted[i] *= _TRIAL_DECAY
        if self._step_unsure:
            self._unsure = [self._unsure[0] * _TRIAL_DECAY + float(n_accepted > 0), self._unsure[1] * _TRIAL_DECAY + 1.0]
        if self.last_choice[0] == "copy":  # a draft on the copy's hope: what it earned, position by position
            reached = min(n_accepted + 1, n_drafted)
            self._copy = [self._copy[0] * _TRIAL_DECAY + n_accepted, self._copy[1] * _TRIAL_DECAY + reached]
        for i in range(min(n_accepted + 1, n_drafted, self.draft_max)):
            self.reached[i] += 1.0
            self.accepted[i] += 1.0 if i < n_accepted else 0.0

    def declined_note(self, min_steps: int = 8) -> str | None:
        """One line saying why drafting happened in fewer than a quarter of the steps (None where
        it happened more, or the reply was too short to tell): the drafter had nothing to propose,
        or the measured price of a verify here against the acceptance seen made plain decoding
        the faster choice (everywhere, or everywhere but the few steps it drafted in)."""
        if self.n_steps < min_steps or self.n_drafting_steps * 4 >= self.n_steps:
            return None
        if self.n_empty_asks * 2 >= self.n_steps:
            return (f"the drafter had nothing to propose in {self.n_empty_asks} of {self.n_steps} steps "
                    "(nothing earlier to copy), so this reply ran at plain decoding's speed")
        if not self._seen_drafted and self._draft_token_s is not None and self._verify_cost is not None:
            hopeful = best_length_for([0.9] * self.draft_max, self.relative_cost, self.draft_max) == 0
            return (f"drafting declined in all {self.n_steps} steps: a drafted token costs "
                    f"{self._drafting_relative(1):.2f}x a main-model token here and a verify of 4 drafts "
                    f"{self._verify_relative(4):.1f}x, so plain decoding was faster"
                    + (" even at 90% acceptance" if hopeful else ""))
        seen = (f"{self._seen_accepted / self._seen_drafted:.0%} of {self._seen_drafted} drafted tokens were "
                "accepted" if self._seen_drafted else "the drafter proposed nothing")
        if self.n_steps_drafted:  # drafts (probes too) were verified: not a verdict against drafting
            where = ("where acceptance made that pay" if self._drafting_paid() else
                     "to probe, since at the acceptance seen drafting would not pay")
            return (f"drafted in {self.n_steps_drafted} of {self.n_steps} steps ({seen}): a verify of 4 drafts "
                    f"costs {self.relative_cost(4):.1f}x a token here, so it drafted only {where}")
        return (f"drafting declined in all {self.n_steps} steps: a verify of 4 drafts costs "
                f"{self.relative_cost(4):.1f}x a token here and {seen}, so plain decoding was faster")

    def _drafting_paid(self) -> bool:
        """Whether the steps that drafted yielded more tokens than plain steps would have in their
        time, on the curve they were priced by. Acceptance comes in runs, so the rate of all
        drafted tokens says too little: the window's self-test reply drafted 36 tokens in 4 steps,
        61% accepted (5.5 a step, paying), and the note said that at 61% drafting would not pay."""
        drafted_yield = self._seen_accepted + self.n_steps_drafted  # each drafting step's accepted and its own token
        return self._drafted_cost > 0 and drafted_yield >= self._drafted_cost


class SplitSchedule:
    """Two schedules, one per kind of draft, each priced and learning its own acceptance: free
    n-gram drafts (`free_now()`, asked once a step: an n-gram drafter has a match) and a draft
    model's. Where a matcher has a match its draft goes first when the drafter sees a copy
    running, or when the model's drafts would not pay here at the acceptance seen (a CPU where
    a verify costs nearly its length); else the model drafts, as far as its price pays. One
    schedule for both priced the model's steps by the free ones' time and the free drafts by
    the model's acceptance, and where the model's drafts are cheap a chance match put in front
    of them lost."""

    def __init__(self, free: AdaptiveDraftLength, model: AdaptiveDraftLength, free_now: Callable[[], bool],
                 use_free: Callable[[bool], None] | None = None, free_confident: Confidence = None) -> None:
        """use_free(chosen): tells the drafter which kind drafts this step. free_confident: the
        n-gram matchers' own confidence, the draft model left out; the free drafts' schedule
        goes by it (the whole drafter's never says "unsure" with a model backing the matchers,
        and lookup's chance matches were drafted long on hope)."""
        self.free, self.model, self._free_now, self._use_free = free, model, free_now, use_free
        self._free_confident = free_confident
        self._current = model

    def length(self, budget: int, confident: Confidence = None, catch_up: Callable[[], float] | None = None) -> int:
        self._current = self._chosen(budget, confident)
        if self._use_free is not None:
            self._use_free(self._current is self.free)
        if self._current is self.free:
            return self.free.length(budget, self._free_confident or confident)
        return self.model.length(budget, None, catch_up)

    def _chosen(self, budget: int, confident: Confidence) -> AdaptiveDraftLength:
        if not self._free_now():
            return self.model
        if confident is not None and confident() is True:
            return self.free  # a running copy: drafted long, at no drafting cost
        return self.free if self.model.best_gain(budget) <= 1.0 else self.model

    def update(self, n_drafted: int, n_accepted: int, step_s: float, n_asked: int | None = None,
               draft_s: float | None = None) -> None:
        self._current.update(n_drafted, n_accepted, step_s, n_asked, draft_s)

    def declined_note(self) -> str | None:
        """The note of the schedule that ran most of the steps."""
        busier = self.model if self.model.n_steps >= self.free.n_steps else self.free
        return busier.declined_note()


def best_length_for(rates: list[float], relative_cost: float | Callable[[int], float], k_max: int,
                    k_min: int = 0) -> int:
    """argmax over k_min <= k <= k_max of E(k) / cost(k) where E(k) = 1 + sum_j prod_{i<=j}
    rates[i] and cost(k) is a step of k drafts relative to one of none: 1 + slope * k for a
    number, else the function. The shortest of near-equal lengths wins."""
    cost = relative_cost if callable(relative_cost) else (lambda k: 1.0 + relative_cost * k)
    best_k, best_rate = 0, 1.0
    if k_min > 0:
        best_k, best_rate = k_min, -1.0
    expected, run = 1.0, 1.0
    for k in range(1, max(k_max, 0) + 1):
        run *= rates[k - 1]
        expected += run
        if k < k_min:
            continue
        step_cost = cost(k)
        rate = expected / step_cost
        if rate > best_rate * 1.0001:
            best_k, best_rate = k, rate
        elif (expected + run * (k_max - k)) / step_cost < best_rate:
            break  # no longer draft can catch up: rates are at most 1 and a longer step costs no less
    # Never a length expected to run slower than plain decoding, forced or not.
    return best_k if best_rate >= 1.0 else 0


def expected_tokens(alpha: float, k: int) -> float:
    """Mean tokens one step yields with k drafts accepted independently with probability alpha."""
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def best_length(alpha: float, relative_slope: float, k_max: int) -> int:
    """The best draft length when every position is accepted with the same probability."""
    return best_length_for([alpha] * max(k_max, 0), relative_slope, k_max)


class _DecayedLine:
    """seconds = a + b * k, fitted by least squares with exponentially decaying weights."""

    def __init__(self) -> None:
        self.w = self.sn = self.st = self.snn = self.snt = 0.0

    def add(self, n: int, seconds: float) -> None:
        if n < 0 or seconds <= 0:
            return
        self.w = self.w * _DECAY + 1.0
        self.sn = self.sn * _DECAY + n
        self.st = self.st * _DECAY + seconds
        self.snn = self.snn * _DECAY + n * n
        self.snt = self.snt * _DECAY + n * seconds

    def predict(self, n: int) -> float:
        """Seconds at n: the fitted line, or the mean while the points show no slope."""
        mean_n, mean_t = self.sn / self.w, self.st / self.w
        var = self.snn / self.w - mean_n ** 2
        if var < 0.1:
            return mean_t
        b = (self.snt / self.w - mean_n * mean_t) / var
        return mean_t + b * (n - mean_n)

    def relative_slope(self, default: float | None = _PRIOR_SLOPE) -> float | None:
        """b / a: the cost of one more drafted token relative to a step that drafts nothing;
        `default` while the steps show no slope."""
        if self.w < 2.0:
            return default
        var = self.snn / self.w - (self.sn / self.w) ** 2
        if var < 0.1:  # all steps fed about the same number of tokens: no slope to see
            return default
        b = (self.snt / self.w - (self.sn / self.w) * (self.st / self.w)) / var
        a = self.st / self.w - b * self.sn / self.w
        if a <= 0:
            return default
        return min(max(b / a, 0.005), 2.0)


class _DecayedMean:
    """An exponentially decayed mean (the last ten or so values count)."""

    def __init__(self) -> None:
        self.w = self.total = 0.0

    def add(self, value: float) -> None:
        if value > 0:
            self.w = self.w * _DECAY + 1.0
            self.total = self.total * _DECAY + value

    def value(self) -> float | None:
        return self.total / self.w if self.w else None
