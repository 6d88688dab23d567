"""A top-level window that fits the screen it opens on (issue 60 item 1): a new window takes its
default size or the screen's available area, whichever is smaller, and a saved geometry is
clipped to the screen it is restored on (a geometry saved on a larger monitor would otherwise
put Send below the bottom of a 1280x720 laptop screen).

Before a window is shown its frame (title bar, borders) is unknown: room is left for a usual
one, and once shown, a window still at the size given here is fitted again with its real frame.
"""

from __future__ import annotations

from PySide6.QtCore import QByteArray, QMargins, QRect, QSize
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QWidget

# A title bar and borders as desktops draw them (openbox: 2 + 23 px; Windows: 8 px invisible
# borders and a 31 px title bar), left free until the window manager says what it draws.
FRAME_GUESS = QMargins(8, 40, 8, 8)


def available_area(window: QWidget) -> QRect:
    """The available geometry (the screen less panels and docks) of the screen under the
    window's centre, or of the screen it belongs to."""
    screen = QGuiApplication.screenAt(window.geometry().center()) or window.screen()
    return screen.availableGeometry()


def frame_margins(window: QWidget) -> QMargins:
    """The frame the window manager draws around `window`, or a usual one before it is known."""
    frame, inner = window.frameGeometry(), window.geometry()
    if frame == inner:
        return FRAME_GUESS
    return QMargins(inner.left() - frame.left(), inner.top() - frame.top(),
                    frame.right() - inner.right(), frame.bottom() - inner.bottom())


def fitted(geometry: QRect, area: QRect, frame: QMargins) -> QRect:
    """`geometry` (the window's inside) shrunk so that it and its frame fit `area`, and moved
    just as far as it must to lie inside it."""
    room = area.marginsRemoved(frame)
    size = geometry.size().boundedTo(room.size())
    x = min(max(geometry.x(), room.x()), room.x() + room.width() - size.width())
    y = min(max(geometry.y(), room.y()), room.y() + room.height() - size.height())
    return QRect(x, y, size.width(), size.height())


def place_new(window: QWidget, default: QSize, area: QRect | None = None) -> QSize:
    """A window without a saved geometry: its default size where the screen has room, less where
    not. Only the size is set: the window manager places the window. Returns the size given."""
    area = available_area(window) if area is None else area
    size = default.boundedTo(area.marginsRemoved(FRAME_GUESS).size())
    window.resize(size)
    return size


def restore_within(window: QWidget, saved: QByteArray, area: QRect | None = None) -> QSize | None:
    """Restore a saved geometry, clipped to the screen it lands on; the size given, or None where
    nothing could be restored (or the window is maximized, which fits by itself)."""
    if not window.restoreGeometry(saved):
        return None
    if window.isMaximized() or window.isFullScreen():
        return None
    area = available_area(window) if area is None else area
    window.setGeometry(fitted(window.geometry(), area, frame_margins(window)))
    return window.size()


def refit_shown(window: QWidget, given: QSize | None, area: QRect | None = None) -> None:
    """Once shown: if the window is still the size it was given here (the user has not resized
    it) and its real frame runs past the screen, fit it again with that frame."""
    if given is None or window.size() != given or window.isMaximized() or window.isFullScreen():
        return
    area = available_area(window) if area is None else area
    if area.contains(window.frameGeometry()):
        return
    window.setGeometry(fitted(window.geometry(), area, frame_margins(window)))
