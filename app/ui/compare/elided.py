"""A one-line label that shortens its text to its width: a long verdict or facts line never sets
the window's minimum width, nor wraps into a wall of text; the whole text is in its tooltip."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QResizeEvent
from PySide6.QtWidgets import QLabel, QSizePolicy, QWidget

MIN_WIDTH_PX = 40


class ElidedLabel(QLabel):
    def __init__(self, text: str = "", parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._full = ""
        self.setTextFormat(Qt.TextFormat.PlainText)
        self.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.setMinimumWidth(MIN_WIDTH_PX)
        self.set_full_text(text)

    def set_full_text(self, text: str, tooltip: str | None = None) -> None:
        """Show `text` on one line, cut at its end with "…" where it does not fit; the tooltip is
        `tooltip`, or the whole text."""
        self._full = text
        self.setToolTip(text if tooltip is None else tooltip)
        self._elide()

    def full_text(self) -> str:
        return self._full

    def is_elided(self) -> bool:
        return self.text() != self._full

    def resizeEvent(self, event: QResizeEvent) -> None:  # noqa: N802 (Qt's name)
        super().resizeEvent(event)
        self._elide()

    def _elide(self) -> None:
        width = max(self.contentsRect().width(), MIN_WIDTH_PX)
        self.setText(self.fontMetrics().elidedText(self._full, Qt.TextElideMode.ElideRight, width))
