"""The why-panel beside the live charts (app/ui/chat/why.py), in a real offscreen Qt window, fed a
reply's summary and steps as the loop gives them. The real pair on this CPU is in
tests/test_builtin_pair.py (its draft cannot pay here); this is a machine where it can."""

from __future__ import annotations

import json
from pathlib import Path

from app.engine.events import Origin, StepEvent
from app.engine.loop.replay import linear_curve, measured_curve
from app.ui.chat.why import WhyPanel
from tests.gui_support import shot

# The real pair's acceptance recorded on the bench's prompts (tests/data/qwen_pair_acceptance.json).
RECORDED = Path(__file__).parents[1] / "data" / "qwen_pair_acceptance.json"


def step(n_drafted: int, n_accepted: int) -> StepEvent:
    tokens = n_accepted + 1
    return StepEvent(tuple(range(tokens)), (Origin.DRAFT,) * n_accepted + (Origin.MAIN,), "x" * tokens, 0,
                     n_drafted, n_accepted, 0.001, 0.01, 0.0)


def gpu_like_summary() -> dict:
    """A summary's prices on a memory-bound machine: a verify of 8 at 1.3x a plain step, a drafted
    token at 0.1x (a GPU, or a main model many times its draft)."""
    curve = linear_curve("gpu-like", 1.3, 0.1)
    return {"step_costs": [curve.step(k) for k in range(17)], "draft_token_cost": 0.1}


def test_where_the_draft_pays_the_panel_says_so_and_marks_the_acceptance_above_break_even(qtbot):
    panel = WhyPanel()
    qtbot.addWidget(panel)
    panel.resize(460, 220)
    panel.show()
    assert panel.prices is None and panel.words.text().startswith("Nothing to weigh yet")
    panel.show_summary(gpu_like_summary())
    assert "nothing drafted yet" in panel.words.text()
    # At each position of the code prompt's reply, how many of the 0.5B's greedy tokens the 1.5B's
    # greedy reply matches from there: a step drafting 4 accepts that many of them, at most 4.
    matches = json.loads(RECORDED.read_text())["prompts"]["code-rewrite"]["model"]
    drafted = accepted = position = 0
    while position < len(matches):
        accepted_here = min(matches[position], 4)
        panel.add_steps((step(4, accepted_here),))
        drafted, accepted, position = drafted + 4, accepted + accepted_here, position + accepted_here + 1
    panel.redraw()
    seen = accepted / drafted
    assert panel.seen == seen
    reading = panel.prices.break_even(seen)
    assert reading.acceptance is not None and seen > reading.acceptance
    assert panel.words.text().endswith("drafting pays.") and f"you are at {seen:.0%}" in panel.words.text()
    assert panel.prices.speedup(seen, reading.length) > 1.0  # the marker sits above the break-even line
    shot(panel, "57-5-why-panel-where-a-draft-pays")

    # A reply that priced nothing (plain decoding, a server's own speculation) leaves the prices up;
    # a new reply starts its acceptance over.
    panel.show_summary({"step_costs": [], "draft_token_cost": None})
    assert panel.prices is not None
    panel.reset()
    assert panel.seen is None and "nothing drafted yet" in panel.words.text()


def test_where_no_draft_can_pay_the_panel_says_it_and_draws_no_crossing(qtbot):
    panel = WhyPanel()
    qtbot.addWidget(panel)
    # A 2-core Zen 4's measured curve for the 1.5B (`specula calibrate`, issue 57), a 0.5B token at 0.61x.
    curve = measured_curve("2-core", {1: 1.0, 2: 1.79, 5: 3.59, 9: 8.26, 17: 12.0, 33: 19.2}, 0.61)
    panel.show_summary({"step_costs": [curve.step(k) for k in range(17)], "draft_token_cost": 0.61})
    panel.add_steps((step(4, 4),))
    panel.redraw()
    assert "no draft can pay on this machine" in panel.words.text() and "you are at 100%" in panel.words.text()
    assert max(panel.prices.speedup(a / 100, 4) for a in range(101)) < 1.0
