"""The mouse wheel scrolls the panel it passes over, never a setting on its way.

Qt lets an unfocused spin box, slider or combo box take the wheel (a spin box even takes focus
from it), so scrolling the Model tab turned "Draft max" from 16 to 14. As in browsers and most
settings dialogs, such a control takes the wheel only once it has focus (a click or Tab); until
then the event goes on to the scroll area under it.
"""

from __future__ import annotations

from PySide6.QtCore import QEvent, QObject, Qt
from PySide6.QtWidgets import QAbstractSlider, QAbstractSpinBox, QComboBox, QScrollBar, QWidget

_GUARDED = (QAbstractSpinBox, QAbstractSlider, QComboBox)


class WheelGuard(QObject):
    """Event filter: a wheel event on an unfocused guarded control is passed to its parent."""

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:  # noqa: N802 (Qt's name)
        if event.type() == QEvent.Type.Wheel and isinstance(watched, QWidget) and not watched.hasFocus():
            event.ignore()  # ignored, so Qt offers it to the parent: the panel scrolls
            return True
        return False


def is_guarded_kind(widget: QWidget) -> bool:
    """Whether the wheel would change this widget's value (scroll bars are meant for it)."""
    return isinstance(widget, _GUARDED) and not isinstance(widget, QScrollBar)


def guard_wheel(root: QWidget) -> int:
    """Guard every spin box, slider and combo box under `root` (and root itself); returns how many.

    Focus comes from a click or Tab only (StrongFocus), not from the wheel passing over. Call it
    again for widgets made later: a control already guarded is left as it is.
    """
    guard = root.findChild(WheelGuard, "wheel_guard", Qt.FindChildOption.FindDirectChildrenOnly)
    if guard is None:
        guard = WheelGuard(root)
        guard.setObjectName("wheel_guard")
    count = 0
    for widget in [root, *root.findChildren(QWidget)]:
        if not is_guarded_kind(widget) or widget.property("wheel_guarded"):
            continue
        widget.setFocusPolicy(Qt.FocusPolicy.StrongFocus)
        widget.installEventFilter(guard)
        widget.setProperty("wheel_guarded", True)
        count += 1
    return count
