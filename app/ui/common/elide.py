"""Text cut to the width it gets without losing what tells it apart: a model's name is shortened
first (app.ui.common.format.short_model_name: its organisation and shared words go, its size and
quantization stay), the rest is cut at the end; the whole text stays in a tooltip.

A widget sized by its text set the window's minimum width: a button naming a model with a long
repository name made the window 1629 px wide on a 1440 px screen (issue 60 item 1). These widgets
ask for their whole text's width but accept any.
"""

from __future__ import annotations

from typing import Callable, Iterable

from PySide6.QtCore import QModelIndex, QSize, Qt, QTimer
from PySide6.QtGui import QFontMetrics, QPainter, QResizeEvent, QShowEvent
from PySide6.QtWidgets import (
    QApplication,
    QLabel,
    QPushButton,
    QSizePolicy,
    QStyle,
    QStyledItemDelegate,
    QStyleOptionButton,
    QStyleOptionViewItem,
    QWidget,
)

from app.ui.common.format import short_model_name

MIN_TEXT_CHARS = 8  # what an elided widget still shows: a few letters and the ellipsis


def fit_text(text: str, metrics: QFontMetrics, width: int, name: str | None = None,
             others: Iterable[str] = ()) -> str:
    """`text` as it fits `width` pixels: `name` (a model's title inside it) shortened first,
    told apart from `others` (within a longer text: to half the width at least, and never below
    its distinguishing words); then the end cut."""
    def fits(candidate: str) -> bool:
        return metrics.horizontalAdvance(candidate) <= width

    if fits(text):
        return text
    if name and name in text:
        # Within a longer text the name keeps at least half the width: the rest is cut after it.
        rest = metrics.horizontalAdvance(text) - metrics.horizontalAdvance(name)
        budget = width if text == name else max(width - rest, width // 2)
        shorter = short_model_name(name, lambda short: metrics.horizontalAdvance(short) <= budget, others,
                                   cut_words=text == name)
        text = text.replace(name, shorter, 1)
        if fits(text):
            return text
    return metrics.elidedText(text, Qt.TextElideMode.ElideRight, max(width, 0))


class ElidedButton(QPushButton):
    """A push button whose text never sets its minimum width: it asks for room for its whole
    text, shows what fits (a model's name shortened first) and the whole text in its tooltip."""

    def __init__(self, text: str = "", parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._full, self._name, self._tip = "", None, ""
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Fixed)
        self.set_full_text(text)

    def set_full_text(self, text: str, name: str | None = None, tip: str = "") -> None:
        """`name`: the model's title inside `text`, shortened first; `tip`: the tooltip (the whole
        text when it is empty and the text does not fit)."""
        self._full, self._name, self._tip = text, name, tip
        self._fit_when_laid_out()
        self.updateGeometry()

    def full_text(self) -> str:
        return self._full

    def sizeHint(self) -> QSize:  # noqa: N802 (Qt's name)
        hint = super().sizeHint()
        return QSize(max(hint.width(), self._chrome() + self.fontMetrics().horizontalAdvance(self._full)), hint.height())

    def minimumSizeHint(self) -> QSize:  # noqa: N802 (Qt's name)
        hint = super().sizeHint()
        least = self._chrome() + self.fontMetrics().horizontalAdvance("M" * MIN_TEXT_CHARS)
        return QSize(min(self.sizeHint().width(), least), hint.height())

    def resizeEvent(self, event: QResizeEvent) -> None:  # noqa: N802 (Qt's name)
        super().resizeEvent(event)
        self._show_fitted()

    def showEvent(self, event: QShowEvent) -> None:  # noqa: N802 (Qt's name)
        super().showEvent(event)
        self._fit_when_laid_out()

    def _fit_when_laid_out(self) -> None:
        """A new text or a button just shown has the width of before, which its layout is about
        to change: the whole text until then (a resize, or the next turn of the event loop)."""
        if self.text() != self._full:
            super().setText(self._full)
        self.setToolTip(self._tip)
        QTimer.singleShot(0, self, self._show_fitted)

    def _chrome(self) -> int:
        """The button's width around its text (frame and padding), asked of the style for a wide
        text: a short one is widened to the style's least button width."""
        option = QStyleOptionButton()
        self.initStyleOption(option)
        wide = 10_000
        return self.style().sizeFromContents(QStyle.ContentsType.CT_PushButton, option,
                                             QSize(wide, self.fontMetrics().height()), self).width() - wide

    def _show_fitted(self) -> None:
        room = self.width() - self._chrome()
        shown = fit_text(self._full, self.fontMetrics(), room, self._name)
        if shown != self.text():
            super().setText(shown)
        self.setToolTip(self._tip or (self._full if shown != self._full else ""))


class ModelNameDelegate(QStyledItemDelegate):
    """Draws one column's model names shortened to the column's width, each told apart from the
    names beside it (`names()`): two sizes of one model never read the same."""

    def __init__(self, parent: QWidget, names: Callable[[], Iterable[str]], column: int = 0) -> None:
        super().__init__(parent)
        self._names = names
        self._column = column

    def paint(self, painter: QPainter, option: QStyleOptionViewItem, index: QModelIndex) -> None:
        if index.column() != self._column:
            super().paint(painter, option, index)
            return
        opt = QStyleOptionViewItem(option)
        self.initStyleOption(opt, index)
        widget = opt.widget
        style = widget.style() if widget is not None else QApplication.style()
        text_rect = style.subElementRect(QStyle.SubElement.SE_ItemViewItemText, opt, widget)
        margin = style.pixelMetric(QStyle.PixelMetric.PM_FocusFrameHMargin, None, widget) + 1
        opt.text = self.shown(opt.text, opt.fontMetrics, text_rect.width() - 2 * margin)
        style.drawControl(QStyle.ControlElement.CE_ItemViewItem, opt, painter, widget)

    def shown(self, name: str, metrics: QFontMetrics, width: int) -> str:
        """`name` as drawn in `width` pixels."""
        return fit_text(name, metrics, width, name, self._names())


class ElidedLabel(QLabel):
    """A one-line label cut to its width at the end with "…" (a long verdict or facts line never
    sets the window's minimum width nor wraps into a wall of text); the whole text in its tooltip."""

    MIN_WIDTH_PX = 40

    def __init__(self, text: str = "", parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._full = ""
        self.setTextFormat(Qt.TextFormat.PlainText)
        self.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.setMinimumWidth(self.MIN_WIDTH_PX)
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
        width = max(self.contentsRect().width(), self.MIN_WIDTH_PX)
        self.setText(self.fontMetrics().elidedText(self._full, Qt.TextElideMode.ElideRight, width))
