"""The main window's share of issue 60 item 13: a status-bar message is never cut by the "what
runs" label beside it (the label yields its width while a message needs it), and a combo box's
list never runs past its window's edge."""

from __future__ import annotations

from PySide6.QtWidgets import QApplication, QComboBox, QHBoxLayout, QWidget

from app.ui.shell.main_window import PAIR_LABEL_MAX_PX
from app.ui.common.popup_fit import fit_popups
from tests.gui_support import add_models, load_pair, open_window, shot

MESSAGE = ("drafting off (0.0 s); qwen2.5-coder-1.5b-instruct-q4_k_m-a-model-with-a-long-file-name (F32) "
           "stayed loaded, and this message goes on a little longer than half the bar")


def test_a_message_gets_the_room_it_needs_beside_what_runs(qtbot, data_dir, tiny_paths, tmp_path):
    long_file = tmp_path / "qwen2.5-coder-1.5b-instruct-q4_k_m-a-model-with-a-long-file-name.gguf"
    long_file.write_bytes(tiny_paths["qwen2-f32"].read_bytes())
    window = open_window(qtbot)
    add_models(qtbot, window, [long_file])
    load_pair(qtbot, window, long_file)
    window.resize(1272, 640)  # a 1280x720 screen
    QApplication.processEvents()
    label, bar = window.pair_label, window.statusBar()
    assert label.isVisible() and label.width() <= PAIR_LABEL_MAX_PX and "1.5b" in label.text()
    assert long_file.stem in label.toolTip()

    window.show_message(MESSAGE)
    QApplication.processEvents()
    needed = bar.fontMetrics().horizontalAdvance(MESSAGE)
    assert needed > bar.width() - PAIR_LABEL_MAX_PX - 24, "the message would fit beside a full-width label"
    assert label.isHidden() or label.geometry().left() >= needed + 8, (label.geometry(), needed)
    shot(window, "60-13-message-beside-what-runs")

    bar.clearMessage()  # the message's time is up: the label has its width again
    QApplication.processEvents()
    assert label.isVisible() and label.text() and label.width() <= PAIR_LABEL_MAX_PX


def test_a_combo_boxs_list_stays_inside_its_window(qtbot):
    window = QWidget()
    qtbot.addWidget(window)
    row = QHBoxLayout(window)
    row.addStretch(1)
    combo = QComboBox()
    combo.addItems(["short", "an item far wider than the window it opens in " * 6])
    # As the pair picker's lists: the box as wide as its panel, its list as wide as its longest item.
    combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
    combo.setMinimumContentsLength(12)
    row.addWidget(combo)
    window.setGeometry(120, 100, 320, 80)  # on the 800x800 offscreen screen, with room either side
    window.show()
    qtbot.waitExposed(window)
    assert fit_popups(window) == 1
    combo.showPopup()
    popup = combo.view().parentWidget()
    qtbot.waitUntil(popup.isVisible)
    inside = window.geometry()
    assert inside.width() == 320 and popup.width() > 0
    assert inside.left() <= popup.geometry().left() and popup.geometry().right() <= inside.right(), (
        popup.geometry(), inside)
    combo.hidePopup()


def test_the_main_windows_combo_boxes_are_all_fitted(qtbot, data_dir):
    window = open_window(qtbot)
    combos = window.findChildren(QComboBox)
    assert combos and all(combo.property("popup_fitted") for combo in combos)
