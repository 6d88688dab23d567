"""The charts of a comparison (pyqtgraph), in the live charts' style: grouped bars of tokens/s and
of speedup per configuration and category, overlaid curves of tokens/s over the reply and of
acceptance by draft position. One colour per configuration throughout, named in a legend line
above the plots (a legend box inside a plot would hide bars).

Fed with whole CompareRun snapshots (`set_run`); the figures come from app.compare.summary, so the
charts, the table and the exported files always agree.
"""

from __future__ import annotations

from pathlib import Path

import pyqtgraph as pg
from PySide6.QtCore import QEvent, Qt
from PySide6.QtGui import QColor, QPalette
from PySide6.QtWidgets import QGridLayout, QLabel, QVBoxLayout, QWidget

from app.compare.results import NONE, CompareRun
from app.compare.summary import ALL, Row, acceptance_by_position, speed_curve, table_rows
from app.ui.chat.charts import save_widget_png, theme_plots
from app.ui.common.format import html_text

# Mid-tone colours that read on dark and light backgrounds; "none" is always the neutral grey.
BASELINE_COLOUR = "#8c8c8c"
COLOURS = ("#3d8bfd", "#20a46b", "#e8871e", "#8a63d2", "#d63384", "#17a2b8", "#b58900", "#6f42c1")
GROUP_WIDTH = 0.8  # of a category's slot on the x axis, shared by its bars


def config_colours(run: CompareRun | None) -> dict[str, QColor]:
    names = [c.name for c in run.configs] if run is not None else []
    colours, i = {}, 0
    for name in names:
        if name == NONE:
            colours[name] = QColor(BASELINE_COLOUR)
        else:
            colours[name] = QColor(COLOURS[i % len(COLOURS)])
            i += 1
    return colours


class CompareCharts(QWidget):
    """Four plots in a 2 x 2 grid under a legend line."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.run: CompareRun | None = None
        self._bars: dict[str, dict[str, list[float]]] = {"tps": {}, "speedup": {}}
        self._curves: dict[str, dict[str, list[tuple[float, float]]]] = {"speed": {}, "positions": {}}
        self.legend = QLabel()
        self.legend.setTextFormat(Qt.TextFormat.RichText)
        self.legend.setWordWrap(True)
        self.tps_plot = _plot("tok/s", "")
        self.speedup_plot = _plot("× none", "")
        self.speed_plot = _plot("tok/s", "token of the reply")
        self.position_plot = _plot("% accepted", "draft position")
        grid = QGridLayout()
        grid.setContentsMargins(0, 0, 0, 0)
        grid.setSpacing(6)
        for index, plot in enumerate((self.tps_plot, self.speedup_plot, self.speed_plot, self.position_plot)):
            grid.addWidget(plot, index // 2, index % 2)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.legend)
        layout.addLayout(grid, 1)
        self._apply_theme()
        self.set_run(None)

    # --- drawing -----------------------------------------------------------------------------

    def set_run(self, run: CompareRun | None) -> None:
        self.run = run
        colours = config_colours(run)
        rows = table_rows(run) if run is not None else []
        categories = _categories(rows)
        self._draw_bars(self.tps_plot, "tps", rows, categories, colours, lambda r: r.tps)
        self._draw_bars(self.speedup_plot, "speedup", [r for r in rows if r.config != NONE], categories,
                        colours, lambda r: r.speedup)
        self._baseline_line()
        self._draw_curves(run, colours)
        self._set_legend(colours)
        self._set_titles()

    def _draw_bars(self, plot: pg.PlotWidget, key: str, rows: list[Row], categories: list[str],
                   colours: dict[str, QColor], value) -> None:
        item = plot.getPlotItem()
        item.clear()
        self._bars[key] = {}
        configs = list(dict.fromkeys(r.config for r in rows))
        width = GROUP_WIDTH / max(len(configs), 1)
        for i, config in enumerate(configs):
            heights = [_value(rows, config, c, value) for c in categories]
            self._bars[key][config] = heights
            xs = [x - GROUP_WIDTH / 2 + width * (i + 0.5) for x in range(len(categories))]
            bars = pg.BarGraphItem(x=xs, height=heights, width=width * 0.92,
                                   brush=pg.mkBrush(colours.get(config, QColor(BASELINE_COLOUR))), pen=pg.mkPen(None))
            item.addItem(bars)
        item.getAxis("bottom").setTicks([[(i, c) for i, c in enumerate(categories)]])
        item.setXRange(-0.6, max(len(categories), 1) - 0.4, padding=0)
        top = max((h for hs in self._bars[key].values() for h in hs), default=0.0)
        item.setYRange(0, max(top * 1.12, 1.2 if key == "speedup" else 1.0), padding=0)

    def _baseline_line(self) -> None:
        text = self.palette().color(QPalette.ColorRole.WindowText)
        line = pg.InfiniteLine(pos=1.0, angle=0, movable=False,
                               pen=pg.mkPen(text, width=1.2, style=Qt.PenStyle.DashLine))
        self.speedup_plot.getPlotItem().addItem(line, ignoreBounds=True)

    def _draw_curves(self, run: CompareRun | None, colours: dict[str, QColor]) -> None:
        speed, positions = self.speed_plot.getPlotItem(), self.position_plot.getPlotItem()
        speed.clear()
        positions.clear()
        self._curves = {"speed": {}, "positions": {}}
        if run is None:
            return
        longest = 1
        for config in run.configs:
            results = run.results_of(config.name)
            if not results:
                continue
            colour = colours[config.name]
            points = speed_curve(results)
            self._curves["speed"][config.name] = points
            speed.addItem(pg.PlotDataItem([x for x, _ in points], [y for _, y in points], pen=pg.mkPen(colour, width=2)))
            if config.drafter == NONE:
                continue
            rates = acceptance_by_position(results)
            xs = list(range(1, len(rates) + 1))
            self._curves["positions"][config.name] = [(x, 100.0 * r) for x, r in zip(xs, rates)]
            longest = max(longest, len(rates))
            positions.addItem(pg.PlotDataItem(xs, [100.0 * r for r in rates], pen=pg.mkPen(colour, width=2),
                                              symbol="o", symbolSize=5, symbolBrush=pg.mkBrush(colour),
                                              symbolPen=pg.mkPen(None)))
        positions.setYRange(0, 100, padding=0.02)
        positions.setXRange(0.5, max(longest, 4) + 0.5, padding=0)
        step = 1 if longest <= 16 else 2 if longest <= 32 else 4
        positions.getAxis("bottom").setTicks([[(i, str(i)) for i in range(1, max(longest, 4) + 1, step)]])
        speed.enableAutoRange()
        speed.setYRange(0, max((y for pts in self._curves["speed"].values() for _, y in pts), default=1.0) * 1.1,
                        padding=0)

    def _set_legend(self, colours: dict[str, QColor]) -> None:
        muted = _muted(self)
        if not colours:
            self.legend.setText(f"<span style='color:{muted}'>No results yet: pick the drafts and press Run.</span>")
            return
        ran = {r.config for r in self.run.results} if self.run is not None else set()
        keys = "&nbsp;&nbsp; ".join(
            f"<span style='color:{c.name()}'>■</span> {html_text(name)}"
            + ("" if name in ran else f" <span style='color:{muted}'>(no result)</span>")
            for name, c in colours.items())
        self.legend.setText(keys)

    def _set_titles(self) -> None:
        text = self.palette().color(QPalette.ColorRole.WindowText).name()
        titles = {
            self.tps_plot: "Tokens per second",
            self.speedup_plot: "Speedup over none (dashed: 1×)",
            self.speed_plot: "Tokens per second over the reply",
            self.position_plot: "Acceptance by draft position",
        }
        for plot, title in titles.items():
            plot.getPlotItem().setTitle(title, color=text, size="10pt")

    def _apply_theme(self) -> None:
        theme_plots(self.palette(), (self.tps_plot, self.speedup_plot, self.speed_plot, self.position_plot))

    def changeEvent(self, event: QEvent) -> None:  # noqa: N802 (Qt's name)
        if event.type() in (QEvent.Type.PaletteChange, QEvent.Type.ApplicationPaletteChange):
            self._apply_theme()
            self.set_run(self.run)
        super().changeEvent(event)

    # --- export --------------------------------------------------------------------------------

    def save_png(self, path: str | Path) -> None:
        """The legend and the four plots as one PNG (written whole or not at all)."""
        save_widget_png(self, path)

    # --- read-only views (tests) ---------------------------------------------------------------

    def bar_heights(self, key: str = "tps") -> dict[str, list[float]]:
        """config -> bar heights per category ("tps" or "speedup"), as drawn."""
        return {k: list(v) for k, v in self._bars[key].items()}

    def curve_points(self, key: str = "speed") -> dict[str, list[tuple[float, float]]]:
        """config -> points of the "speed" (tok/s over the reply) or "positions" curves."""
        return {k: list(v) for k, v in self._curves[key].items()}


def _categories(rows: list[Row]) -> list[str]:
    categories = list(dict.fromkeys(r.category for r in rows if r.category != ALL))
    return categories + ([ALL] if any(r.category == ALL for r in rows) else [])


def _value(rows: list[Row], config: str, category: str, value) -> float:
    row = next((r for r in rows if r.config == config and r.category == category), None)
    result = value(row) if row is not None else None
    return float(result) if result is not None else 0.0


def _plot(left: str, bottom: str) -> pg.PlotWidget:
    plot = pg.PlotWidget()
    plot.setMinimumSize(220, 160)
    item = plot.getPlotItem()
    item.setMouseEnabled(False, False)
    item.setMenuEnabled(False)
    item.hideButtons()
    item.showGrid(x=False, y=True, alpha=0.15)
    item.setLabel("left", left)
    if bottom:
        item.setLabel("bottom", bottom)
    return plot


def _muted(widget: QWidget) -> str:
    c = widget.palette().color(QPalette.ColorRole.WindowText)
    return f"rgba({c.red()},{c.green()},{c.blue()},0.6)"
