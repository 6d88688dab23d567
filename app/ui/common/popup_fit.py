"""A combo box's list stays inside its window (issue 60 item 13).

Qt opens a combo box's list as wide as its longest item and moves it only to stay on the screen:
the pair picker's lists, beside the window's right edge, ran past the window (and, with the
window wider than the screen, past the screen). Here each list is narrowed to the window's width
where it is wider, and moved left until it ends at the window's right edge (its items' text is
cut at the end).
"""

from __future__ import annotations

from PySide6.QtCore import QEvent, QObject, QRect, Qt
from PySide6.QtWidgets import QComboBox, QWidget


def within(popup: QRect, bounds: QRect) -> QRect:
    """`popup` no wider than `bounds` and moved sideways to lie inside it (its height and top
    stay: Qt chose them to fit the screen below or above the box)."""
    width = min(popup.width(), bounds.width())
    x = min(max(popup.x(), bounds.x()), bounds.x() + bounds.width() - width)
    return QRect(x, popup.y(), width, popup.height())


class PopupFit(QObject):
    """Event filter on combo boxes' list containers: fitted into the window as they show."""

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:  # noqa: N802 (Qt's name)
        if event.type() == QEvent.Type.Show and isinstance(watched, QWidget):
            combo = watched.parentWidget()
            if combo is not None:
                bounds = combo.window().geometry()  # the window's inside, in screen coordinates
                bounds = bounds.intersected(combo.screen().availableGeometry())
                fitted = within(watched.geometry(), bounds)
                if fitted != watched.geometry():
                    watched.setGeometry(fitted)
        return False


def fit_popups(root: QWidget) -> int:
    """Keep the list of every combo box under `root` inside root's window; returns how many were
    new. Call it again for combo boxes made later: one already fitted is left as it is."""
    fit = root.findChild(PopupFit, "popup_fit", Qt.FindChildOption.FindDirectChildrenOnly)
    if fit is None:
        fit = PopupFit(root)
        fit.setObjectName("popup_fit")
    count = 0
    for combo in root.findChildren(QComboBox):
        if combo.property("popup_fitted"):
            continue
        container = combo.view().parentWidget()  # Qt's list container, a popup window
        if container is not None:
            container.installEventFilter(fit)
            combo.setProperty("popup_fitted", True)
            count += 1
    return count
