"""Nothing is cut mid-word without a way to read it (issue 52 item 9): lists elide in the middle
with the whole text in a tooltip, the picker's combo boxes carry their whole current text in
their tooltips, and Discover's search hint fits its box."""

from __future__ import annotations

from PySide6.QtCore import Qt

from app.ui.common.elide import ModelNameDelegate, fit_text
from app.ui.compare.view import CompareWindow
from app.hub.library_entries import FILE, entry_for_file
from app.worker.requests import MODEL
from tests.gui_support import add_models, open_window, shot  # noqa: F401


def test_long_names_can_be_read_whole(qtbot, data_dir, tiny_paths):
    window = open_window(qtbot)
    main = tiny_paths["llama-f32"]
    # The same weights in another file (no chat template): a byte copy would be listed once (item 5).
    copy = tiny_paths["llama-notemplate"]
    add_models(qtbot, window, [main, copy, tiny_paths["llama-b"]])
    picker = window.picker
    assert picker.select_main(str(main)) and picker.select_draft(MODEL, str(copy))
    title = picker.draft_combo.currentText()
    assert title.endswith("same weights, 1x cost") and picker.draft_combo.toolTip().startswith(title + "\n")
    assert picker.main_combo.toolTip().startswith(picker.main_combo.currentText())

    # Model and repository names are shortened by what tells them apart (issue 60 item 8), the
    # whole name in the tooltip; other columns elide in the middle.
    for tree in (window.library.tree, window.discover.repos):
        delegate = tree.itemDelegateForColumn(0)
        assert isinstance(delegate, ModelNameDelegate)
        metrics = tree.fontMetrics()
        names = ["FAKEORG/qwen2.5-coder-1.5b-instruct-q4_k_m-GGUF", "FAKEORG/qwen2.5-coder-0.5b-instruct-q4_k_m-GGUF"]
        shown = [fit_text(n, metrics, 160, n, names) for n in names]
        assert shown[0] != shown[1] and "1.5b" in shown[0] and "0.5b" in shown[1], shown
    assert window.discover.files.textElideMode() == Qt.TextElideMode.ElideMiddle
    query = window.discover.query
    window.models_tabs.setCurrentWidget(window.discover)
    qtbot.waitUntil(lambda: query.isVisible())
    hint = query.fontMetrics().horizontalAdvance(query.placeholderText())
    assert hint < query.width() - 30, (hint, query.width())  # room for the clear button
    shot(window, "52-9-whole-text")

    compare = CompareWindow([entry_for_file(p, FILE) for p in (main, tiny_paths["llama-b"])])
    qtbot.addWidget(compare)
    assert compare.setup.select_main(str(main))
    drafts = compare.setup.drafts
    assert drafts.textElideMode() == Qt.TextElideMode.ElideMiddle
    texts = [drafts.item(i) for i in range(drafts.count())]
    assert texts and all(item.toolTip().startswith(item.text()) for item in texts)


def test_plain_words_on_screen_the_exact_term_in_the_tooltip(qapp):
    """Issue 52 item 10: Compare's header says what a column counts in plain words, its tooltip
    the term a user may know from llama.cpp (TTFT, mean accepted length, RSS)."""
    from PySide6.QtCore import Qt as _Qt

    from app.ui.compare.table import COLUMNS, CompareTableModel

    model = CompareTableModel()
    shown = {model.headerData(i, _Qt.Orientation.Horizontal): model.headerData(i, _Qt.Orientation.Horizontal,
                                                                               _Qt.ItemDataRole.ToolTipRole)
             for i in range(len(COLUMNS))}
    assert not {"TTFT", "Acc/step", "Peak RSS"} & set(shown)
    assert shown["First token"].startswith("TTFT") and "RSS" in shown["Peak memory"]
    assert "Mean accepted length" in shown["Accepted per step"] and "every repeat" in shown["Tokens, all runs"]
