"""Issue 60 item 3: Compare tests the chat's default drafter and our ngram-mod, judges each engine's
drafting against that engine's own plain decoding, never crowns a row that had no draft accepted
for drafting, and says "declined: <the schedule's reason>" for a draft model that never drafted.

The verdicts are read off runs written as a real run records them (tests/compare/made_runs.py);
the drafters run for real on tiny models through the real runner and the real `specula compare`.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from app.cli import main
from app.compare.choices import parse_drafts, plan_configs, resolve_draft
from app.compare.export import format_table
from app.compare.fastest import fastest
from app.compare.prompts import Prompt
from app.compare.results import COMPARE_DEFAULTS, LLAMA_SERVER, NONE, CompareRequest, DraftChoice, RunSettings, load_run
from app.compare.summary import ALL, table_rows
from app.compare.verdict import headline, verdict, verdict_parts
from app.engine.drafting.kinds import LEARNING, NGRAM_MOD
from app.engine.loop.schedule import AdaptiveDraftLength
from tests.compare.made_runs import (DRAFT_05B, DRAFT_MODEL, OURS_PLAIN, SERVER_MOD, SERVER_PLAIN, issue60_run,
                                     made_run)

COPY = "The model reads the file and the model writes the file. " * 3


def part_of(run, name: str) -> str:
    return next(p for p in verdict_parts(run) if p.startswith(f"{name}: "))


# --- a: the chat's default and ngram-mod ---------------------------------------------------------


def test_the_drafts_list_offers_the_chats_default_first_and_our_ngram_mod(qtbot, data_dir, tiny_paths):
    from app.hub.library_entries import FILE, entry_for_file
    from app.ui.compare.view import CompareWindow

    window = CompareWindow([entry_for_file(tiny_paths["llama-f32"], FILE)])
    qtbot.addWidget(window)
    setup = window.setup
    texts = [t for t, _ in setup.draft_texts()]
    assert texts[0].startswith("None") and texts[1] == "Lookup + n-gram cache + ngram-mod (the chat's default)"
    assert "ngram-mod (learns from the run's replies)" in texts
    request = setup.request()  # as a new user finds it: the chat's default ticked, beside plain decoding
    assert [d.kind for d in request.drafts] == [LEARNING]
    assert setup.check_draft(NGRAM_MOD) and {d.kind for d in setup.request().drafts} == {LEARNING, NGRAM_MOD}
    assert "learn" in setup.drafts.item(1).toolTip() and "chat's default" in setup.drafts.item(1).toolTip()
    from app.worker.requests import DEFAULT_DRAFTER

    assert DEFAULT_DRAFTER == LEARNING  # the chat's default is the one Compare offers first


def test_the_command_line_compares_the_chats_default_by_default(tiny_paths, tmp_path, capsys):
    from app.cli import build_parser
    from app.cli.compare import drafts_arg

    args = build_parser().parse_args(["compare", "-m", str(tiny_paths["llama-f32"])])
    assert parse_drafts(drafts_arg(args)) == [NONE, LEARNING]
    assert resolve_draft(NGRAM_MOD) == DraftChoice(NGRAM_MOD, label=NGRAM_MOD)
    out = tmp_path / "run.json"
    code = main(["compare", "-m", str(tiny_paths["llama-f32"]), "--drafts", f"none,{LEARNING},{NGRAM_MOD}",
                 "-p", COPY, "-n", "8", "-r", "1", "--device", "cpu", "--dtype", "float32", "--json", str(out)])
    assert code == 0
    run = load_run(out)
    assert [c.name for c in run.configs] == [NONE, LEARNING, NGRAM_MOD]
    assert {r.config for r in run.results} == {NONE, LEARNING, NGRAM_MOD} and not run.errors
    assert f"{NGRAM_MOD}:" in capsys.readouterr().out


def test_ngram_mod_learns_from_every_reply_of_a_run(tiny_paths, tiny_loaded):
    """As in the chat, where its pool learns from every reply: the same prompt asked again in one
    run drafts the earlier reply (a pool made afresh per reply could not, the tiny model's reply
    being nowhere in its prompt)."""
    from app.compare.runner import Runner

    settings = RunSettings(replace(COMPARE_DEFAULTS, max_tokens=24), ignore_eos=True)
    request = CompareRequest(str(tiny_paths["llama-f32"]), (DraftChoice(NGRAM_MOD, label=NGRAM_MOD),),
                             (Prompt("first", "Once upon a time"), Prompt("again", "Once upon a time")), settings,
                             device="cpu", dtype="float32")
    run = Runner(request, main=tiny_loaded("llama-f32")).run()
    first, again = run.results_of(NGRAM_MOD)
    assert first.summary.n_accepted == 0 < again.summary.n_accepted
    assert all(r.identical for r in run.results_of(NGRAM_MOD))


# --- b: drafting against the same engine's plain decoding --------------------------------------


def test_llama_server_types_bring_its_plain_decoding_along():
    mod = DraftChoice(LLAMA_SERVER, None, "llama-server ngram-mod", server_types="ngram-mod")
    names = [c.name for c in plan_configs([DraftChoice(LEARNING, label=LEARNING), mod])]
    assert names == [NONE, LEARNING, "llama-server plain", "llama-server ngram-mod"]
    plain = DraftChoice(LLAMA_SERVER, None, "llama-server plain")
    assert [c.name for c in plan_configs([mod, plain])] == [NONE, "llama-server ngram-mod", "llama-server plain"]


def test_a_server_row_with_nothing_accepted_is_never_crowned_for_drafting():
    """The walk-through: llama-server ngram-mod accepted 0% of its drafts and ran 1.2x our none.
    With llama-server's plain decoding beside it (Compare runs it along), the 1.2x is llama-server's
    own decoding: that row may be the fastest, said as such; ngram-mod's drafting gained nothing."""
    run = issue60_run()
    line = headline(run)
    assert line == "Fastest: llama-server plain, 1.2x the speed of none: llama-server's own decoding, no drafting"
    assert fastest(run).config == "llama-server plain"
    mod = part_of(run, SERVER_MOD.name)
    assert mod.startswith("llama-server ngram-mod: no draft was accepted: "), mod
    assert "llama-server's plain decoding" in mod
    assert part_of(run, SERVER_PLAIN.name).startswith(
        "llama-server plain: 1.2x the speed of none: llama-server's own decoding, no drafting")
    assert "ngram-mod, 1.2x" not in verdict(run) and "Fastest: llama-server ngram-mod" not in line


def test_without_llama_servers_plain_row_the_engine_cannot_be_told_from_drafting():
    run = issue60_run(with_server_plain=False)
    assert headline(run) == ("No clear winner: plain decoding (llama-server ngram-mod's 1.2x is llama-server's own "
                             "decoding: no draft accepted)")
    assert part_of(run, SERVER_MOD.name).startswith("llama-server ngram-mod: no draft accepted: its 1.2x over none is "
                                                    "llama-server's own decoding, not drafting")
    failed = issue60_run().with_error(SERVER_PLAIN.name, "llama-server could not start")
    failed = replace(failed, results=tuple(r for r in failed.results if r.config != SERVER_PLAIN.name))
    assert headline(failed) == headline(run)  # its plain row failed: the same as not run
    accepting = replace(run, results=tuple(replace(r, summary=replace(r.summary, n_accepted=9))
                                           if r.config == SERVER_MOD.name else r for r in run.results))
    assert "run llama-server's plain decoding beside it to tell them apart" in headline(accepting)
    assert fastest(accepting).drafter == NONE  # never crowned while the two cannot be told apart


def test_a_server_type_that_drafts_right_says_which_part_is_drafting():
    run = made_run({OURS_PLAIN: ([10.0, 10.2, 10.1], 0, 0, None), SERVER_PLAIN: ([12.0, 12.1, 12.2], 0, 0, None),
                    SERVER_MOD: ([15.0, 15.2, 15.1], 30, 20, None)})
    assert headline(run) == ("Fastest: llama-server ngram-mod, 1.5x the speed of none: 1.2x from drafting over "
                             "llama-server's plain decoding, 1.2x from llama-server's own decoding")
    assert part_of(run, SERVER_MOD.name).startswith("llama-server ngram-mod: 1.2x on code, 1.2x on chat over "
                                                    "llama-server's plain decoding")
    choice = fastest(run)
    assert (choice.config, round(choice.drafting, 2), round(choice.engine, 2)) == ("llama-server ngram-mod", 1.25, 1.2)


def test_our_drafter_is_judged_against_our_plain_decoding_whatever_llama_server_does():
    run = issue60_run()
    row = next(r for r in table_rows(run) if r.config == LEARNING and r.category == ALL)
    assert row.gain == row.speedup  # ours: its engine's plain decoding is none
    assert part_of(run, LEARNING).startswith(f"{LEARNING}: 1.01x on code")


# --- c: a draft model that never drafted -------------------------------------------------------


def declined_note() -> str:
    """The schedule's own note for a reply it kept from drafting in every step (a verify costs
    nearly its length here, as on the walk-through's CPU)."""
    schedule = AdaptiveDraftLength(16, verify_cost=lambda n: 0.01 * (1 + 0.9 * (n - 1)) if n > 1 else 0.01,
                                   draft_token_s=0.0065)
    for _ in range(40):
        schedule.update(0, 0, 0.01, n_asked=schedule.length(16))
    return schedule.declined_note()


def test_a_draft_model_that_never_drafted_says_why_it_declined():
    note = declined_note()
    reason = note.split(": ", 1)[1]
    assert note.startswith("drafting declined in all 40 steps") and reason.startswith("a drafted token costs")
    run = made_run({OURS_PLAIN: ([20.0, 20.1, 19.9], 0, 0, None),
                    DRAFT_MODEL: ([19.8, 19.9, 20.0], 0, 0, note)})
    assert part_of(run, DRAFT_05B).startswith(f"{DRAFT_05B}: declined: {reason}")
    assert "nothing accepted" not in verdict(run) and "no draft was accepted" not in verdict(run)
    row = next(r for r in table_rows(run) if r.config == DRAFT_05B and r.category == ALL)
    assert (row.accept_text, row.nothing_drafted) == ("declined", f"declined: {reason}")
    table = format_table(run)
    assert f"# {DRAFT_05B}: declined: {reason}" in table and " declined " in table
    assert headline(run).startswith("No clear winner: plain decoding")
    luckier = made_run({OURS_PLAIN: ([20.0, 20.1, 19.9], 0, 0, None),
                        DRAFT_MODEL: ([22.5, 22.6, 22.4], 0, 0, note)})  # a lead beyond the spreads: not drafting's
    assert headline(luckier) == f"No clear winner: plain decoding ({DRAFT_05B}'s 1.1x is noise: it never drafted)"


def test_the_window_opens_within_its_screen(qtbot, data_dir):
    from app.ui.compare.view import DEFAULT_SIZE, CompareWindow
    from app.ui.common.screen_fit import FRAME_GUESS

    window = CompareWindow([])
    qtbot.addWidget(window)
    room = window.screen().availableGeometry().marginsRemoved(FRAME_GUESS).size()
    assert window.size() == DEFAULT_SIZE.boundedTo(room)


def test_the_declined_row_in_the_window(qtbot, data_dir):
    from PySide6.QtCore import Qt

    from app.ui.compare.view import CompareWindow
    from tests.gui_support import shot

    window = CompareWindow([])
    qtbot.addWidget(window)
    window.resize(1280, 720)
    window.show()
    window.set_run(issue60_run())
    table = window.table
    row = next(i for i in range(table.model().rowCount()) if table.cell_text(i, "Config") == DRAFT_05B)
    assert table.cell_text(row, "Accept") == "declined"
    column = table.table_model.columns().index("Accept")
    tip = table.model().index(row, column).data(Qt.ItemDataRole.ToolTipRole)
    assert tip.startswith("Declined: a drafted token costs 0.65x")
    assert f"{DRAFT_05B}: declined: a drafted token costs" in window.details_label.text()
    shot(window, "60-3-compare-issue-run")


@pytest.mark.parametrize("size", [(1440, 900), (1280, 720)])
def test_the_headline_is_one_line_and_the_progress_text_stays_inside(qtbot, data_dir, size):
    """Item 13: a one-line headline (the rest under Details and in its tooltip); the stage of a
    running comparison under the bar, whole, not cut by it."""
    from app.compare.results import Progress
    from app.ui.compare.view import CompareWindow
    from tests.gui_support import shot

    window = CompareWindow([])
    qtbot.addWidget(window)
    window.resize(*size)
    window.show()
    window.set_run(issue60_run(with_server_plain=False))
    window.resize(*size)  # nothing in a finished run's text holds the window larger than the screen
    assert (window.width(), window.height()) == size
    top = window.fastest_row.label
    assert top.height() < 2 * top.fontMetrics().height() and top.toolTip().startswith(top.full_text())
    assert window.facts_label.height() < 2 * window.facts_label.fontMetrics().height()
    assert all(part in top.toolTip() for part in verdict_parts(window.run))
    stage = "llama-server ngram-mod+ngram-simple · summarise (5/5, run 3/3)"
    window.setup.set_progress(Progress(7, 30, stage))
    bar = window.setup.progress
    assert bar.text() == "7/30 results" and bar.fontMetrics().horizontalAdvance(bar.text()) < bar.width() - 20
    assert window.setup.stage.text() == stage and window.setup.stage.isVisible()
    for widget in (bar, window.setup.stage, window.setup.run_button):  # in sight, under the scrolled choices
        shown = widget.rect().translated(widget.mapTo(window, widget.rect().topLeft()))
        assert window.rect().contains(shown), (widget, shown)
    shot(window, f"60-13-compare-headline-{size[0]}x{size[1]}")
