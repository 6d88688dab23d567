"""What a person types is shown as typed (issue 52 items 2 and 6): the lines of a message sent
with Shift+Enter stay lines in the "You" bubble, and the message box's hint follows the plain
completion toggle at once."""

from __future__ import annotations

from tests.gui_support import GREEDY, add_models, load_pair, open_window, send, shot, visible_text  # noqa: F401


def test_the_lines_of_a_message_stay_lines(qtbot, data_dir, tiny_paths):
    window = open_window(qtbot)
    add_models(qtbot, window, [tiny_paths["llama-f32"]])
    load_pair(qtbot, window, tiny_paths["llama-f32"])
    send(qtbot, window, "first line\nsecond line\n\n* not a list", GREEDY)
    assert "first line\nsecond line\n\n* not a list" in visible_text(window)
    shot(window, "52-2-typed-lines")


def painted(window, widget):
    """What the screen shows of `widget` now (the window's backing store, not a fresh render:
    a hint changed without a repaint still shows the old one there)."""
    from PySide6.QtCore import QPoint, QRect
    from PySide6.QtWidgets import QApplication

    QApplication.processEvents()
    corner = widget.mapTo(window, QPoint(0, 0))
    screen = window.screen().grabWindow(window.winId())
    return screen.copy(QRect(corner, widget.size())).toImage()


def test_the_hint_follows_plain_completion_at_once(qtbot, data_dir, tiny_paths):
    from app.ui.chat.panel import CHAT_PLACEHOLDER, PLAIN_PLACEHOLDER

    window = open_window(qtbot)
    base = tiny_paths["llama-notemplate"]  # no chat template: a base model
    add_models(qtbot, window, [base, tiny_paths["llama-f32"]])
    load_pair(qtbot, window, base)
    panel = window.panel
    assert panel.plain_toggle.isChecked()
    assert panel.input.placeholderText() == PLAIN_PLACEHOLDER
    shot(panel.input, "52-6-hint-base-model")
    shown = painted(window, panel.input)
    panel.plain_toggle.setChecked(False)
    assert panel.input.placeholderText() == CHAT_PLACEHOLDER
    assert painted(window, panel.input) != shown, "the box still shows the plain completion hint"
    load_pair(qtbot, window, tiny_paths["llama-f32"])
    assert not panel.plain_toggle.isChecked() and panel.input.placeholderText() == CHAT_PLACEHOLDER
