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
