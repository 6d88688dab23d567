"""Compare's "Fastest" needs repeated runs whose spread does not overlap plain decoding's.

The runs here are written as a real run would record them (one PromptResult per configuration,
prompt and run), with speeds chosen to put each rule to the test; the verdict, the fastest and the
window's row are the real ones. Screenshots go to SPECULA_SHOTS when it names a folder.
"""

from __future__ import annotations

from dataclasses import replace

from PySide6.QtCore import Qt

from app.compare.fastest import fastest, reproduce_line
from app.compare.prompts import Prompt
from app.compare.results import (COMPARE_DEFAULTS, LOOKUP, NONE, CompareRun, ConfigSpec, MainFacts, PromptResult,
                                 RunSettings)
from app.engine.events import RunSummary, StopReason
from app.compare.summary import speedup_spread, tps_spread
from app.compare.verdict import verdict
from app.ui.compare.choice import WIN_COLOUR
from tests.gui_support import shot  # noqa: F401

TOKENS = 40
PROMPTS = (Prompt("code", "def f(x):"), Prompt("chat", "hello"))


def result(config: str, index: int, repeat: int, tps: float, accepted: int) -> PromptResult:
    drafted = 30 if config != NONE else 0
    summary = RunSummary("x", tuple(range(TOKENS + 1)), StopReason.MAX_TOKENS, config, 5, 5, 0.01, TOKENS + 1,
                         TOKENS / tps, 0.01, 20, drafted, min(accepted, drafted), (), ())
    return PromptResult(config, index, PROMPTS[index].category, summary, (), repeat=repeat)


def made_run(none_tps: list[float], lookup_tps: list[float], accepted: int = 12) -> CompareRun:
    """One run per element of the lists (a round of every prompt), plain decoding and lookup."""
    configs = (ConfigSpec(NONE, NONE, label=NONE), ConfigSpec(LOOKUP, LOOKUP, label=LOOKUP))
    results = []
    for repeat, (base, mine) in enumerate(zip(none_tps, lookup_tps)):
        for index in range(len(PROMPTS)):
            results += [result(NONE, index, repeat, base, 0), result(LOOKUP, index, repeat, mine, accepted)]
    settings = RunSettings(replace(COMPARE_DEFAULTS, max_tokens=TOKENS), repeats=len(none_tps))
    return CompareRun(MainFacts("tiny", "/m/tiny.gguf", "CPU"), settings, configs, PROMPTS, tuple(results),
                      status="complete")


def test_one_run_with_nothing_accepted_is_no_winner():
    # The walk-through's case: lookup "won" at 1.1x in one run with 0% of its drafts accepted.
    run = made_run([14.0], [15.4], accepted=0)
    choice = fastest(run)
    assert choice.drafter == NONE and not choice.pays_off
    assert choice.describe().startswith("no clear winner: plain decoding")
    assert "single run" in choice.describe()
    assert "no clear winner: plain decoding" in reproduce_line(run)


def test_nothing_accepted_is_noise_even_over_runs():
    choice = fastest(made_run([14.0, 14.1, 14.2], [15.5, 15.6, 15.7], accepted=0))
    assert choice.drafter == NONE and "no draft accepted" in choice.why


def test_overlapping_spreads_are_no_winner():
    run = made_run([12.0, 16.0, 13.0], [15.0, 19.0, 14.5])
    assert tps_spread(run, NONE).overlaps(tps_spread(run, LOOKUP))
    choice = fastest(run)
    assert choice.drafter == NONE and "overlap plain decoding's 12.0-16.0 tok/s" in choice.why
    assert speedup_spread(run, LOOKUP).low < 1.0 < speedup_spread(run, LOOKUP).high
    assert "(all prompts: 0.9-1.6x over 3 runs)" in verdict(run)


def test_a_clear_winner_shows_both_spreads():
    run = made_run([10.0, 11.0, 12.0], [20.0, 22.0, 21.0])
    choice = fastest(run)
    assert choice.drafter == LOOKUP and choice.pays_off
    text = choice.describe()
    assert "20.0-22.0 tok/s over 3 runs" in text and "plain decoding 10.0-12.0 tok/s over 3 runs" in text
    spread = speedup_spread(run, LOOKUP)  # slowest over plain's fastest .. fastest over plain's slowest
    assert (round(spread.low, 2), round(spread.high, 2), spread.n) == (1.67, 2.2, 3)
    assert "(all prompts: 1.7-2.2x over 3 runs)" in verdict(run)  # the CLI's verdict line shows it too


def test_compare_verdict_with_spread_in_the_window(qtbot, data_dir, tmp_path):
    from app.ui.compare.view import CompareWindow

    window = CompareWindow([])
    qtbot.addWidget(window)
    window.resize(1400, 900)
    window.show()
    window.set_run(made_run([12.0, 16.0, 13.0], [15.0, 19.0, 14.5]))
    row = window.fastest_row
    assert row.label.full_text().startswith("No clear winner: plain decoding")
    assert WIN_COLOUR not in row.label.styleSheet()
    assert "over 3 runs" in window.details_label.text() and "over 3 runs" in row.label.toolTip()
    shot(window, "compare-no-clear-winner")
    pushed = []
    row.useRequested.connect(pushed.append)
    qtbot.mouseClick(row.button, Qt.MouseButton.LeftButton)
    assert [c.drafter for c in pushed] == [NONE]  # never the drafter that did not win

    window.set_run(made_run([10.0, 11.0, 12.0], [20.0, 22.0, 21.0]))
    assert row.label.full_text().startswith("Fastest: lookup") and "over 3 runs" in window.details_label.text()
    assert WIN_COLOUR in row.label.styleSheet()
    shot(window, "compare-clear-winner")


def test_setup_offers_every_chat_drafter_and_the_runs(qtbot, data_dir, tiny_paths):
    from app.ui.compare.view import CompareWindow
    from app.hub.library_entries import FILE, entry_for_file

    window = CompareWindow([entry_for_file(tiny_paths["llama-f32"], FILE)])
    qtbot.addWidget(window)
    setup = window.setup
    texts = [t for t, _ in setup.draft_texts()]
    assert any(t.startswith("N-gram cache") for t in texts) and "Prompt lookup + n-gram cache" in texts
    assert setup.check_draft("ngram-cache") and setup.check_draft("lookup+ngram-cache")
    setup.repeats.setValue(4)
    request = setup.request()
    assert {d.kind for d in request.drafts} >= {"ngram-cache", "lookup+ngram-cache"}
    assert request.settings.repeats == 4


def test_each_run_starts_with_an_empty_ngram_cache_untaught_by_the_warm_up(tiny_paths, tiny_loaded):
    """A real run on a tiny model: the n-gram cache learns from finished replies only, so the first
    reply of every run drafts from an empty cache (the warm-up reply, the first prompt's own
    beginning, and the earlier run's replies would flatter it)."""
    from app.compare.results import CompareRequest, DraftChoice
    from app.compare.runner import Runner

    copy = "The model reads the file and the model writes the file. " * 3
    request = CompareRequest(str(tiny_paths["llama-f32"]), (DraftChoice("ngram-cache", label="ngram-cache"),),
                             (Prompt("copy", copy),), RunSettings(replace(COMPARE_DEFAULTS, max_tokens=24), ignore_eos=True, repeats=2),
                             device="cpu", dtype="float32")
    run = Runner(request, main=tiny_loaded("llama-f32")).run()
    cache = [r for r in run.results if r.config == "ngram-cache"]
    assert [r.repeat for r in cache] == [0, 1] and run.n_expected == len(run.results) == 4
    assert all(r.summary.n_accepted == 0 for r in cache)  # nothing finished before each of them in its run
