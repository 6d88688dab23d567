"""While a pair loads (issue 60 item 10): only the welcome card's button that started the load says
"Loading…" (the demo's button read "Loading…" while the pair loaded from the Model tab), and the
load's stage is readable whole under the progress bar (it was cut to "main model: meas…(once per
model)" inside the bar)."""

from __future__ import annotations

from PySide6.QtCore import QObject, Qt, Slot
from PySide6.QtWidgets import QApplication

from app.ui.chat.empty_state import DEMO_BUTTON, LOADING_BUTTON, PAIR_BUTTON
from app.worker.requests import NONE
from tests.gui_support import WAIT_MS, add_models, open_window, shot

STAGE = "main model: measuring llama.cpp's steps here (once per model)"


class CardWatcher(QObject):
    """Reads the welcome card at each of the host's progress events, right after the card's own
    handler (queued slots run in the order they were connected; the window connected first)."""

    def __init__(self, page) -> None:
        super().__init__()
        self.page = page
        self.seen: list[tuple] = []

    @Slot(str, float)
    def look(self, _stage: str, _fraction: float) -> None:
        page = self.page
        self.seen.append((page.demo_button.text(), page.demo_button.isEnabled(), page.pair_button.text(),
                          page.pair_button.isEnabled(), page.status.text()))


def test_a_load_from_the_model_tab_leaves_the_cards_buttons_as_they_are(qtbot, data_dir, tiny_paths):
    window = open_window(qtbot)
    main = tiny_paths["qwen2-f32"]
    add_models(qtbot, window, [main])
    page, picker = window.panel.empty_state, window.picker
    assert window.panel.empty_state_shown()
    assert picker.select_main(str(main)) and picker.select_draft(NONE)
    watcher = CardWatcher(page)
    window.host.loadProgress.connect(watcher.look)
    qtbot.mouseClick(picker.load_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: window.loaded_facts is not None, timeout=WAIT_MS)
    assert watcher.seen
    for demo, demo_enabled, pair, pair_enabled, status in watcher.seen:  # while it loaded
        assert (demo, pair) == (DEMO_BUTTON, PAIR_BUTTON) and not demo_enabled and not pair_enabled
        assert "Loading the chosen pair" in status


def test_the_pair_offers_load_marks_only_its_own_button(qtbot, data_dir):
    window = open_window(qtbot)
    page = window.panel.empty_state
    window.pair_offer.loading.emit("Qwen2.5-Coder 1.5B Instruct (Q4_K_M) + Qwen2.5-Coder 0.5B Instruct (Q4_K_M)")
    assert page.pair_button.text() == LOADING_BUTTON and page.demo_button.text() == DEMO_BUTTON
    assert not page.demo_button.isEnabled() and not page.pair_button.isEnabled()


def test_the_load_stage_is_readable_whole_under_the_bar(qtbot, data_dir):
    window = open_window(qtbot)
    window.resize(1272, 640)  # a 1280x720 screen
    picker = window.picker
    picker.set_loading(True)
    window.host.loadProgress.emit(STAGE, 0.9)
    QApplication.processEvents()
    assert picker.progress.format() == "%p%" and picker.progress.text() == "90%"
    label = picker.state_label
    assert label.text() == STAGE and label.wordWrap() and label.isVisible()
    # Whole within the width it has: one or two lines, never cut.
    assert label.heightForWidth(label.width()) <= 2 * label.fontMetrics().lineSpacing() + 4
    assert picker.progress.toolTip() == STAGE
    shot(window, "60-10-load-stage-1280")
