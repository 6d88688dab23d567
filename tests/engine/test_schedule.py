"""The adaptive draft length: the expected-throughput model and how it reacts to what it sees."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import pytest

from app.engine.backends.llamacpp.cost import StepCurve
from app.engine.loop.schedule import AdaptiveDraftLength, FixedDraftLength, best_length, best_length_for, expected_tokens

# Step curves measured on the torch int4 kernel (now retired), which computed rows in blocks:
# between its points a step costs what the later point does. Kept as the schedule's hardest case.
MEASURED_TOKENS = (1, 2, 4, 8, 16, 17)


@dataclass(frozen=True)
class CostCurve:
    seconds: tuple[float, ...]

    def cost(self, n_tokens: int) -> float:
        for n, seconds in zip(MEASURED_TOKENS, self.seconds):
            if n_tokens <= n:
                return seconds
        return self.seconds[-1] * n_tokens / MEASURED_TOKENS[len(self.seconds) - 1]


def test_expected_tokens_is_the_geometric_mean_run():
    assert expected_tokens(0.0, 8) == 1.0
    assert expected_tokens(1.0, 8) == 9.0
    assert expected_tokens(0.5, 2) == pytest.approx(1 + 0.5 + 0.25)


@pytest.mark.parametrize("alpha, slope, lo, hi", [
    (0.02, 0.08, 0, 0),    # almost nothing accepted: drafting costs more than it brings
    (0.5, 0.08, 2, 4),
    (0.95, 0.08, 10, 16),  # nearly everything accepted: draft long
    (0.95, 1.0, 0, 3),     # a draft model as costly as the main one barely pays
])
def test_best_length(alpha, slope, lo, hi):
    assert lo <= best_length(alpha, slope, 16) <= hi


def test_best_length_respects_the_ceiling():
    assert best_length(0.99, 0.01, 5) == 5
    assert best_length(0.99, 0.01, 0) == 0


def test_adaptive_grows_on_acceptance_and_shrinks_on_rejection():
    schedule = AdaptiveDraftLength(16)
    start = schedule.length(100)
    for _ in range(20):
        k = schedule.length(100)
        schedule.update(k, k, 0.010 + 0.0005 * k)  # everything accepted, drafting cheap
    grown = schedule.length(100)
    assert grown > start and grown >= 10
    for _ in range(20):
        k = schedule.length(100)
        schedule.update(k, 0, 0.010 + 0.0005 * k)  # nothing accepted
    assert schedule.alpha < 0.2
    assert schedule.length(100) <= 3


def test_idle_schedule_probes_now_and_then():
    schedule = AdaptiveDraftLength(16)
    for _ in range(30):
        k = schedule.length(100)
        schedule.update(k, 0, 0.010 + 0.005 * k)  # nothing accepted, drafting costly
    interval = schedule.probe_interval()
    assert interval >= 25  # a probe costs half a step here: at most 2% of the time goes to them
    lengths = [schedule.length(100) for _ in range(interval)]
    assert lengths.count(0) == interval - 1 and 1 in lengths  # idle, with an occasional one-token probe


def test_measured_cost_shortens_drafts():
    cheap, costly = AdaptiveDraftLength(16), AdaptiveDraftLength(16)
    for k in [1, 2, 4, 8, 3, 6, 1, 5] * 3:  # same acceptance, different cost per drafted token
        cheap.update(k, max(k - 1, 0), 0.010 + 0.0002 * k)
        costly.update(k, max(k - 1, 0), 0.010 + 0.0100 * k)
    assert costly.length(100) < cheap.length(100)


def test_fixed_is_llama_cpp():
    schedule = FixedDraftLength(16)
    schedule.update(16, 0, 1.0)
    assert schedule.length(100) == 16 and schedule.length(3) == 3


def test_a_fully_accepted_short_draft_lets_the_next_one_grow_at_once():
    # A rejection at position 1 leaves stale evidence there; while one-token drafts keep being
    # accepted nothing reaches position 1 again, so without growth the length would stay at 1.
    # That evidence still counts for half (three rejections there: this reply's copies broke at
    # the second token), so the length grows past it, not to four times as far at once.
    schedule = AdaptiveDraftLength(16)
    for _ in range(3):
        schedule.update(2, 1, 0.010 + 0.001 * 2)
    assert schedule.length(100) <= 2
    schedule.update(1, 1, 0.011)
    assert schedule.length(100) >= 3
    schedule.update(4, 4, 0.014)
    grown = schedule.length(100)
    assert grown >= 12  # four times as many, about: the ceiling and the one before it are near-equal here
    schedule.update(grown, 2, 0.010 + 0.001 * grown)  # a rejection: back to what the rates say
    assert schedule.length(100) < grown


def test_growth_fills_the_measured_block_instead_of_starting_another():
    """After every draft was accepted, the longer draft ends where the curve has a point: 15
    drafts (16 tokens, a block of the int4 kernel's rows) rather than 16, which start another."""
    int4_avx2 = CostCurve((0.036, 0.040, 0.050, 0.097, 0.190))
    schedule = AdaptiveDraftLength(16, int4_avx2.cost)
    schedule.update(7, 7, int4_avx2.cost(8), draft_s=1e-4)
    assert schedule.length(100) == 15


def test_costly_attempts_that_propose_nothing_stop_drafting():
    """A text-level draft costs its drafting whether or not a stable cut comes back: steps that
    asked for drafts and got none must read as dear drafting, not as a dearer plain step, and
    the schedule must stop asking (then probe rarely, backing off when probes come back empty)."""
    plain_s, per_draft_token_s = 0.010, 0.020  # the draft's tokens cost twice a main step
    schedule = AdaptiveDraftLength(16)
    for step in range(60):
        k = schedule.length(100)
        if k == 0:
            schedule.update(0, 0, plain_s, n_asked=0)
            continue
        drafted = min(k, 2) if step % 4 == 0 else 0  # mostly nothing comes back
        schedule.update(drafted, drafted // 2, plain_s + per_draft_token_s * (k + 3), n_asked=k)
    assert schedule.relative_cost(1) > 2.0
    asked = [schedule.length(100) for _ in range(50)]
    assert sum(asked) <= 1  # at most one probe in 50 steps
    before = schedule.probe_interval()
    schedule.update(0, 0, plain_s + per_draft_token_s * 4, n_asked=1)  # another empty probe
    assert schedule.probe_interval() >= before


GEMMA_INT4_AVX2 = CostCurve((0.073, 0.094, 0.128, 0.155, 0.313))  # Gemma 3 270M's int4 curve, AVX2


def _rejecting(schedule: AdaptiveDraftLength, steps: int) -> None:
    """Drafts and probes rejected until the schedule stops drafting."""
    for _ in range(steps):
        k = schedule.length(100)
        schedule.update(k, 0, GEMMA_INT4_AVX2.cost(k + 1), n_asked=k, draft_s=0.0001 if k else None)


def test_a_confident_drafter_gets_a_draft_at_once_after_rejections():
    """Rejected probes back off for dozens of steps; a drafter that sees a copy running (prompt
    lookup) gets a draft at once, of the length a copy's acceptance makes pay on the curve, and
    one that does not, or cannot tell, waits as before."""
    schedule = AdaptiveDraftLength(16, GEMMA_INT4_AVX2.cost)
    _rejecting(schedule, 12)
    assert schedule.probe_interval() > 20
    assert [schedule.length(100, confident=lambda: False) for _ in range(5)] == [0] * 5
    assert [schedule.length(100, confident=lambda: None) for _ in range(5)] == [0] * 5
    k = schedule.length(100, confident=lambda: True)
    assert k == best_length_for([0.9] * 16, schedule.relative_cost, 16) > 0
    schedule.update(k, k, GEMMA_INT4_AVX2.cost(k + 1), n_asked=k, draft_s=0.0001)
    assert schedule.length(100) >= k  # the hit keeps it drafting (7 rows fill a block of this curve)


def test_without_evidence_a_drafter_that_sees_no_copy_starts_with_one_draft():
    asked = []
    fresh = AdaptiveDraftLength(16, GEMMA_INT4_AVX2.cost)
    hopeful = fresh.length(100)
    assert hopeful > 1  # the prior: start long, as llama.cpp's fixed length does
    assert fresh.length(100, confident=lambda: asked.append(1) or False) == 1 and asked == [1]
    assert fresh.length(100, confident=lambda: None) == hopeful  # a draft model cannot tell
    assert fresh.length(100, confident=lambda: True) == hopeful
    fresh.update(1, 1, GEMMA_INT4_AVX2.cost(2), n_asked=1, draft_s=0.0001)
    assert fresh.length(100, confident=lambda: False) > 1  # evidence now decides


def test_the_drafter_is_asked_once_a_step_at_most():
    """Its answer sets the first position's rate (_unsure_rate) and can change the length at
    every step; a drafter that sees a copy gets its one question per step answered from a cache."""
    asked = []
    drafting = AdaptiveDraftLength(16, GEMMA_INT4_AVX2.cost)
    drafting.update(3, 2, GEMMA_INT4_AVX2.cost(4), n_asked=3, draft_s=0.0001)
    assert drafting.length(100, confident=lambda: asked.append(1) or True) > 0
    assert asked == [1]
    drafting.update(1, 1, GEMMA_INT4_AVX2.cost(2), n_asked=1, draft_s=0.0001)  # all accepted
    drafting.length(100, confident=lambda: asked.append(1) or False)
    assert asked == [1, 1]


def test_first_drafts_where_the_drafter_sees_no_copy_keep_a_rate_of_their_own():
    """SmolLM2's rewrite reply copies the paragraph and corrects a word now and then: prompt
    lookup's drafts inside a running copy were accepted, its drafts of 4-8 tokens on the 1-2
    token matches after each correction all rejected. The first position's rate where the
    drafter sees no copy is kept apart, so those stop while the copies still draft."""
    schedule = AdaptiveDraftLength(16, SMOLLM2_LLAMA.cost)
    for _ in range(6):
        assert schedule.length(100, confident=lambda: True) > 0
        schedule.update(6, 6, SMOLLM2_LLAMA.cost(7), n_asked=6, draft_s=0.0)  # a copy, accepted whole
        k = schedule.length(100, confident=lambda: False)
        schedule.update(k, 0, SMOLLM2_LLAMA.cost(k + 1), n_asked=k, draft_s=0.0)  # after a correction
    assert schedule.length(100, confident=lambda: False) == 0
    assert schedule.length(100, confident=lambda: True) >= 4
    assert schedule._unsure_rate() < 0.5 < 0.8 < schedule.alpha


def test_a_hit_where_the_drafter_sees_no_copy_does_not_force_a_longer_draft():
    """After a draft accepted whole the next one is forced longer (acceptance comes in runs),
    unless the drafter says no copy is running: then the hit was most likely chance, and the
    rates alone decide."""
    def after_a_lucky_probe() -> AdaptiveDraftLength:
        schedule = AdaptiveDraftLength(16, GEMMA_INT4_AVX2.cost)
        _rejecting(schedule, 6)
        schedule.update(1, 1, GEMMA_INT4_AVX2.cost(2), n_asked=1, draft_s=0.0001)
        return schedule
    assert after_a_lucky_probe().length(100, confident=lambda: True) >= 2
    assert after_a_lucky_probe().length(100, confident=lambda: None) >= 2  # a draft model cannot tell
    assert after_a_lucky_probe().length(100, confident=lambda: False) <= 1


def test_where_the_drafter_sees_no_copy_drafts_reach_one_position_past_the_evidence():
    """One probe accepted lends its rate to every position past it; where prompt lookup sees no
    copy running, that hit was most likely chance (SmolLM2's summary: 15 drafts next, all
    rejected; on llama.cpp's curves even 4 cost it 0.92x of plain), so the next draft reaches
    one position further than any evidence."""
    def after_one_hit() -> AdaptiveDraftLength:
        schedule = AdaptiveDraftLength(16, GEMMA_INT4_AVX2.cost)
        schedule.update(1, 1, GEMMA_INT4_AVX2.cost(2), n_asked=1, draft_s=0.0001)
        return schedule
    assert after_one_hit().length(100, confident=lambda: None) > 4  # a draft model cannot tell
    assert after_one_hit().length(100, confident=lambda: True) > 4
    assert 1 <= after_one_hit().length(100, confident=lambda: False) <= 2
    deeper = after_one_hit()
    deeper.update(4, 4, GEMMA_INT4_AVX2.cost(5), n_asked=4, draft_s=0.0001)
    assert 2 <= deeper.length(100, confident=lambda: False) <= 5


# SmolLM2 135M Q4_1 on llama.cpp, 2-core Zen 4 (portable AVX2 build): steps of 1, 2, 3, 5, 9 and 17 tokens.
SMOLLM2_LLAMA = StepCurve({1: 0.00717, 2: 0.01256, 3: 0.01723, 5: 0.02381, 9: 0.03542, 17: 0.06086})
SMOLLM2_I8HEAD = CostCurve((0.0084, 0.0101, 0.0132, 0.0202, 0.0310))  # SmolLM2 135M int4 + int8 head, AVX-512


def test_after_a_run_of_fifteen_a_sixteenth_draft_is_forced_only_where_its_row_costs_its_share():
    """After a draft accepted whole the next one is forced longer, but not one row into a new
    block of the kernel's rows: Gemma 3 270M's 17-token step cost 1.11-1.2x its 16-token one,
    and 16 drafts after every run of 15 made a long copy dearer per token. Where the 17th row
    costs what the 16th does, the draft grows to 16. Nor is the rest of a shorter budget forced:
    8 drafts would verify 9 rows, a new block, where 7 fill one."""
    def after_runs(curve: CostCurve, budget: int = 100) -> int:
        schedule = AdaptiveDraftLength(16, curve.cost)
        for k in (3, 7, 15):
            assert schedule.length(100, confident=lambda: True) >= k
            schedule.update(k, k, curve.cost(k + 1), n_asked=k, draft_s=0.0001)
        return schedule.length(budget, confident=lambda: True)
    curve = SMOLLM2_I8HEAD.seconds
    assert after_runs(CostCurve(curve + (curve[-1] * 1.2,))) == 15
    assert after_runs(CostCurve(curve + (curve[-1] * 1.01,))) == 16
    assert after_runs(CostCurve(curve + (curve[-1] * 1.2,)), budget=8) == 7


def test_no_longer_draft_is_forced_where_none_could_pay_per_token():
    """Where every longer draft, accepted whole, costs more per token than the run just
    accepted (Gemma 3 270M's int4 curve on AVX2: 15 drafts cost 2.02x 7), no rates could make it
    pay, and the run's length is kept."""
    schedule = AdaptiveDraftLength(16, GEMMA_INT4_AVX2.cost)
    schedule.update(7, 7, GEMMA_INT4_AVX2.cost(8), n_asked=7, draft_s=0.0001)
    assert schedule.length(100, confident=lambda: True) == 7


def _a_third_accepted(schedule: AdaptiveDraftLength, verify_times_curve: float, steps: int = 60) -> list[int]:
    """Prompt lookup where every other step finds no match (it drafts nothing) and one draft in
    three is accepted. A step without drafts takes the curve's one-token time, one with drafts
    the curve's time times verify_times_curve. Returns the lengths drafted."""
    drafted = []
    for step in range(steps):
        asked = schedule.length(100, confident=lambda: None)
        k = asked if step % 2 else 0
        drafted.append(k)
        seconds = SMOLLM2_I8HEAD.cost(k + 1) * (verify_times_curve if k else 1.0)
        schedule.update(k, int(k > 0 and step % 3 == 0), seconds, n_asked=asked, draft_s=1e-5)
    return drafted


def test_verifies_dearer_than_the_curve_stop_drafting_that_pays_only_on_the_curve():
    """The curve is measured at load (weights of zero, a short context, a quiet machine); where
    the reply's own steps show a verify dearer than that, drafting that paid only on the curve
    stops (SmolLM2's summary on a busy machine: 1-token drafts at 1.45x a step, not 1.2x)."""
    as_curve = AdaptiveDraftLength(16, SMOLLM2_I8HEAD.cost)
    dearer = AdaptiveDraftLength(16, SMOLLM2_I8HEAD.cost)
    drafting_as_curve = sum(k > 0 for k in _a_third_accepted(as_curve, 1.0)[-30:])
    drafting_dearer = sum(k > 0 for k in _a_third_accepted(dearer, 1.25)[-30:])
    assert as_curve.curve_factor() == pytest.approx(1.0, rel=0.01)
    assert dearer.curve_factor() == pytest.approx(1.25, rel=0.01)

    assert drafting_as_curve >= 10
    assert drafting_dearer <= 2


def test_a_verify_is_never_priced_below_a_plain_step():
    """A curve timed while the machine was busy read a verify of 2 at 0.68x one token, and a
    reply whose verifies ran faster than the curve scaled them further down: drafts looked
    cheaper than no draft. A step feeding more tokens is never priced below one feeding fewer."""
    busy = StepCurve({1: 0.030, 2: 0.0204, 3: 0.026, 5: 0.040})
    assert [busy.cost(n) for n in (1, 2, 3, 4, 5)] == [0.030, 0.030, 0.030, 0.035, 0.040]

    schedule = AdaptiveDraftLength(16, SMOLLM2_I8HEAD.cost)
    _a_third_accepted(schedule, 0.5)
    assert schedule.curve_factor() < 0.9
    assert all(schedule.relative_cost(k) >= 1.0 for k in range(17))


def test_a_declined_drafter_is_said_in_one_line_with_the_reason():
    from app.engine.loop.schedule import AdaptiveDraftLength

    costly = AdaptiveDraftLength(16, verify_cost=lambda n: 0.01 * n)  # every drafted token costs a step
    for _ in range(20):  # drafts asked for, one-token probes, all rejected
        costly.update(1, 0, 0.02, n_asked=1, draft_s=0.0)
    note = costly.declined_note()
    assert note is not None and "\n" not in note
    assert note.startswith("drafted in 20 of 20 steps (0% of 20 drafted tokens were accepted)"), note
    assert note.endswith("so it drafted only to probe, since at the acceptance seen drafting would not pay")
    few = AdaptiveDraftLength(16, verify_cost=lambda n: 0.01 * n)
    for i in range(20):  # a copy drafted in 3 steps, mostly accepted; plain steps elsewhere
        few.update(6, 5, 0.07, n_asked=6, draft_s=0.0) if i % 7 == 0 else few.update(0, 0, 0.01, n_asked=0)
    note = few.declined_note()
    assert note.startswith("drafted in 3 of 20 steps (83% of 18 drafted tokens were accepted)"), note
    assert "plain decoding was faster" not in note
    empty = AdaptiveDraftLength(16)
    for _ in range(20):  # asked for 4 drafts at each step, the drafter found nothing to copy
        empty.update(0, 0, 0.01, n_asked=4, draft_s=0.0)
    assert empty.declined_note().startswith("the drafter had nothing to propose in 20 of 20 steps")
    drafting = AdaptiveDraftLength(16)
    for _ in range(20):
        drafting.update(4, 3, 0.02, n_asked=4, draft_s=0.0)
    assert drafting.declined_note() is None  # it drafted: nothing to explain
    short = AdaptiveDraftLength(16)
    short.update(0, 0, 0.01, n_asked=0)
    assert short.declined_note() is None  # too short to tell


# A 2-core CPU's llama.cpp curve: a verify of n tokens costs about half a step per extra token.
CPU_STEP_S = 0.01


def cpu_curve(n: int) -> float:
    return CPU_STEP_S * (1.0 + 0.5 * (n - 1))


def _steps_drafted(schedule, n_steps: int, accept, catch_up=lambda: 0.0) -> list[int]:
    """The lengths a schedule picks over n_steps, accepting accept(k) of each k-token draft."""
    lengths = []
    for _ in range(n_steps):
        k = schedule.length(64, catch_up=catch_up)
        lengths.append(k)
        schedule.update(k, accept(k), CPU_STEP_S * (1 + 0.5 * k), n_asked=k, draft_s=0.0)
    return lengths


def test_a_draft_model_as_dear_as_the_main_one_is_never_run():
    """A draft model priced by its own measured step (0.8 of the main model's per token, the
    layer-skip draft of SmolLM2 here) does not pay even at the prior's 90% acceptance: no draft
    from the first step on, no probe while its catch-up costs more than the probe budget, and the
    note says why in one line."""
    schedule = AdaptiveDraftLength(16, cpu_curve, draft_token_s=0.8 * CPU_STEP_S)
    behind = iter(range(10_000))
    lengths = _steps_drafted(schedule, 400, lambda k: k,  # it would be accepted whole: it is never asked
                             catch_up=lambda: cpu_curve(60 + next(behind)))
    assert lengths == [0] * 400
    note = schedule.declined_note()
    assert note is not None and "\n" not in note
    assert note.startswith("drafting declined in all 400 steps: a drafted token costs 0.80x") and "90%" in note


def test_a_cheap_draft_model_drafts_from_the_first_step():
    """Where the draft's measured step is cheap against a flat verify (a GPU), the prior's hopeful
    acceptance makes drafting pay at once, as llama.cpp's fixed length does."""
    schedule = AdaptiveDraftLength(16, lambda n: CPU_STEP_S * (1.0 + 0.02 * (n - 1)), draft_token_s=0.05 * CPU_STEP_S)
    # The prior's rates (0.9) priced on the flat curve plus the draft's own steps: 1.02 + 0.07 per
    # drafted token pays up to the longest draft allowed, which the first step drafts.
    prior = best_length_for([0.9] * 16, lambda k: 1.0 + 0.02 * k + 0.05 * k, 16)
    assert prior >= 8
    assert schedule.length(64, catch_up=lambda: 1.0) == prior


def test_probes_wait_for_a_catch_up_within_the_probe_budget():
    """A declined draft model that must read what it skipped probes only where that reading is
    within the probe budget of the steps since its last probe: never when it costs more per step
    skipped than the budget, as often as before when it costs nothing."""
    def run(catch_up_per_token: float) -> int:
        schedule = AdaptiveDraftLength(16, cpu_curve, draft_token_s=0.05 * CPU_STEP_S)
        skipped = [0]

        def catch_up() -> float:
            return skipped[0] * catch_up_per_token * CPU_STEP_S

        probes = 0
        for _ in range(2000):
            k = schedule.length(64, catch_up=catch_up)
            probes += k == 1 and schedule.last_choice[0] == "probe"  # not the first steps' drafts on the prior
            skipped[0] = 0 if k else skipped[0] + 1
            schedule.update(k, 0, CPU_STEP_S * (1 + 0.5 * k), n_asked=k, draft_s=0.0)  # every draft rejected
        return probes

    assert run(0.0) >= 8  # drafts rejected: it backs off to probes now and then
    assert run(0.01) >= 4  # a cheap catch-up (a GPU's batch) delays probes a little
    assert run(0.5) == 0  # a CPU's: the catch-up alone is over the budget, whatever the wait


# Gemma 3 270M on llama.cpp, 2-core Zen 4 (`specula calibrate`): not convex, llama.cpp changes
# kernels with the batch size: 3 tokens is the dearest per token, long batches are cheap.
GEMMA_ZEN4 = StepCurve({1: 1.0, 2: 2.10, 3: 3.35, 5: 3.85, 9: 4.65, 17: 7.26, 33: 12.0, 65: 22.0})


def test_a_copy_on_a_curve_with_a_dip_drafts_where_the_curve_pays():
    """A copy running where one or two drafts cannot pay (2 tokens cost 2.1x one, 3 tokens
    3.35x: 35 of 35 two-token drafts accepted ran at 0.91x of plain) drafts a length that does."""
    schedule = AdaptiveDraftLength(64, GEMMA_ZEN4.cost)
    k = schedule.length(100, confident=lambda: True)
    assert k >= 4
    for _ in range(6):  # every draft accepted: longer drafts, where the curve's price per token falls
        schedule.update(k, k, GEMMA_ZEN4.cost(k + 1), n_asked=k, draft_s=0.0001)
        k = schedule.length(100, confident=lambda: True)
    assert k >= 16


@pytest.mark.parametrize("curve", [GEMMA_ZEN4, GEMMA_INT4_AVX2, SMOLLM2_LLAMA])
@pytest.mark.parametrize("alpha", [0.0, 0.2, 0.5, 0.7, 0.9, 0.97])
def test_no_length_expected_below_plain_is_ever_chosen(curve, alpha):
    """Whatever happened before (runs accepted whole, which force longer drafts), every length
    chosen on rates is 0 or one whose expected tokens per step over its cost beats a plain step
    on the very rates it was chosen on; only a probe (one token, within its time budget) may not."""
    schedule = AdaptiveDraftLength(64, curve.cost)
    rng = random.Random(7)
    chosen = []
    for step in range(80):
        k = schedule.length(100, confident=[lambda: True, lambda: False, lambda: None][step % 3])
        how, rates = schedule.last_choice
        if k and how != "probe":
            expected = 1.0 + sum(math.prod(rates[:j + 1]) for j in range(k))
            assert expected / schedule.relative_cost(k) >= 1.0, (step, how, k)
        chosen.append(k)
        accepted = 0
        while accepted < k and rng.random() < alpha:
            accepted += 1
        schedule.update(k, accepted, curve.cost(k + 1), n_asked=k, draft_s=0.0001 if k else None)
    assert alpha < 0.9 or max(chosen) >= 4


def test_a_forced_length_that_cannot_pay_is_not_drafted():
    assert best_length_for([0.1] * 16, GEMMA_ZEN4.ratio, 16, k_min=4) == 0
    assert best_length_for([0.99] * 16, GEMMA_ZEN4.ratio, 16, k_min=4) >= 4


def test_the_note_agrees_with_the_counts_and_the_arithmetic():
    """The torch fallback's note once said "drafting declined in all 17 steps: a verify of 4
    drafts costs 1.3x a token here and 100% of 6 drafted tokens were accepted, so plain decoding
    was faster": six one-token drafts were verified and all accepted, and at 1.3x for 4 drafts
    full acceptance pays about 3x. The note says what was drafted and never that plain decoding
    was faster where the acceptance seen makes drafting pay."""
    schedule = AdaptiveDraftLength(16)  # no measured curve: torch
    for i in range(17):
        if i % 3 == 0:
            schedule.update(1, 1, 0.0105, n_asked=1, draft_s=0.0001)
        else:
            schedule.update(0, 0, 0.010, n_asked=0)
    note = schedule.declined_note()
    assert note is not None and "\n" not in note
    assert "declined in all" not in note and "plain decoding was faster" not in note
    assert note.startswith("drafted in 6 of 17 steps (100% of 6 drafted tokens were accepted)"), note
    losing = AdaptiveDraftLength(16, verify_cost=lambda n: 0.01 * n)  # every drafted token costs a step
    for i in range(17):
        losing.update(1, 0, 0.02, n_asked=1, draft_s=0.0) if i % 3 == 0 else losing.update(0, 0, 0.01, n_asked=0)
    assert "would not pay" in losing.declined_note()


def test_a_copy_whose_drafts_are_rejected_stops_drafting_on_its_hope():
    """A reply that restates the question and then goes its own way: prompt lookup sees a copy
    at every step and every draft is rejected. Drafting on the copy's hope stops within a few
    steps instead of drafting long at each (0.70x of plain decoding on the bench's maths prompt)."""
    schedule = AdaptiveDraftLength(64, GEMMA_ZEN4.cost)
    lengths = []
    for _ in range(40):
        k = schedule.length(100, confident=lambda: True)
        lengths.append(k)
        schedule.update(k, 0, GEMMA_ZEN4.cost(k + 1), n_asked=k, draft_s=0.0001 if k else None)
    assert lengths[0] >= 4
    assert sum(lengths[10:]) <= 3  # at most a probe or so once the hope is spent


# llama.cpp's step curve for SmolLM2 135M Q4_1 on 2 Zen 2 cores (`specula calibrate`): ms for n tokens.
SMOLLM2_LLAMACPP_MS = {1: 10.36, 2: 17.15, 3: 23.47, 5: 33.70, 9: 54.03, 17: 95.53, 33: 182.88, 65: 330.97}


def _llamacpp_cost(n: int) -> float:
    """Seconds of a step of n tokens, linear between the measured points."""
    points = sorted(SMOLLM2_LLAMACPP_MS.items())
    for (n0, ms0), (n1, ms1) in zip(points, points[1:]):
        if n <= n1:
            return (ms0 + (ms1 - ms0) * (n - n0) / (n1 - n0)) / 1000.0
    return points[-1][1] * n / points[-1][0] / 1000.0


def _growth(confident) -> list[int]:
    schedule = AdaptiveDraftLength(64, _llamacpp_cost)
    lengths = []
    for _ in range(5):
        k = schedule.length(200, confident=confident)
        lengths.append(k)
        schedule.update(k, k, _llamacpp_cost(k + 1), n_asked=k, draft_s=0.0001)
    return lengths


def test_a_copy_the_drafter_sees_running_doubles_its_drafts_while_accepted_whole():
    """A repeated request (ngram-mod's chain of the earlier reply) or a long copy: each step
    accepted whole lets the next draft twice as far where the curve is no dearer per token, as
    llama.cpp's ngram-mod drafts its whole chain; it grew one token a step (4, 8, 9, 10, 11, 12
    on SmolLM2's repeated rewrite reply, 154 tok/s against llama-server's 166). Where the
    drafter cannot tell, it grows as before."""
    seen = _growth(lambda: True)
    assert seen[:2] == _growth(lambda: None)[:2]
    assert all(b >= 2 * a * 0.9 for a, b in zip(seen[1:4], seen[2:5])), seen
    assert max(seen) >= 32
    unsure = _growth(lambda: None)
    assert max(unsure) < 16 and all(b - a <= 1 for a, b in zip(unsure[2:], unsure[3:])), unsure


def _after(steps, confident) -> AdaptiveDraftLength:
    """A schedule on SmolLM2's llama.cpp curve after (drafted, accepted) steps."""
    schedule = AdaptiveDraftLength(64, _llamacpp_cost)
    for k, accepted in steps:
        schedule.length(200, confident=confident)
        schedule.update(k, accepted, _llamacpp_cost(k + 1), n_asked=k, draft_s=0.0001)
    return schedule


def test_a_run_accepted_whole_is_not_forced_past_where_this_replys_copies_break():
    """SmolLM2's rewrite reply copies a few words of the prompt, then rewords: drafts of 8
    broke at the sixth token, and the next run of 5 accepted whole forced a draft of 10 (twice
    the run, the copy seen running), accepted 2 (0.99x of plain decoding on the curve, 1.05x
    when the break counts). The break counts for half beside the run's hope: no forced length
    reaches past it, while a copy with no such evidence still doubles."""
    broke = _after([(4, 4), (8, 5), (5, 5)], lambda: True)
    assert broke.length(200, confident=lambda: True) <= 6
    unbroken = _after([(4, 4), (8, 8), (5, 5)], lambda: True)
    assert unbroken.length(200, confident=lambda: True) >= 10


def test_where_the_drafter_sees_no_copy_nothing_is_drafted_on_hope_alone_where_a_token_costs_much():
    """Prompt lookup's match of a token or two, nothing known yet: on SmolLM2 its first drafts
    were accepted 36% of the time across the bench's first requests (Gemma 78%). A first draft
    on the hopeful prior (0.9) lost 0.66 of a step each time on SmolLM2's curve (2 tokens cost
    1.66x one): 0.96x of plain on its summary. Such drafts start at 60% at best until this reply's
    own evidence says more: none where that does not pay, one where a token is cheap."""
    assert AdaptiveDraftLength(64, _llamacpp_cost).length(200, confident=lambda: False) == 0
    cheap = AdaptiveDraftLength(64, lambda n: 0.010 * (1 + 0.3 * (n - 1)))
    assert cheap.length(200, confident=lambda: False) == 1
    hits = _after([(1, 1)] * 3, lambda: False)  # evidence of its own: such drafts pay here
    assert hits.length(200, confident=lambda: False) >= 1


def test_the_note_says_drafting_paid_where_its_steps_yielded_more_than_their_time():
    """The window's self-test reply (SmolLM2, prompt lookup on a code rewrite) drafted 36 tokens
    in 4 of 26 steps, 61% accepted, 5.5 a step, and its note said it "drafted only to probe, since
    at the acceptance seen drafting would not pay": true of 61% at every position alike, not of
    runs accepted whole. The note now weighs the drafting steps' tokens against their price."""
    schedule = AdaptiveDraftLength(64, _llamacpp_cost)
    for k, accepted in [(4, 4), (8, 8), (16, 8), (8, 2)]:
        schedule.update(k, accepted, _llamacpp_cost(k + 1), n_asked=k, draft_s=0.0001)
    for _ in range(22):
        schedule.update(0, 0, _llamacpp_cost(1), n_asked=0)
    note = schedule.declined_note()
    assert note.startswith("drafted in 4 of 26 steps (61% of 36 drafted tokens were accepted)"), note
    assert note.endswith("where acceptance made that pay"), note


@pytest.mark.parametrize("curve", [CostCurve((0.010, 0.016, 0.024, 0.040, 0.070, 0.075)), None])
def test_steps_that_ask_for_nothing_keep_the_prices_and_rates_a_fresh_reckoning_gives(curve):
    """Idle steps keep the memos of prices and rates (a reply where nothing copies would price
    every length again each step): they must equal what a fresh reckoning gives after any mix of
    drafting and idle steps, with a measured curve (kept) and without one (the fitted line moves)."""
    rng = random.Random(3)
    schedule = AdaptiveDraftLength(16, curve.cost if curve else None)
    for step in range(60):
        schedule.length(50, confident=lambda: rng.random() < 0.3)
        k = rng.choice([0, 0, 0, 1, 4, 9])
        schedule.update(k, rng.randint(0, k), 0.010 + 0.002 * k + 0.001 * rng.random(),
                        n_asked=k if k or rng.random() < 0.5 else 1, draft_s=0.0002 * k)
        memo_costs = [schedule.relative_cost(n) for n in range(17)]
        memo_rates = schedule.rates()
        schedule._cost_memo.clear()
        schedule._rates_memo = None
        assert [schedule.relative_cost(n) for n in range(17)] == memo_costs, step
        assert schedule.rates() == memo_rates, step
