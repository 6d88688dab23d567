"""Small shared touches of style that follow the palette (light and dark themes alike)."""

from __future__ import annotations

from PySide6.QtGui import QPalette
from PySide6.QtWidgets import QLabel, QWidget


def mute(widget: QWidget, alpha: float = 0.68) -> None:
    """Secondary text: the theme's text colour, partly transparent (readable in both themes,
    unlike the palette's 'mid' grey)."""
    palette = widget.palette()
    colour = palette.color(QPalette.ColorRole.WindowText)
    colour.setAlphaF(alpha)
    palette.setColor(QPalette.ColorRole.WindowText, colour)
    widget.setPalette(palette)


def small_muted_label(text: str = "", selectable: bool = True) -> QLabel:
    label = QLabel(text)
    label.setWordWrap(True)
    font = label.font()
    font.setPointSizeF(font.pointSizeF() * 0.9)
    label.setFont(font)
    mute(label)
    if selectable:
        from PySide6.QtCore import Qt

        label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
    return label


def scrolling(body: QWidget) -> QWidget:
    """`body` in a frameless scroll area: whatever text it gains, its minimum height stays a few
    pixels, so a panel never grows the window past the screen (it scrolls instead)."""
    from PySide6.QtWidgets import QFrame, QScrollArea

    area = QScrollArea()
    area.setWidgetResizable(True)
    area.setFrameShape(QFrame.Shape.NoFrame)
    area.setWidget(body)
    return area
