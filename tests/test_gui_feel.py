"""The window behaves as the chat apps people already use (issue 43): Enter sends, the mouse
wheel never changes a setting it only passes over, Regenerate keeps earlier versions, the local
server answers under any model name.

Set SPECULA_SHOTS=/some/folder to save screenshots of the states these tests reach.
"""

from __future__ import annotations

from PySide6.QtCore import Qt

from app.ui.chat_panel import ChatPanel


# --- Enter sends, Shift+Enter is a new line ---------------------------------------------------

def test_enter_sends_and_shift_enter_is_a_new_line(qtbot):
    panel = ChatPanel()
    qtbot.addWidget(panel)
    sent: list[str] = []
    panel.sendRequested.connect(sent.append)
    panel.input.setFocus()
    qtbot.keyClicks(panel.input, "first line")
    qtbot.keyClick(panel.input, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)
    qtbot.keyClicks(panel.input, "second line")
    assert sent == [], "Shift+Enter sent the message"
    assert panel.input.toPlainText() == "first line\nsecond line"

    qtbot.keyClick(panel.input, Qt.Key.Key_Return)
    assert sent == ["first line\nsecond line"], "Enter did not send"
    qtbot.keyClick(panel.input, Qt.Key.Key_Enter, Qt.KeyboardModifier.KeypadModifier)
    qtbot.keyClick(panel.input, Qt.Key.Key_Return, Qt.KeyboardModifier.ControlModifier)
    assert len(sent) == 3, "keypad Enter and Ctrl+Enter must send too"
    assert "\n" not in panel.input.toPlainText().replace("first line\nsecond line", ""), \
        "Enter added a newline to the box"


def test_enter_on_an_empty_box_sends_nothing(qtbot):
    panel = ChatPanel()
    qtbot.addWidget(panel)
    sent: list[str] = []
    panel.sendRequested.connect(sent.append)
    qtbot.keyClick(panel.input, Qt.Key.Key_Return)
    assert sent == [] and panel.input.toPlainText() == ""
