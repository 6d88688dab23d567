"""How often a live view may redraw while a reply streams: as often as its rate asks, unless its
measured cost per frame (its redraw plus the paints that follow it) would take more than its
share of one core. On two cores llama.cpp's threads spin while they wait for each other, so
every millisecond the GUI thread draws is taken from a step; a desktop that draws fast (a GPU
compositor, a fast core) keeps the full rate, a software-drawn one (Xvfb, a laptop on battery)
draws less often. Measured, never picked from a CPU flag."""

from __future__ import annotations

import time

import pyqtgraph as pg

EMA = 0.3  # the weight of the newest frame's cost in the running estimate


class FrameBudget:
    """A view's redraw interval from its measured frame cost: cost / share, never under 1/hz."""

    def __init__(self, hz: float, share: float) -> None:
        self.min_interval_s = 1.0 / hz
        self.share = share
        self.frame_s: float | None = None  # the running estimate of one frame's cost
        self._pending = 0.0  # paints measured since the last redraw: the last frame's

    def spent(self, seconds: float) -> None:
        """Time a paint of the view took (its widgets report it as they paint)."""
        self._pending += seconds

    def timed(self, redraw) -> None:
        """Run `redraw()` and count its time as a frame's, also when it raises."""
        started = time.perf_counter()
        try:
            redraw()
        finally:
            self.framed(time.perf_counter() - started)

    def framed(self, redraw_s: float) -> None:
        """A redraw took `redraw_s`; the paints since the one before it close that frame."""
        cost, self._pending = redraw_s + self._pending, 0.0
        self.frame_s = cost if self.frame_s is None else (1 - EMA) * self.frame_s + EMA * cost

    def interval_ms(self) -> int:
        wanted = self.min_interval_s if self.frame_s is None else max(self.min_interval_s, self.frame_s / self.share)
        return max(1, round(wanted * 1000))


class TimedPlotWidget(pg.PlotWidget):
    """A PlotWidget that tells its FrameBudget how long each of its paints took."""

    def __init__(self, budget: FrameBudget, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._budget = budget

    def paintEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        started = time.perf_counter()
        super().paintEvent(event)
        self._budget.spent(time.perf_counter() - started)
