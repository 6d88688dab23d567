"""Two repositories that differ only in the middle of their names stay apart when cut to a width
(issue 60 item 8): "FAKEORG/qwen2.5-...ruct-q4_k_m-GGUF" read the same for the 1.5B and the 0.5B,
and the Library showed "FA...M)" for both. The organisation and the shared words go first; the
size and the quantization stay; the whole name is in the tooltip."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication

from app.ui.common.format import short_model_name
from tests.gui_support import open_window, shot
from tests.ui.test_gui_fits_screen import LONG_DRAFT, LONG_MAIN, long_named_pair

MAIN, DRAFT = f"{LONG_MAIN} (Q4_K_M)", f"{LONG_DRAFT} (Q4_K_M)"


def test_short_names_keep_what_tells_two_sizes_apart():
    for room in range(len(MAIN), 5, -1):
        def fits(text: str) -> bool:
            return len(text) <= room

        main, draft = short_model_name(MAIN, fits, [DRAFT]), short_model_name(DRAFT, fits, [MAIN])
        assert fits(main) and fits(draft), (room, main, draft)
        assert main != draft and "1.5b" in main and "0.5b" in draft, (room, main, draft)
        if room >= len("…1.5b… (Q4_K_M)"):
            assert main.endswith("(Q4_K_M)"), (room, main)  # the quantization goes last
    fits_30 = lambda text: len(text) <= 30  # noqa: E731
    assert short_model_name(MAIN, fits_30, [DRAFT]) == "qwen2.5-coder-1.5b… (Q4_K_M)"
    # Alone (a status line, a button): the family name stays with the size.
    assert short_model_name(MAIN, lambda text: len(text) <= 24) == "qwen2.5…1.5b… (Q4_K_M)"
    # Two organisations' builds of one model: the organisation is what tells them apart.
    other = "someone/qwen2.5-coder-1.5b-instruct-q4_k_m-GGUF (Q4_K_M)"
    assert short_model_name(MAIN, lambda text: len(text) <= 44, [other]).startswith("FAKEORG/")


def test_the_library_shows_the_two_repositories_apart(qtbot, data_dir, tiny_paths):
    from huggingface_hub import constants

    long_named_pair(Path(constants.HF_HUB_CACHE), tiny_paths)
    window = open_window(qtbot)
    window.resize(1272, 640)  # a 1280x720 screen
    window.models_tabs.setCurrentWidget(window.library)
    QApplication.processEvents()
    tree = window.library.tree
    rows = {tree.topLevelItem(i).text(0): tree.topLevelItem(i) for i in range(tree.topLevelItemCount())}
    assert MAIN in rows and DRAFT in rows
    delegate = tree.itemDelegateForColumn(0)
    metrics = tree.fontMetrics()
    width = tree.columnWidth(0) - 12  # the cell's text room, less the item's margins
    main, draft = delegate.shown(MAIN, metrics, width), delegate.shown(DRAFT, metrics, width)
    assert metrics.horizontalAdvance(MAIN) > width, "the column is wide enough for the whole name"
    assert main != draft and "1.5b" in main and "0.5b" in draft, (main, draft)
    # What a cut in the middle of the same width shows: one text for both.
    middle = [metrics.elidedText(n, Qt.TextElideMode.ElideMiddle, width) for n in (MAIN, DRAFT)]
    assert middle[0] == middle[1]
    assert MAIN in rows[MAIN].toolTip(0)
    shot(window, "60-8-library-names-1280")
