"""Why a draft pays or not, in one sentence (issue 57 item 5): the break-even acceptance is the one
where a step's expected tokens equal its price, and the sentence says what the schedule priced."""

from __future__ import annotations

import pytest

from app.engine.loop.explain import break_even, break_even_acceptance, expected_tokens, explain_schedule
from app.engine.loop.replay import adaptive, linear_curve, measured_curve
from app.engine.loop.schedule import FixedDraftLength

TWO_CORES = measured_curve("2 cores", {1: 1.0, 2: 1.79, 5: 3.59, 9: 8.26, 17: 12.0, 33: 19.2, 65: 34.4}, 0.61)
MEMORY_BOUND = linear_curve("memory-bound", 1.3, 0.1)


@pytest.mark.parametrize("k, cost", [(1, 1.5), (4, 2.0), (8, 3.3)])
def test_at_the_break_even_acceptance_a_step_yields_what_it_costs(k, cost):
    needed = break_even_acceptance(cost, k)
    assert expected_tokens(needed, k) == pytest.approx(cost, rel=1e-6)
    assert break_even_acceptance(k + 1.5, k) is None  # dearer than every draft accepted


def test_two_cores_say_no_draft_model_can_pay_and_a_gpu_says_where_it_does():
    cpu = break_even(TWO_CORES.step, 0.61, 0.9).sentence()
    assert "a drafted token costs 0.61x" in cpu and "no draft can pay on this machine" in cpu and "90%" in cpu
    gpu = break_even(MEMORY_BOUND.step, 0.1, 0.85)
    assert gpu.acceptance is not None and gpu.acceptance < 0.85 and gpu.length > 1
    assert "drafting pays" in gpu.sentence()
    low = break_even(MEMORY_BOUND.step, 0.1, 0.05).sentence()
    assert "below it, plain decoding is faster" in low


def test_a_replys_schedule_explains_itself_and_a_fixed_length_does_not():
    schedule = adaptive(MEMORY_BOUND, 16)
    assert "nothing drafted yet" in explain_schedule(schedule)
    schedule.update(8, 6, 0.02, n_asked=8, draft_s=0.008)
    assert "you are at 75%" in explain_schedule(schedule)
    assert explain_schedule(FixedDraftLength(4)) is None
