"""The window behaves as the chat apps people already use (issue 43): Enter sends, the mouse
wheel never changes a setting it only passes over, Regenerate keeps earlier versions, the local
server answers under any model name.

Set SPECULA_SHOTS=/some/folder to save screenshots of the states these tests reach.
"""

from __future__ import annotations

from PySide6.QtCore import QPoint, QPointF, Qt
from PySide6.QtGui import QWheelEvent
from PySide6.QtWidgets import QAbstractSlider, QAbstractSpinBox, QApplication, QComboBox, QScrollBar, QWidget

from app.ui.chat_panel import ChatPanel
from tests.test_gui import data_dir, open_window, shot  # noqa: F401 (data_dir is a fixture)


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


# --- the wheel scrolls panels, never a setting it passes over ---------------------------------

def _value(widget: QWidget):
    return widget.currentIndex() if isinstance(widget, QComboBox) else widget.value()


def _wheel(widget: QWidget, steps: int = -1) -> None:
    """Turn the wheel over the middle of `widget` (steps < 0: towards the user)."""
    centre = QPointF(widget.rect().center())
    event = QWheelEvent(centre, QPointF(widget.mapToGlobal(QPoint(int(centre.x()), int(centre.y())))),
                        QPoint(0, 0), QPoint(0, 120 * steps), Qt.MouseButton.NoButton,
                        Qt.KeyboardModifier.NoModifier, Qt.ScrollPhase.NoScrollPhase, False)
    QApplication.sendEvent(widget, event)


def _settings_controls(root: QWidget) -> list[QWidget]:
    kinds = (QAbstractSpinBox, QAbstractSlider, QComboBox)
    return [w for w in root.findChildren(QWidget)
            if isinstance(w, kinds) and not isinstance(w, QScrollBar) and w.isEnabled()]


def test_the_wheel_changes_no_setting_it_only_passes_over(qtbot, data_dir):
    window = open_window(qtbot)
    window.open_compare()
    controls = _settings_controls(window)
    assert len(controls) >= 10, [type(w).__name__ for w in controls]
    window.panel.input.setFocus()
    for widget in controls:
        before = _value(widget)
        _wheel(widget, -1)
        _wheel(widget, +1)
        _wheel(widget, -1)
        assert _value(widget) == before, f"the wheel changed an unfocused {type(widget).__name__} " \
                                         f"{widget.objectName() or widget.toolTip()[:40]!r}"
        assert widget.focusPolicy() == Qt.FocusPolicy.StrongFocus, "the wheel would give it focus"

    # Once the user has clicked into it (focus), the wheel changes it as usual.
    draft_max = window.gen_form.fields["draft_max"]
    window.activateWindow()
    draft_max.setFocus()
    qtbot.waitUntil(draft_max.hasFocus)
    before = draft_max.value()
    _wheel(draft_max, -1)
    assert draft_max.value() == before - draft_max.singleStep()
