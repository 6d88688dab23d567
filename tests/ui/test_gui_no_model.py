"""After a restart nothing is loaded (issue 52 item 11): the reopened chat says so over the message
box and offers to load the last pair; Send and Regenerate, which cannot work, are disabled (Enter
still says why in the status bar)."""

from __future__ import annotations

from PySide6.QtCore import Qt

from app.worker.requests import LOOKUP
from tests.gui_support import WAIT_MS, add_models, load_pair, open_window, send, shot  # noqa: F401


def test_a_restart_offers_the_last_pair_and_disables_what_cannot_work(qtbot, data_dir, tiny_paths):
    main = tiny_paths["llama-f32"]
    window = open_window(qtbot)
    add_models(qtbot, window, [main])
    load_pair(qtbot, window, main, LOOKUP)
    send(qtbot, window, "Hello there")
    assert window.panel.no_model_bar.isHidden()
    window.close()

    again = open_window(qtbot)
    panel = again.panel
    qtbot.waitUntil(lambda: panel.load_last_button.isVisible(), timeout=WAIT_MS)
    assert again.loaded_facts is None and not panel.empty_state_shown()
    assert panel.no_model_bar.isVisible()
    assert panel.load_last_button.text() == "Load llama-f32 + prompt lookup"
    assert not panel.send_button.isEnabled() and not panel.regenerate_button.isEnabled()
    shot(again, "52-11-restart-no-model")

    panel.input.setPlainText("Still there?")
    qtbot.keyClick(panel.input, Qt.Key.Key_Return)
    assert "no model is loaded" in again.statusBar().currentMessage()

    qtbot.mouseClick(panel.load_last_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: again.loaded_facts is not None, timeout=WAIT_MS)
    assert again.loaded_facts.main_path == str(main)
    qtbot.waitUntil(lambda: panel.no_model_bar.isHidden(), timeout=WAIT_MS)
    assert panel.send_button.isEnabled() and panel.regenerate_button.isEnabled()
