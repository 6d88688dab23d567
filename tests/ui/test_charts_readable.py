"""The live charts read at a laptop's size (issue 60 item 7): each plot keeps a readable height
(the data had about 40 px), the "no draft 19.1 tok/s" label stays inside its plot, the acceptance
axes leave room above 100%, and an acceptance chart without data says why ("no drafts")."""

from __future__ import annotations

from PySide6.QtCore import QPointF
from PySide6.QtWidgets import QApplication

from app.engine.events import Origin, StepEvent
from app.ui.chat.charts import CHART_MIN_PX, NO_DRAFTS, NO_DRAFTS_YET, LiveCharts
from tests.gui_support import open_window, shot
from tests.ui.test_charts import shown_charts

DATA_MIN_PX = 80  # what a plot keeps for its points, under its title and above its time axis


def step(t: float, n_tokens: int, n_drafted: int = 0, n_accepted: int = 0) -> StepEvent:
    origins = (Origin.DRAFT,) * (n_tokens - 1) + (Origin.MAIN,)
    return StepEvent(tuple(range(n_tokens)), origins, "x" * n_tokens, 0, n_drafted, n_accepted, 0.001, 0.01, t)


def plots(charts: LiveCharts):
    return charts._speed_plot, charts._accept_plot, charts._position_plot


def feed(charts: LiveCharts, drafted: int, steps: int = 40) -> None:
    charts.reset(0.0)
    t = 0.0
    for i in range(steps):
        t += 0.05
        accepted = drafted if drafted and i % 2 else 0  # every other step accepts the whole draft
        charts.add_step(step(t, accepted + 1, drafted, accepted))
    charts.redraw()
    QApplication.processEvents()


def test_the_charts_keep_a_readable_height_in_a_1280x720_window(qtbot, data_dir):
    window = open_window(qtbot)
    window.resize(1272, 640)  # a 1280x720 screen less a frame and a panel
    QApplication.processEvents()
    for plot in plots(window.charts):
        view = plot.getPlotItem().getViewBox()
        assert plot.height() >= CHART_MIN_PX and view.height() >= DATA_MIN_PX, (plot.height(), view.height())
    # pyqtgraph asks for 480 px a plot: in the scrolling charts area one plot filled the view.
    assert window.charts.height() <= 3 * 200
    feed(window.charts, drafted=4)
    shot(window.charts, "60-7-charts-in-the-window-1280")


def test_labels_stay_inside_and_acceptance_has_headroom_at_the_least_height(qtbot):
    charts = shown_charts(qtbot, height=None)  # the least height
    charts.set_reference_tps(500.0)  # faster than every step: the line sets the axis' top
    feed(charts, drafted=4)
    speed, accept, position = plots(charts)
    assert speed.height() == CHART_MIN_PX

    label = charts._reference_line.label
    view = speed.getPlotItem().getViewBox()
    assert label.isVisible() and label.toPlainText() == "no draft 500.0 tok/s"
    assert view.sceneBoundingRect().contains(label.sceneBoundingRect()), (
        label.sceneBoundingRect(), view.sceneBoundingRect())

    for plot in (accept, position):
        box = plot.getPlotItem().getViewBox()
        full = box.mapViewToScene(QPointF(0, 100)).y()  # where 100% is drawn
        assert box.viewRange()[1][1] >= 110 and full - box.sceneBoundingRect().top() >= 8, "100% sits on the top edge"
    shot(charts, "60-7-charts-least-height")


def test_an_acceptance_chart_without_data_says_no_drafts(qtbot):
    charts = shown_charts(qtbot, height=560)
    assert charts.no_drafts_hint() == NO_DRAFTS_YET  # before any reply
    feed(charts, drafted=0)  # a reply with drafting off, or that drafted nothing
    assert charts.no_drafts_hint() == NO_DRAFTS
    hint = charts._no_drafts[charts._accept_plot]
    box = charts._accept_plot.getPlotItem().getViewBox()
    assert box.sceneBoundingRect().contains(hint.sceneBoundingRect())
    shot(charts, "60-7-no-drafts")
    feed(charts, drafted=3)
    assert charts.no_drafts_hint() == "" and charts.acceptance_points()
    charts.reset()
    assert charts.no_drafts_hint() == NO_DRAFTS_YET
    charts.set_acceptance_note("this server reports no draft counts: tok/s only")
    assert charts.no_drafts_hint() == ""  # the title says why, once
