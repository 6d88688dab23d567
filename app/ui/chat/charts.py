"""Live charts of one reply (pyqtgraph): tokens/s, acceptance rate, acceptance by draft position.

Fed with app.engine.events.StepEvent as the reply streams. `add_step` only appends to bounded
buffers and marks the charts dirty; a single-shot QTimer redraws at most `redraw_hz` times a
second, and only when something changed, so a fast model never makes the window draw per token;
less often where a frame's measured cost would take more than CHARTS_SHARE of a core
(app.ui.common.budget).

Tokens per second of a step is its tokens divided by the *wall time since the previous step's
timestamp*, not by draft_s + verify_s: the wall time also counts detokenizing, stop-string checks
and the loop's own overhead, so it is the speed the user actually sees text arrive at. The first
step (the token sampled from the prompt pass) has no previous step; its time is the time to first
token, shown in the stats line, and it is not drawn as a speed.
"""

from __future__ import annotations

import math
from collections import deque
from pathlib import Path

import pyqtgraph as pg
from PySide6.QtCore import QBuffer, QByteArray, QCoreApplication, QEvent, QIODevice, QSize, Qt, QTimer
from PySide6.QtGui import QColor, QPalette, QPixmap
from PySide6.QtWidgets import QBoxLayout, QGraphicsItem, QWidget

from app.common.atomic import write_atomic
from app.engine.errors import SpeculaError
from app.engine.events import StepEvent
from app.ui.common.budget import FrameBudget, TimedPlotWidget
from app.ui.common.format import html_text, stats_line

__all__ = ["LiveCharts", "stats_line"]  # stats_line: the line under a reply, re-exported here

ROLLING_STEPS = 8  # the rolling curves average over the last 8 steps
# Of one core, what the charts may take while a reply streams (their redraw rate falls to keep
# it). On two cores every millisecond the GUI thread draws costs llama.cpp's spinning threads
# more than a millisecond: software-drawn (Xvfb), a frame of the three plots takes 15-30 ms, and
# at 4% of a core SmolLM2's window decoded at 0.92x of the same loop without it; at 1.5% (about
# one frame a second there, the full rate where drawing is fast) at 0.97-1.02x.
CHARTS_SHARE = 0.015
MAX_POSITIONS = 64  # draft positions counted (llama.cpp's draft max is 16 by default)
# Each plot's height: at least its title, axes and about 80 px of data (at 96 px the data had 40 px
# and "no draft 19.1 tok/s" was cut or sat on the points); wanted a little more where there is room.
CHART_MIN_PX = 150
CHART_PX = 180
# The acceptance axes end above 100% (a line at 100% stays off the top edge) and below 0% (the 0
# tick's label has room).
ACCEPT_RANGE = (-10.0, 115.0)
NO_DRAFTS_YET, NO_DRAFTS = "no drafts yet", "no drafts in this reply"

# Mid-tone colours that read on a dark and on a light background alike.
SPEED = QColor("#3d8bfd")
ACCEPT = QColor("#20a46b")
BARS = QColor("#8a63d2")


class LiveCharts(QWidget):
    """Three small plots for the reply being generated, stacked vertically by default."""

    def __init__(self, parent: QWidget | None = None, max_points: int = 2000, redraw_hz: float = 15.0,
                 orientation: Qt.Orientation = Qt.Orientation.Vertical) -> None:
        super().__init__(parent)
        self.max_points = max_points
        self._tps: deque[tuple[float, float]] = deque(maxlen=max_points)
        self._rolling_tps: deque[tuple[float, float]] = deque(maxlen=max_points)
        self._acceptance: deque[tuple[float, float]] = deque(maxlen=max_points)
        self._cumulative: deque[tuple[float, float]] = deque(maxlen=max_points)
        self._recent_steps: deque[tuple[float, int]] = deque(maxlen=ROLLING_STEPS + 1)
        self._recent_drafts: deque[tuple[int, int]] = deque(maxlen=ROLLING_STEPS)
        self._drafted_at: list[int] = []
        self._accepted_at: list[int] = []
        self._reference: float | None = None
        self._note: str | None = None  # what the engine cannot show (a server without draft counts)
        self._dirty = False
        self.redraw_count = 0  # for tests and the self-test: how many times the charts were drawn

        self.budget = FrameBudget(redraw_hz, CHARTS_SHARE)
        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.setInterval(self.budget.interval_ms())
        self._timer.timeout.connect(self.redraw)

        direction = (QBoxLayout.Direction.TopToBottom if orientation == Qt.Orientation.Vertical
                     else QBoxLayout.Direction.LeftToRight)
        layout = QBoxLayout(direction, self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(4)
        self._speed_plot = self._make_plot("tok/s", "time (s)")
        self._accept_plot = self._make_plot("%", "time (s)")
        self._position_plot = self._make_plot("%", "draft position")
        for plot in (self._speed_plot, self._accept_plot, self._position_plot):
            layout.addWidget(plot)
        self._vertical = orientation == Qt.Orientation.Vertical
        self._build_items()
        self._apply_theme()
        self.reset()

    # -- construction --------------------------------------------------------------------

    def _make_plot(self, left: str, bottom: str) -> pg.PlotWidget:
        plot = TimedPlotWidget(self.budget)
        plot.setMinimumSize(160, CHART_MIN_PX)  # the charts' area scrolls where three do not fit
        item = plot.getPlotItem()
        item.setMouseEnabled(False, False)  # a live chart: no accidental pan/zoom
        item.setMenuEnabled(False)
        item.hideButtons()
        item.showGrid(x=False, y=True, alpha=0.15)
        item.setLabel("left", left)
        item.setLabel("bottom", bottom)
        for side in ("left", "bottom"):
            # The grid is drawn by the axes across the whole plot, so every new point would
            # repaint their text (most of a redraw's cost); cached, they repaint only when
            # their range changes, which the round ranges of _fit_ranges keep rare.
            item.getAxis(side).setCacheMode(QGraphicsItem.CacheMode.DeviceCoordinateCache)
            # Seconds and tok/s as they are: a reply of one step spans milliseconds, which
            # pyqtgraph's SI prefix turned into "time (s) (x0.001)".
            item.getAxis(side).enableAutoSIPrefix(False)
        return plot

    def _build_items(self) -> None:
        speed = self._speed_plot.getPlotItem()
        self._tps_scatter = pg.ScatterPlotItem(size=5, pen=None)
        self._rolling_curve = pg.PlotDataItem()
        speed.addItem(self._tps_scatter)
        speed.addItem(self._rolling_curve)
        # The label at the right end, under the line in the plot's upper half and over it in the
        # lower (always inside), on a backing that keeps it readable over the points.
        self._reference_line = pg.InfiniteLine(angle=0, movable=False, label="no draft {value:.1f} tok/s",
                                               labelOpts={"position": 0.98, "anchors": [(1, 0), (1, 1)]})
        speed.addItem(self._reference_line, ignoreBounds=True)
        self._reference_line.hide()

        accept = self._accept_plot.getPlotItem()
        self._accept_curve = pg.PlotDataItem()
        self._cumulative_curve = pg.PlotDataItem()
        accept.addItem(self._accept_curve)
        accept.addItem(self._cumulative_curve)
        accept.setXLink(self._speed_plot.getPlotItem())  # the two time plots share their x axis

        self._bars = pg.BarGraphItem(x=[], height=[], width=0.7)
        self._position_plot.getPlotItem().addItem(self._bars)
        self._no_drafts = {}
        for plot in (self._accept_plot, self._position_plot):  # three ticks stay legible in a short plot
            plot.getPlotItem().setYRange(*ACCEPT_RANGE, padding=0)
            plot.getPlotItem().getAxis("left").setTicks([[(v, str(v)) for v in (0, 50, 100)]])
            self._no_drafts[plot] = _centred_hint(plot)

    def _apply_theme(self) -> None:
        """Follow the window's palette, so a dark and a light theme both read well."""
        text, muted = theme_plots(self.palette(), (self._speed_plot, self._accept_plot, self._position_plot))
        self._set_titles()
        faint = QColor(SPEED)
        faint.setAlpha(110)
        self._tps_scatter.setBrush(pg.mkBrush(faint))
        self._rolling_curve.setPen(pg.mkPen(SPEED, width=2.2))
        self._reference_line.setPen(pg.mkPen(text, width=1.2, style=Qt.PenStyle.DashLine))
        self._reference_line.label.setColor(text)
        backing = self.palette().color(QPalette.ColorRole.Base)
        backing.setAlpha(215)
        self._reference_line.label.fill = pg.mkBrush(backing)
        for hint in self._no_drafts.values():
            hint.setColor(muted)
        # Each step that drafted is a dot as well as a point of the line: a reply that drafted in
        # one step has one point, which a line alone never draws (the chart stayed blank). The
        # whole reply's points are rings around them: for the first steps the two rates are the
        # same, and a dashed line on the solid one did not show.
        self._accept_curve.setPen(pg.mkPen(ACCEPT, width=2.2))
        self._accept_curve.setSymbol("o")
        self._accept_curve.setSymbolSize(5)
        self._accept_curve.setSymbolBrush(pg.mkBrush(ACCEPT))
        self._accept_curve.setSymbolPen(pg.mkPen(None))
        self._cumulative_curve.setPen(pg.mkPen(muted, width=1.5, style=Qt.PenStyle.DashLine))
        self._cumulative_curve.setSymbol("o")
        self._cumulative_curve.setSymbolSize(9)
        self._cumulative_curve.setSymbolBrush(pg.mkBrush(None))
        self._cumulative_curve.setSymbolPen(pg.mkPen(text, width=1.2))
        bar = QColor(BARS)
        bar.setAlpha(210)
        self._bars.setOpts(brush=pg.mkBrush(bar), pen=pg.mkPen(None))

    def _set_titles(self) -> None:
        """Titles that double as legends: a legend box inside a plot would hide data."""
        text = self.palette().color(QPalette.ColorRole.WindowText)
        muted = _css(text, 0.6)
        speed = f"{_key(SPEED.name(), '●')} per step {_key(SPEED.name(), '━')} rolling"
        if self._reference is not None:
            speed += f" {_key(muted, '┄')} no draft"
        accept = f"{_key(ACCEPT.name(), '━●')} last {ROLLING_STEPS} steps {_key(text.name(), '┄○')} whole reply"
        note = f"<span style='color:#b45309'>{html_text(self._note)}</span>" if self._note else ""
        titles = {
            self._speed_plot: _title("Tokens per second", speed),
            self._accept_plot: _title("Acceptance rate", note or accept),
            self._position_plot: _title("Acceptance by draft position", note),
        }
        for plot, title in titles.items():
            plot.getPlotItem().setTitle(title, color=text.name(), size="10pt")

    def sizeHint(self) -> QSize:  # noqa: N802 (Qt's name)
        """Room for three readable plots, not pyqtgraph's 480 px each (the charts' area scrolls,
        and took that whole height: one plot filled the view)."""
        count = 3 if self._vertical else 1
        return QSize(super().sizeHint().width(), count * CHART_PX + (count - 1) * self.layout().spacing())

    def changeEvent(self, event: QEvent) -> None:  # noqa: N802 (Qt's name)
        if event.type() in (QEvent.Type.PaletteChange, QEvent.Type.ApplicationPaletteChange):
            self._apply_theme()
        super().changeEvent(event)

    # -- feeding -------------------------------------------------------------------------

    def reset(self, start_time: float | None = None) -> None:
        """Clear the charts for a new reply; start_time is time.monotonic() when it was requested."""
        for buffer in (self._tps, self._rolling_tps, self._acceptance, self._cumulative,
                       self._recent_steps, self._recent_drafts):
            buffer.clear()
        self._drafted_at.clear()
        self._accepted_at.clear()
        self._origin = start_time  # x = 0; the first step's timestamp when not given
        self._previous: float | None = None
        self._carried = 0  # tokens of a step that had the previous step's timestamp
        self._total_drafted = self._total_accepted = 0
        self._ranges: dict = {}  # the axis ranges last set, to set them only when they change
        self._timer.stop()
        self._draw()  # not timed: a frame of empty plots would lower the budget's estimate of a live one

    def add_step(self, event: StepEvent) -> None:
        """Record one verify step. Cheap: no drawing here (the timer redraws)."""
        if not event.n_tokens:
            return  # a text-only tail after cancellation: no work of the model
        if self._origin is None:
            self._origin = event.timestamp
        t = event.timestamp - self._origin
        self._add_speed(event.timestamp, t, event.n_tokens)
        if event.n_drafted > 0:
            if self._note:
                self.set_acceptance_note(None)
            self._add_acceptance(t, event.n_drafted, event.n_accepted)
        self._dirty = True
        if not self._timer.isActive():
            self._timer.start(self.budget.interval_ms())

    def _add_speed(self, timestamp: float, t: float, n_tokens: int) -> None:
        previous = self._previous
        if previous is None:
            self._previous = timestamp
            self._recent_steps.append((timestamp, n_tokens))
            return  # the first token: its latency is TTFT, not a decoding speed
        if timestamp <= previous:
            self._carried += n_tokens  # a clock tie would be an infinite speed: count it next step
            return
        n_tokens, self._carried, self._previous = n_tokens + self._carried, 0, timestamp
        dt = timestamp - previous
        self._tps.append((t, n_tokens / dt))
        self._recent_steps.append((timestamp, n_tokens))
        # Rolling speed = tokens of the last steps / the time they took (not a mean of rates,
        # which would overweight fast steps).
        first_time = self._recent_steps[0][0]
        tokens = sum(n for _, n in list(self._recent_steps)[1:])
        if timestamp > first_time:
            self._rolling_tps.append((t, tokens / (timestamp - first_time)))

    def _add_acceptance(self, t: float, n_drafted: int, n_accepted: int) -> None:
        self._recent_drafts.append((n_drafted, n_accepted))
        drafted = sum(d for d, _ in self._recent_drafts)
        accepted = sum(a for _, a in self._recent_drafts)
        self._acceptance.append((t, accepted / drafted))
        self._total_drafted += n_drafted
        self._total_accepted += n_accepted
        self._cumulative.append((t, self._total_accepted / self._total_drafted))
        for i in range(min(n_drafted, MAX_POSITIONS)):
            if i == len(self._drafted_at):
                self._drafted_at.append(0)
                self._accepted_at.append(0)
            self._drafted_at[i] += 1
            self._accepted_at[i] += int(i < n_accepted)

    def set_acceptance_note(self, note: str | None) -> None:
        """One line in the acceptance charts' titles where the engine cannot give them data (a
        server that reports no draft counts), instead of empty axes read as 0%; None clears it.
        A step with drafts clears it too."""
        self._note = note or None
        self._set_titles()
        self._show_no_drafts()

    def acceptance_note(self) -> str | None:
        return self._note

    def set_reference_tps(self, tps: float | None) -> None:
        """The no-draft speed of this pair as a dashed line (None hides it)."""
        self._reference = tps if tps and tps > 0 else None
        if self._reference is None:
            self._reference_line.hide()
        else:
            # Show before setting: a hidden line's label ignores value changes.
            self._reference_line.show()
            self._reference_line.setValue(self._reference)
            self._reference_line.label.valueChanged()
        self._set_titles()
        self._fit_ranges()

    # -- drawing -------------------------------------------------------------------------

    def redraw(self) -> None:
        """Draw the buffers (the timer calls this; public for tests and save_png). A redraw
        called at the end of a reply takes the place of the one the timer still had pending:
        that one came a second later, when the window was idle, to draw it all again."""
        self._timer.stop()
        self.budget.timed(self._draw)

    def _draw(self) -> None:
        self._dirty = False
        self.redraw_count += 1
        _set_points(self._tps_scatter, self._tps)
        _set_points(self._rolling_curve, self._rolling_tps)
        self._fit_ranges()
        _set_points(self._accept_curve, self._acceptance, scale=100.0)
        _set_points(self._cumulative_curve, self._cumulative, scale=100.0)
        self._draw_bars()
        self._show_no_drafts()

    def _show_no_drafts(self) -> None:
        """Empty acceptance charts say why: no drafts yet, or none in this reply (a note in the
        titles says it where the engine cannot count them)."""
        text = "" if self._acceptance or self._note else (NO_DRAFTS if self._tps else NO_DRAFTS_YET)
        for hint in self._no_drafts.values():
            if hint.toPlainText() != text:
                hint.setText(text)
            hint.setVisible(bool(text))

    def no_drafts_hint(self) -> str:
        """What the empty acceptance charts say ("" while they have data)."""
        hint = self._no_drafts[self._accept_plot]
        return hint.toPlainText() if hint.isVisible() else ""

    def _fit_ranges(self) -> None:
        """Set the axes' ranges by hand, on round numbers.

        Round ranges change rarely, and an axis is re-rendered (its text is the costly part of
        a redraw) only when its range changes. y of the speed plot starts at 0; its top is the
        rolling curve's or the reference's maximum, or the 90th percentile of the per-step
        points if higher: a few steps that accept a long draft in one forward (10x the typical
        rate) would otherwise squash the curve flat; rarer spikes go off the top. Autorange
        would also ignore the reference line, which is not data."""
        per_step = sorted(y for _, y in self._tps)
        typical = per_step[int(0.9 * (len(per_step) - 1))] if per_step else 0.0
        rolling = max((y for _, y in self._rolling_tps), default=0.0)
        top = _nice_ceiling(1.1 * max(typical, rolling, self._reference or 0.0, 1.0))
        self._set_range("y", self._speed_plot, (0.0, top))
        times = [x for x, _ in self._tps] + [x for x, _ in self._acceptance]
        if times:
            first, last = min(times), max(times)
            step = _nice_ceiling(max(last - first, 0.5) / 5)
            start = step * math.floor(first / step)
            # At least a second wide: one step (a reply of a few tokens) is a point, not an axis of ms.
            self._set_range("x", self._speed_plot, (start, start + _nice_ceiling(max(last - start, 1.0))))
        else:
            self._set_range("x", self._speed_plot, (0.0, 5.0))

    def _set_range(self, axis: str, plot: pg.PlotWidget, bounds: tuple[float, float]) -> None:
        key = (axis, id(plot))
        if self._ranges.get(key) != bounds:
            self._ranges[key] = bounds
            if axis == "x":
                plot.getPlotItem().setXRange(*bounds, padding=0)
            else:
                plot.getPlotItem().setYRange(*bounds, padding=0)

    def _draw_bars(self) -> None:
        rates = self.acceptance_by_position()
        positions = list(range(1, len(rates) + 1))
        self._bars.setOpts(x=positions, height=[100.0 * r for r in rates], width=0.7)
        n = max(len(rates), 4)
        if self._ranges.get("positions") != n:  # re-render the axis only when it grows
            self._ranges["positions"] = n
            item = self._position_plot.getPlotItem()
            item.setXRange(0.4, n + 0.6, padding=0)
            step = 1 if n <= 16 else 2 if n <= 32 else 4
            item.getAxis("bottom").setTicks([[(i, str(i)) for i in range(1, n + 1, step)]])

    def paint_now(self) -> None:
        """Paint what was drawn into the plots so far, now rather than on the event loop's next
        turn (a plot's scene passes its changes on through queued calls, then paints)."""
        # In this order: the speed plot's new x range reaches the acceptance plot's scene too.
        for plot in (self._speed_plot, self._accept_plot, self._position_plot):
            QCoreApplication.sendPostedEvents(plot.scene(), QEvent.Type.MetaCall)
        QCoreApplication.sendPostedEvents(self.window(), QEvent.Type.UpdateRequest)

    def save_png(self, path: str | Path) -> None:
        """The three plots as one PNG, as they look now (written whole or not at all)."""
        path = Path(path)
        if self._dirty:
            self.redraw()
        save_widget_png(self, path)

    # -- read-only views (tests, export) -------------------------------------------------

    def tps_points(self) -> list[tuple[float, float]]:
        return list(self._tps)

    def rolling_tps_points(self) -> list[tuple[float, float]]:
        return list(self._rolling_tps)

    def acceptance_points(self) -> list[tuple[float, float]]:
        """(t, rolling acceptance rate 0..1) per step that had drafts."""
        return list(self._acceptance)

    def cumulative_acceptance_points(self) -> list[tuple[float, float]]:
        return list(self._cumulative)

    def acceptance_by_position(self) -> list[float]:
        """Accepted / drafted at each draft position (0..1), as llama.cpp counts them."""
        return [a / d if d else 0.0 for a, d in zip(self._accepted_at, self._drafted_at)]

    def drafted_by_position(self) -> list[int]:
        return list(self._drafted_at)

    def accepted_by_position(self) -> list[int]:
        return list(self._accepted_at)

    def is_dirty(self) -> bool:
        return self._dirty


def _css(colour: QColor, alpha: float) -> str:
    return f"rgba({colour.red()},{colour.green()},{colour.blue()},{alpha})"


def _key(colour: str, symbol: str) -> str:
    return f"<span style='color:{colour}'>{symbol}</span>"


def _title(name: str, legend: str) -> str:
    if not legend:
        return name
    return f"{name}&nbsp;&nbsp;<span style='font-size:8pt'>{legend}</span>"


def _nice_ceiling(value: float) -> float:
    """The smallest round number >= value (1, 1.5, 2, 2.5, 3, 4, 5, 6, 8 x 10^k)."""
    if value <= 0:
        return 1.0
    scale = 10.0 ** math.floor(math.log10(value))
    for mantissa in (1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0):
        if mantissa * scale >= value * (1 - 1e-9):
            return mantissa * scale
    return 10.0 * scale


def _centred_hint(plot: pg.PlotWidget) -> pg.TextItem:
    """A line of text in the middle of a plot's data area, whatever its axes' ranges."""
    view = plot.getPlotItem().getViewBox()
    hint = pg.TextItem("", anchor=(0.5, 0.5))
    hint.setParentItem(view)  # the view box's own coordinates: pixels, not data
    view.sigResized.connect(lambda box: hint.setPos(box.width() / 2, box.height() / 2))
    return hint


def _set_points(item: pg.GraphicsObject, points: deque[tuple[float, float]], scale: float = 1.0) -> None:
    xs = [x for x, _ in points]
    ys = [y * scale for _, y in points]
    item.setData(x=xs, y=ys)


def theme_plots(palette: QPalette, plots) -> tuple[QColor, QColor]:
    """Give pyqtgraph plots the window's colours; returns (text, muted) for the caller's items."""
    background = palette.color(QPalette.ColorRole.Base)
    text = palette.color(QPalette.ColorRole.WindowText)
    muted = QColor(text)
    muted.setAlpha(110)
    for plot in plots:
        plot.setBackground(background)
        for side in ("left", "bottom"):
            axis = plot.getPlotItem().getAxis(side)
            axis.setPen(pg.mkPen(muted))
            axis.setTextPen(pg.mkPen(text))
            axis.label.setDefaultTextColor(text)
    return text, muted


def save_widget_png(widget: QWidget, path: str | Path) -> None:
    """A widget as it looks now, as a PNG written whole or not at all."""
    write_png(widget.grab(), Path(path))


def write_png(pixmap: QPixmap, path: Path) -> Path:
    """Encode in memory, then app.common.atomic's private write: a fresh staging file, never a
    fixed `<path>.part` a planted link could redirect."""
    data = QByteArray()
    buffer = QBuffer(data)
    buffer.open(QIODevice.OpenModeFlag.WriteOnly)
    if pixmap.isNull() or not pixmap.save(buffer, "PNG"):
        raise SpeculaError(f"cannot save the charts to {path}: Qt could not encode the image")
    try:
        return write_atomic(path, bytes(data.data()))
    except OSError as exc:
        raise SpeculaError(f"cannot save the charts to {path}: {exc.strerror or exc}") from None
