"""The compare window, for real: offscreen Qt, tiny real GGUF models through the real loader and
engine on the comparison's worker thread, results saved under the app's data folder.

Set SPECULA_SHOTS=/some/folder to save screenshots of the window after a run.
"""

from __future__ import annotations

import csv
import io

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QImage

from app.compare.results import CANCELLED, COMPLETE, LOOKUP, MODEL, NONE, load_run
from app.compare.verdict import headline, verdict_parts
from app.engine.drafting.kinds import LEARNING
from app.ui.compare.view import CompareWindow, runs_dir
from app.hub.library_entries import FILE, entry_for_file
from tests.gui_support import add_models, open_window, shot  # noqa: F401

WAIT_MS = 120_000
COPY = "The model reads the file and the model writes the file. " * 3


@pytest.fixture(autouse=True)
def one_torch_thread():
    """See tests/compare/test_compare.py: tiny models on a loaded two-core machine run far faster on one."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def foreign(tiny_paths):
    from tests.header_gguf import make_tokens, write_gguf
    from tests.tiny_gguf import VOCAB_SIZE

    # A WordPiece vocabulary: it cannot draft even through text.
    return write_gguf(tiny_paths["llama-f32"].parent / "wordpiece-tokens.gguf", tokens=make_tokens(VOCAB_SIZE, "zz"),
                      vocab_type="bert")


def compare_window(qtbot, paths) -> CompareWindow:
    window = CompareWindow([entry_for_file(p, FILE) for p in paths])
    qtbot.addWidget(window)
    window.resize(1400, 900)
    window.show()
    return window


def set_up(window, tiny_paths, n_predict: int = 24) -> None:
    """none, lookup and the draft model llama-other (the chat's default, ticked at first, unticked)."""
    setup = window.setup
    assert setup.select_main(str(tiny_paths["llama-f32"]))
    assert setup.check_draft(LEARNING, None, checked=False) and setup.check_draft(LOOKUP)
    assert setup.check_draft(MODEL, str(tiny_paths["llama-other"]))
    for category, box in setup.category_boxes.items():
        box.setChecked(category == "chat")
    setup.own_text.setPlainText(COPY)
    setup.n_predict.setValue(n_predict)
    setup.repeats.setValue(2)  # the fewest that show a spread (tests/compare/test_compare_spread.py)
    setup.precision.setCurrentText("float32")


def wait_done(qtbot, window) -> None:
    qtbot.waitUntil(lambda: not window.running, timeout=WAIT_MS)


def test_a_run_fills_the_charts_and_the_table_and_exports(qtbot, data_dir, tiny_paths, foreign, tmp_path):
    window = compare_window(qtbot, [tiny_paths["llama-f32"], tiny_paths["llama-other"], tiny_paths["llama-b"], foreign])
    set_up(window, tiny_paths)
    drafts = dict(window.setup.draft_texts())
    assert drafts["llama-b — text-level (other vocabulary)"] is True  # offered, not checked
    assert drafts["None (plain decoding: the baseline)"] and drafts["Prompt lookup (no draft model)"]
    assert drafts["llama-other"]
    refused = [text for text in drafts if text.startswith("wordpiece-tokens — incompatible: ")]
    assert len(refused) == 1 and drafts[refused[0]] is False  # offered greyed, not runnable
    assert not window.csv_button.isEnabled()  # nothing to export yet

    qtbot.mouseClick(window.setup.run_button, Qt.MouseButton.LeftButton)
    assert window.running and window.setup.cancel_button.isEnabled() and not window.setup.run_button.isEnabled()
    wait_done(qtbot, window)
    assert window.setup.status.text().startswith("Done: saved to"), window.setup.status.text()

    run = window.run
    assert run.status == COMPLETE and len(run.results) == run.n_expected == 12  # 3 drafters, 2 prompts, 2 runs
    assert load_run(window.run_path) == run and window.run_path.parent == runs_dir() == data_dir / "comparisons"
    configs = [NONE, LOOKUP, "llama-other"]
    assert [c.name for c in run.configs] == configs
    assert all(r.identical for r in run.results if r.config != NONE)

    bars = window.charts.bar_heights("tps")
    assert list(bars) == configs and all(len(h) == 3 and min(h) > 0 for h in bars.values())  # chat, own, all
    assert list(window.charts.bar_heights("speedup")) == configs[1:]
    assert set(window.charts.curve_points("speed")) == set(configs)
    assert all(points for points in window.charts.curve_points("speed").values())
    assert set(window.charts.curve_points("positions")) <= set(configs[1:])
    top = window.fastest_row.label
    assert top.full_text() == headline(run) and "\n" not in top.full_text()
    assert top.height() < 2 * top.fontMetrics().height()  # one line, whatever its length
    parts = verdict_parts(run)
    assert parts[0].startswith("lookup:") and parts[1].startswith("llama-other:")
    assert all(part in window.details_label.text() for part in parts)
    assert not window.details.isVisible()  # until asked for
    qtbot.mouseClick(window.fastest_row.details_button, Qt.MouseButton.LeftButton)
    assert window.details.isVisible()

    table = window.table
    assert table.model().rowCount() == 9
    column = table.table_model.columns().index("tok/s")
    table.sortByColumn(column, Qt.SortOrder.DescendingOrder)
    speeds = [float(table.cell_text(row, "tok/s")) for row in range(9)]
    assert speeds == sorted(speeds, reverse=True)
    # Why, per row: the acceptance each adaptive drafter's drafts need here, from its schedule's prices
    why = table.table_model.columns().index("Why")
    for row in range(9):
        config, text = table.cell_text(row, "Config"), table.cell_text(row, "Why")
        if config == NONE:
            assert text == "-"
        else:
            assert text.startswith(("pays above", "no draft pays")), text
            tip = table.model().index(row, why).data(Qt.ItemDataRole.ToolTipRole)
            assert "a verify of 4 drafts" in tip and tip.endswith(".")
    shot(window, "compare-run")

    assert window.csv_button.isEnabled() and window.png_button.isEnabled()
    assert window.export("csv", tmp_path / "t.csv") and window.export("json", tmp_path / "t.json")
    assert window.export("png", tmp_path / "t.png")
    rows = list(csv.DictReader(io.StringIO((tmp_path / "t.csv").read_text())))
    assert len(rows) == 9 and {r["config"] for r in rows} == set(configs)
    assert load_run(tmp_path / "t.json") == run
    image = QImage(str(tmp_path / "t.png"))
    assert not image.isNull() and image.width() > 600 and image.height() > 400
    assert not window.export("csv", tmp_path / "no-such-folder" / "t.csv")  # a line, not a crash
    assert "cannot write" in window.setup.status.text()


def test_cancel_keeps_the_finished_results_which_reopen_and_compare(qtbot, data_dir, tiny_paths):
    window = compare_window(qtbot, [tiny_paths["llama-f32"], tiny_paths["llama-other"]])
    set_up(window, tiny_paths, n_predict=48)
    qtbot.mouseClick(window.setup.run_button, Qt.MouseButton.LeftButton)
    # Cancel as soon as the first result is in: the worker stops after its current step.
    window.task.worker.updated.connect(lambda run: window.cancel() if run.results else None)
    wait_done(qtbot, window)
    run = window.run
    assert run.status == CANCELLED, window.setup.status.text()
    assert 1 <= len(run.results) < run.n_expected
    assert window.setup.status.text().startswith(f"Cancelled: {len(run.results)} of 12 results kept")
    assert window.setup.run_button.isEnabled() and not window.setup.cancel_button.isEnabled()
    saved = window.run_path
    assert load_run(saved) == run
    shot(window, "compare-cancelled")

    # Reopen it, then compare with it: the table gains the change columns.
    window.set_run(None)
    assert window.open_run(saved) and window.run == run
    assert window.compare_with(saved)
    assert "Δ tok/s" in window.table.table_model.columns()
    assert window.table.cell_text(0, "Δ tok/s") == "+0%"
    assert "tokens/s vs" in window.details_label.text() and window.details.isVisible()
    assert not window.open_run(saved.with_name("missing.json"))
    assert "no such file" in window.setup.status.text()


def test_view_menu_opens_it_with_the_library_and_closing_stops_a_run(qtbot, data_dir, tiny_paths):
    main_window = open_window(qtbot)
    add_models(qtbot, main_window, [tiny_paths["llama-f32"], tiny_paths["llama-other"]])
    action = next(a for menu in main_window.menuBar().actions() for a in menu.menu().actions()
                  if a.text() == "&Compare drafts…")
    assert main_window.picker.select_main(str(tiny_paths["llama-f32"]))
    action.trigger()
    window = main_window.compare_window
    assert window.isVisible() and window.setup.main_path() == str(tiny_paths["llama-f32"])
    assert ("llama-other", True) in window.setup.draft_texts()

    set_up(window, tiny_paths, n_predict=400)
    qtbot.mouseClick(window.setup.run_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: window.run is not None and bool(window.run.results), timeout=WAIT_MS)
    main_window.close()  # cancels the run, waits for its step, keeps what finished
    assert window.task is None and not window.running
    saved = load_run(window.run_path)
    assert saved.status == CANCELLED and 1 <= len(saved.results) < saved.n_expected


def test_llama_servers_own_speculation_runs_beside_ours_in_the_window(qtbot, data_dir, tiny_paths):
    """Compare across engines from the window: llama-server's plain decoding and its ngram-mod,
    ticked like any drafter, run on the same prompts and land in the table and charts."""
    from app.compare.results import LLAMA_SERVER
    from tests.engine.test_llama_server import _require_server

    _require_server()
    window = compare_window(qtbot, [tiny_paths["llama-f32"]])
    setup = window.setup
    assert setup.select_main(str(tiny_paths["llama-f32"]))
    assert setup.check_draft(LEARNING, None, checked=False)
    assert setup.check_draft(LLAMA_SERVER, "ngram-mod")  # llama-server's plain decoding comes with it
    for category, box in setup.category_boxes.items():
        box.setChecked(False)
    setup.own_text.setPlainText(COPY)
    setup.n_predict.setValue(16)
    setup.repeats.setValue(1)
    qtbot.mouseClick(setup.run_button, Qt.MouseButton.LeftButton)
    wait_done(qtbot, window)
    run = window.run
    assert run.status == COMPLETE and not run.errors, run.errors
    configs = [NONE, "llama-server plain", "llama-server ngram-mod"]
    assert [c.name for c in run.configs] == configs
    assert all(r.identical for r in run.results[1:])  # greedy: one reply on every engine
    assert list(window.charts.bar_heights("tps")) == configs
    assert window.table.model().rowCount() == 3
    shot(window, "compare-llama-server")


def test_a_comparison_saved_before_the_version_2_format_opens_in_the_window(qtbot, data_dir):
    """tests/data/compare_v1.json, written by `specula compare` before issue 49 item 5: the window
    opens it (converted on load) with its table, verdict and facts as they were."""
    from pathlib import Path

    window = compare_window(qtbot, [])
    assert window.open_run(Path(__file__).resolve().parents[1] / "data" / "compare_v1.json")
    assert window.table.cell_text(0, "Config") == "none" and window.table.cell_text(1, "tok/s") == "72.2"
    assert window.details_label.text().split("\n")[1].startswith("lookup: slower than none")
    assert "greedy · 6 tokens per reply" in window.facts_label.text()
    shot(window, "compare-v1-file-opened")
