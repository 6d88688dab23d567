"""Why drafting pays here or not, drawn beside the live charts.

The draft schedule prices every step: a drafted token and a verify of k tokens against one plain
main-model step (app.engine.loop.explain.Prices, carried by the reply's summary). From those the
panel draws the speed a draft of k gives at each acceptance (1.0x: plain decoding's), the 1.0x
line where a draft breaks even, and a marker at the acceptance this reply has reached, with the
same sentence `specula run --explain` prints. The acceptance moves as the reply streams (counted
from its steps); the prices are the machine's and the models', so they stay from one reply to the
next until a reply brings new ones. llama-server prices nothing: where its drafted reply was slower
than plain, the words are why, from its own counts (the reply's schedule_note).
"""

from __future__ import annotations

from typing import Any

import pyqtgraph as pg
from PySide6.QtCore import Qt, QTimer
from PySide6.QtGui import QColor
from PySide6.QtWidgets import QLabel, QVBoxLayout, QWidget

from app.engine.loop.explain import Prices
from app.ui.chat.charts import ACCEPT, SPEED, theme_plots
from app.ui.common.budget import FrameBudget, TimedPlotWidget

WHY_SHARE = 0.01  # of one core while a reply streams: the sentence and its curve change slowly

_ACCEPTANCES = [a / 100 for a in range(0, 101, 2)]
_NOTHING_PRICED = ("Nothing to weigh yet: a reply with a drafter the schedule prices (a draft model or "
                   "n-gram drafts) shows here what a draft costs and the acceptance it needs to pay.")


class WhyPanel(QWidget):
    """A plot of speed against acceptance at the schedule's draft length, and its sentence."""

    def __init__(self, parent: QWidget | None = None, redraw_hz: float = 4.0) -> None:
        super().__init__(parent)
        self.prices: Prices | None = None
        self._server_note: str | None = None  # why llama-server's drafts did not pay, in its own counts
        self._drafted = self._accepted = 0
        self.budget = FrameBudget(redraw_hz, WHY_SHARE)
        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.setInterval(self.budget.interval_ms())
        self._timer.timeout.connect(self.redraw)

        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(2)
        self._plot = TimedPlotWidget(self.budget)
        self._plot.setMinimumWidth(160)
        self._plot.setFixedHeight(120)  # small: the live charts below keep the room
        item = self._plot.getPlotItem()
        item.setMouseEnabled(False, False)
        item.setMenuEnabled(False)
        item.hideButtons()
        item.setLabel("left", "× plain")
        item.setLabel("bottom", "acceptance %")
        item.setXRange(0, 100, padding=0.02)
        item.getAxis("bottom").setTicks([[(v, str(v)) for v in (0, 25, 50, 75, 100)], []])
        self._curve = pg.PlotDataItem()
        self._even = pg.InfiniteLine(pos=1.0, angle=0, movable=False, label="break-even",
                                     labelOpts={"position": 0.1, "anchors": [(0, 1), (0, 1)]})
        self._seen = pg.InfiniteLine(angle=90, movable=False)
        self._dot = pg.ScatterPlotItem(size=9)
        for part in (self._curve, self._even, self._seen, self._dot):
            item.addItem(part)
        self.words = QLabel(_NOTHING_PRICED)
        self.words.setWordWrap(True)
        self.words.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        layout.addWidget(self.words)
        layout.addWidget(self._plot)
        text, muted = theme_plots(self.palette(), (self._plot,))
        self._curve.setPen(pg.mkPen(SPEED, width=2.2))
        self._even.setPen(pg.mkPen(text, width=1.2, style=Qt.PenStyle.DashLine))
        self._even.label.setColor(text)
        self._seen.setPen(pg.mkPen(QColor(ACCEPT), width=1.5))
        self._dot.setBrush(pg.mkBrush(ACCEPT))
        self._dot.setPen(pg.mkPen(None))
        self.redraw()

    # -- feeding ---------------------------------------------------------------------------

    def reset(self) -> None:
        """A new reply: its acceptance starts over; the prices stay until it brings its own."""
        self._drafted = self._accepted = 0
        self._server_note = None
        self.redraw()

    def add_steps(self, events: tuple) -> None:
        for event in events:
            self._drafted += event.n_drafted
            self._accepted += event.n_accepted
        if any(event.n_drafted for event in events) and not self._timer.isActive():
            self._timer.start(self.budget.interval_ms())

    def show_summary(self, summary: dict[str, Any] | None) -> None:
        """A finished reply's prices and acceptance (its summary dict); a reply that priced
        nothing (plain decoding, a server's own speculation) leaves the last prices up."""
        costs = (summary or {}).get("step_costs") or ()
        token = (summary or {}).get("draft_token_cost")
        note = (summary or {}).get("schedule_note")
        from_server = str((summary or {}).get("drafter", "")).startswith("llama-server")
        self._server_note = note if from_server and isinstance(note, str) and note else None
        if len(costs) >= 2 and isinstance(token, (int, float)) and all(c > 0 for c in costs):
            self.prices = Prices(tuple(float(c) for c in costs), float(token), None)
        self.redraw()

    # -- drawing ---------------------------------------------------------------------------

    @property
    def seen(self) -> float | None:
        return self._accepted / self._drafted if self._drafted else None

    def redraw(self) -> None:
        self._timer.stop()  # drawn now: not again, with nothing new, when the pending one comes
        self.budget.timed(self._draw)

    def _draw(self) -> None:
        if self._server_note:  # llama-server prices nothing: its counts say why, the curve stays ours
            self.words.setText(self._server_note + ".")  # it starts with a program's name: kept lower-case
        if self.prices is None:
            for part in (self._curve, self._seen, self._dot):
                part.hide()
            if not self._server_note:
                self.words.setText(_NOTHING_PRICED)
            return
        reading = self.prices.break_even(self.seen)
        k = reading.length or 4
        speeds = [self.prices.speedup(a, k) for a in _ACCEPTANCES]
        self._curve.setData([a * 100 for a in _ACCEPTANCES], speeds)
        self._curve.show()
        top = max(1.6, max(speeds) * 1.05)
        item = self._plot.getPlotItem()
        item.setYRange(0, top, padding=0)
        item.getAxis("left").setTicks([[(v, f"{v:g}") for v in (0, 1, round(top, 1) if top >= 1.8 else None) if v is not None],
                                       []])
        if reading.seen is None:
            self._seen.hide()
            self._dot.hide()
        else:
            self._seen.setValue(reading.seen * 100)
            self._dot.setData([reading.seen * 100], [self.prices.speedup(reading.seen, k)])
            self._seen.show()
            self._dot.show()
        if not self._server_note:
            self.words.setText(reading.sentence()[0].upper() + reading.sentence()[1:] + ".")
