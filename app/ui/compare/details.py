"""The lines under Compare's headline (every drafter's verdict, the spreads, the change since an
earlier run): wrapped, selectable, as tall as they need up to a cap, then scrolled, so that the
charts keep their room."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QResizeEvent
from PySide6.QtWidgets import QFrame, QScrollArea, QSizePolicy, QWidget

from app.ui.common.style import small_muted_label

MAX_HEIGHT_PX = 150


class DetailsArea(QScrollArea):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.label = small_muted_label("")
        self.label.setTextFormat(Qt.TextFormat.PlainText)
        self.label.setAlignment(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignTop)
        self.setWidget(self.label)
        self.setWidgetResizable(True)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Fixed)

    def set_lines(self, lines: list[str]) -> None:
        self.label.setText("\n".join(lines))
        self._fit()

    def text(self) -> str:
        return self.label.text()

    def resizeEvent(self, event: QResizeEvent) -> None:  # noqa: N802 (Qt's name)
        super().resizeEvent(event)
        self._fit()

    def _fit(self) -> None:
        """As tall as the wrapped text at this width, at most MAX_HEIGHT_PX."""
        width = max(self.viewport().width(), 100)
        self.setFixedHeight(min(self.label.heightForWidth(width) + 2, MAX_HEIGHT_PX))
