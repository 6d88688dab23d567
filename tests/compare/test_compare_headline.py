"""A gain with nothing accepted is noise, not a headline (issue 52 item 8): the Compare verdict
says 'lookup: 1.1x on chat' only where lookup had drafts accepted there."""

from __future__ import annotations

from PySide6.QtCore import Qt

from app.compare.results import ConfigSpec
from app.compare.summary import Row
from app.compare.verdict import _drafting
from app.worker.requests import LOOKUP


def row(category: str, speedup: float, accept_rate: float) -> Row:
    return Row("lookup", category, 2, 128, 50.0 * speedup, speedup, accept_rate, 1.0, 0.1, None, 2, LOOKUP,
               gain=speedup)


def test_a_gain_without_accepted_drafts_is_not_headlined():
    config = ConfigSpec("lookup", LOOKUP)
    rows = [row("code", 1.6, 0.7), row("chat", 1.1, 0.0), row("summary", 0.9, 0.2)]
    line = _drafting(rows, config, row("all", 1.2, 0.5), "none")
    assert line.startswith("1.60x on code") or "on code" in line.split(",")[0], line
    assert "1.10x on chat" not in line and "1.1x on chat" not in line
    assert "nothing accepted on chat (as fast as none)" in line and "slower on summary" in line
    alone = _drafting([row("chat", 1.1, 0.0)], config, row("chat", 1.1, 0.0), "none")
    assert alone == "no draft was accepted: as fast as none at best"


def test_the_compare_header_names_the_model_as_the_library_does(qtbot, data_dir, tiny_paths):
    from tests.ui.test_compare_view import compare_window, set_up, wait_done
    from tests.gui_support import shot

    window = compare_window(qtbot, [tiny_paths["llama-f32"], tiny_paths["llama-other"]])
    set_up(window, tiny_paths, n_predict=8)
    window.setup.run_button.click()
    wait_done(qtbot, window)
    facts = window.facts_label.text()
    assert facts.startswith("llama-f32 on "), facts  # the file's general.name is tiny-llama-F32-seed0
    assert "8 tokens per reply" in facts
    header = window.table.model().headerData(2, Qt.Orientation.Horizontal)
    assert header == "Tokens, all runs"
    shot(window, "52-8-compare-names")
