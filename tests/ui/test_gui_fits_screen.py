"""The window never grows past the screen (issue 52 item 1): after each state that brings long
text (a finished download, a long error, a long plan line, a finished comparison), the main window
and the Compare window still fit a 1366x768 and a 1440x900 screen.

A layout grows a top-level window when its minimum size passes the window's size: resizing the
window to each screen's size and reading its frame back shows whether anything forces it larger.
"""

from __future__ import annotations

from PySide6.QtWidgets import QApplication

from tests.hf_server import REPO_MID, fake_hub, hub, hub_files  # noqa: F401 (fixtures)
from tests.ui.test_compare_view import compare_window, one_torch_thread, set_up, wait_done  # noqa: F401
from tests.gui_support import WAIT_MS, open_window, shot  # noqa: F401
from tests.ui.test_gui_discover import browse

SCREENS = [(1366, 768), (1440, 900)]
# What a desktop takes from a screen's height: a panel or task bar and the window's title bar.
DESKTOP_CHROME_PX = 72
LONG = ("the model could not be loaded because " + "a very long reason that goes on and on " * 40).strip()


def assert_fits(window, state: str) -> None:
    for width, height in SCREENS:
        frame_w = window.frameGeometry().width() - window.width()  # the platform's frame
        frame_h = window.frameGeometry().height() - window.height()
        room_w, room_h = width - frame_w, height - frame_h - DESKTOP_CHROME_PX
        window.resize(room_w, room_h)
        QApplication.processEvents()
        assert window.width() <= room_w and window.height() <= room_h, (
            f"after {state}: the window is {window.width()}x{window.height()} where a {width}x{height} "
            f"screen leaves {room_w}x{room_h} (its minimum: {window.minimumSizeHint().width()}x"
            f"{window.minimumSizeHint().height()})")


def test_the_window_fits_the_screen_after_long_states(qtbot, hub, tmp_path, monkeypatch, hub_files):
    monkeypatch.setenv("SPECULA_DATA_DIR", str(tmp_path / "specula-data"))
    window = open_window(qtbot)
    assert_fits(window, "start")

    window.models_tabs.setCurrentWidget(window.discover)
    panel = window.discover
    browse(qtbot, panel, REPO_MID, "Tiny-Llama-2L-Q8_0.gguf")
    with qtbot.waitSignal(panel.downloaded, timeout=WAIT_MS):
        panel.download_button.click()
    assert_fits(window, "a finished download")
    shot(window, "52-1-download-done")
    window.models_tabs.setCurrentIndex(0)
    assert_fits(window, "a finished download, back on the Model tab")

    window.picker.set_failed(LONG)
    window.show_message(LONG)
    assert_fits(window, "a long load error")
    window.picker.plan_label.setText("Main model: " + "32 of 32 layers on the GPU, the rest on the CPU · " * 8)
    assert_fits(window, "a long plan line")
    shot(window, "52-1-long-error-and-plan")


def test_the_compare_window_fits_the_screen_when_finished(qtbot, data_dir, tiny_paths):
    window = compare_window(qtbot, [tiny_paths["llama-f32"], tiny_paths["llama-other"]])
    set_up(window, tiny_paths, n_predict=8)
    window.setup.run_button.click()
    wait_done(qtbot, window)
    assert_fits(window, "a finished comparison")
    shot(window, "52-1-compare-done")
