"""Live charts in a real offscreen Qt window, fed by a real speculative generation."""

from __future__ import annotations

import sys
import time

import PySide6
import pytest
from PySide6.QtGui import QColor, QImage

from app.engine.events import Origin, StepEvent
from app.ui.chat.charts import LiveCharts, _nice_ceiling
from app.ui.common.format import relative_time, stats_line

PROMPT = "The model reads the file and the model writes the file. " * 3


def step(t: float, n_tokens: int, n_drafted: int = 0, n_accepted: int = 0) -> StepEvent:
    """A step as the loop yields it (plain data: the input, not the thing under test)."""
    origins = (Origin.DRAFT,) * (n_tokens - 1) + (Origin.MAIN,)
    return StepEvent(tuple(range(n_tokens)), origins, "x" * n_tokens, 0, n_drafted, n_accepted,
                     0.001, 0.01, t)


def test_qt_binding_keeps_none_alive(qapp):
    """PySide6/shiboken6 6.12.0 on CPython 3.11 drops a reference to None on every call of a C++
    method that returns void; a streaming chart makes ~5000 such calls a second, and the
    interpreter aborts ("Fatal Python error: none_dealloc") within seconds. 6.11.3 is fine, and
    from 3.12 on None is immortal. Fail here, with the reason, rather than crash the suite."""
    from PySide6.QtCore import QPointF

    point = QPointF()
    before = sys.getrefcount(None)
    for _ in range(1000):
        point.setX(1.0)
    lost = before - sys.getrefcount(None)
    assert lost < 100, (
        f"PySide6 {PySide6.__version__} lost {lost} references to None in 1000 calls: the window "
        "would abort within seconds; install a PySide6 without this bug (e.g. 6.11.3)"
    )


@pytest.fixture(scope="module")
def generation(tiny_loaded):
    """The events of a real greedy generation with prompt lookup on a tiny GGUF model."""
    from app.engine.drafting.drafters import PromptLookupDrafter
    from app.engine.events import DoneEvent
    from app.engine.loop.sampling import SamplingParams
    from app.engine.loop.speculative import DecodeSettings, generate

    loaded = tiny_loaded("llama-f32")
    ids = loaded.tokenizer.encode(PROMPT)
    # No EOS stop: the tiny random model would end after a few tokens.
    settings = DecodeSettings(max_new_tokens=120, sampling=SamplingParams(temperature=0.0),
                              stop_token_ids=())
    start = time.monotonic()
    events = list(generate(loaded.kv_model(), loaded.tokenizer, ids, PromptLookupDrafter(), settings))
    assert isinstance(events[-1], DoneEvent)
    return start, events[:-1], events[-1].summary


def shown_charts(qtbot, height: int | None = 640) -> LiveCharts:
    """Live charts shown 420 px wide and `height` tall (None: their least height)."""
    widget = LiveCharts(redraw_hz=50)
    qtbot.addWidget(widget)
    widget.resize(420, widget.minimumSizeHint().height() if height is None else height)
    widget.show()
    qtbot.waitExposed(widget)
    return widget


@pytest.fixture
def charts(qtbot):
    return shown_charts(qtbot)


def test_real_generation_fills_the_charts_like_the_summary(charts, generation, qtbot):
    start, steps, summary = generation
    # The prompt repeats: lookup drafts (the random model rejects most, so the schedule backs off).
    assert summary.n_drafted > 0 and summary.n_steps >= 3
    charts.reset(start)
    for event in steps:
        charts.add_step(event)

    # By-position bars count exactly what the loop's own counters counted.
    assert charts.drafted_by_position() == list(summary.drafted_by_position)
    assert charts.accepted_by_position() == list(summary.accepted_by_position)
    assert charts.acceptance_by_position() == pytest.approx(list(summary.acceptance_by_position))
    # One speed point per step after the first token; times from the request's start.
    points = charts.tps_points()
    assert len(points) == len(steps) - 1
    assert all(t > 0 and tps > 0 for t, tps in points)
    assert [t for t, _ in points] == sorted(t for t, _ in points)
    for (t, tps), prev, event in zip(points, steps, steps[1:]):
        assert t == pytest.approx(event.timestamp - start)
        assert tps == pytest.approx(len(event.tokens) / (event.timestamp - prev.timestamp))
    # The cumulative acceptance ends at the summary's rate; rolling rates stay within 0..1.
    assert charts.cumulative_acceptance_points()[-1][1] == pytest.approx(summary.accept_rate)
    assert all(0 <= rate <= 1 for _, rate in charts.acceptance_points())
    assert len(charts.acceptance_points()) == sum(1 for e in steps if e.n_drafted)


def test_add_step_only_marks_dirty_and_the_timer_redraws(charts, qtbot):
    charts.reset(100.0)
    drawn = charts.redraw_count
    charts.add_step(step(100.5, 1))
    charts.add_step(step(100.6, 4, n_drafted=5, n_accepted=3))
    assert charts.is_dirty() and charts.redraw_count == drawn  # nothing drawn per step
    qtbot.waitUntil(lambda: not charts.is_dirty(), timeout=2000)
    assert charts.redraw_count == drawn + 1  # both steps in one redraw
    x, y = charts._rolling_curve.getData()
    assert list(x) == pytest.approx([0.6]) and list(y) == pytest.approx([40.0])
    heights = charts._bars.opts["height"]
    assert list(heights) == pytest.approx([100, 100, 100, 0, 0])
    qtbot.wait(100)
    assert charts.redraw_count == drawn + 1  # not dirty: the timer does not redraw again


def test_a_redraw_at_the_end_of_a_reply_takes_the_pending_ones_place(charts, qtbot):
    """The end of a reply redraws at once; the redraw the timer had pending must not come later,
    to an idle window, to draw the same points again."""
    charts.reset(100.0)
    charts.add_step(step(100.5, 1))
    charts.add_step(step(100.6, 4))
    interval_ms = charts.budget.interval_ms()
    drawn = charts.redraw_count
    charts.redraw()  # the reply ended
    qtbot.wait(interval_ms + 200)
    assert charts.redraw_count == drawn + 1


def flat(points):
    return [value for point in points for value in point]


def test_speeds_rolling_window_and_positions(qapp):
    charts = LiveCharts()
    charts.reset(10.0)
    charts.add_step(step(10.3, 1))  # first token: TTFT, not a speed
    assert charts.tps_points() == []
    charts.add_step(step(10.4, 3, n_drafted=4, n_accepted=2))
    charts.add_step(step(10.5, 1, n_drafted=3, n_accepted=0))
    charts.add_step(step(10.5, 2))  # a clock tie: no infinite speed, counted with the next step
    charts.add_step(StepEvent((), (), "tail", 0, 0, 0, 0.0, 0.0, 10.6))  # text-only tail
    charts.add_step(step(10.7, 1))
    assert flat(charts.tps_points()) == pytest.approx([0.4, 30.0, 0.5, 10.0, 0.7, 15.0])
    # Rolling = tokens / time over the window (not a mean of rates): (3 + 1 + 3) / 0.4 s.
    assert charts.rolling_tps_points()[-1] == pytest.approx((0.7, 17.5))
    assert flat(charts.acceptance_points()) == pytest.approx([0.4, 0.5, 0.5, 2 / 7])
    assert charts.drafted_by_position() == [2, 2, 2, 1]
    assert charts.accepted_by_position() == [1, 1, 0, 0]
    assert charts.acceptance_by_position() == [0.5, 0.5, 0.0, 0.0]
    charts.reset()
    assert charts.tps_points() == [] and charts.acceptance_by_position() == []
    charts.deleteLater()


def test_buffers_are_bounded(qapp):
    charts = LiveCharts(max_points=50)
    charts.reset(0.0)
    for i in range(1, 1001):
        charts.add_step(step(i * 0.01, 3, n_drafted=4, n_accepted=2))
    assert len(charts.tps_points()) == 50 and len(charts.rolling_tps_points()) == 50
    assert len(charts.acceptance_points()) == 50
    assert charts.tps_points()[-1][0] == pytest.approx(10.0)  # the newest are kept
    assert charts.drafted_by_position() == [1000] * 4
    charts.redraw()
    assert len(charts._tps_scatter.data) == 50
    charts.deleteLater()


def test_reference_line_and_speed_range(charts):
    charts.reset(0.0)
    charts.add_step(step(0.1, 1))
    charts.add_step(step(0.2, 2))  # 20 tok/s
    charts.set_reference_tps(55.0)
    charts.redraw()
    assert charts._reference_line.isVisible() and charts._reference_line.value() == 55.0
    assert "55.0 tok/s" in charts._reference_line.label.toPlainText()
    low, high = charts._speed_plot.getPlotItem().viewRange()[1]
    assert low == 0 and 55 < high <= 80  # the line is inside the plot
    charts.set_reference_tps(None)
    charts.redraw()
    assert not charts._reference_line.isVisible()
    assert charts._speed_plot.getPlotItem().viewRange()[1][1] < 55


def test_save_png_writes_the_three_plots(charts, generation, tmp_path, qtbot):
    start, steps, summary = generation
    charts.reset(start)
    charts.set_reference_tps(summary.decode_tps / 2)
    for event in steps:
        charts.add_step(event)
    path = tmp_path / "charts.png"
    charts.save_png(path)
    image = QImage(str(path))
    assert not image.isNull()
    assert (image.width(), image.height()) == (charts.width() * image.devicePixelRatio(),
                                              charts.height() * image.devicePixelRatio())
    colours = {image.pixel(x, y) for x in range(0, image.width(), 7) for y in range(0, image.height(), 7)}
    assert len(colours) > 20  # text, curves and bars, not a blank grab
    bar_colour = QColor("#8a63d2")
    bottom_third = [QColor(image.pixel(x, y)) for x in range(image.width())
                    for y in range(image.height() * 2 // 3, image.height(), 3)]
    assert any(abs(c.red() - bar_colour.red()) < 40 and abs(c.blue() - bar_colour.blue()) < 40
               and c.green() < 140 for c in bottom_third)  # the bars are drawn
    assert not list(tmp_path.glob("*.part"))
    with pytest.raises(Exception, match="cannot save the charts"):
        charts.save_png(tmp_path / "missing-folder" / "charts.png")


def test_charts_follow_a_dark_palette(charts, qtbot):
    from PySide6.QtGui import QPalette

    palette = QPalette(charts.palette())
    palette.setColor(QPalette.ColorRole.Base, QColor("#1b1b1d"))
    palette.setColor(QPalette.ColorRole.WindowText, QColor("#e8eaed"))
    charts.setPalette(palette)
    assert charts._speed_plot.backgroundBrush().color().name() == "#1b1b1d"
    axis = charts._accept_plot.getPlotItem().getAxis("left")
    assert axis.textPen().color().name() == "#e8eaed"


def test_nice_ceiling():
    assert [_nice_ceiling(v) for v in (0.0, 0.7, 1.0, 1.2, 3.1, 7, 11, 260)] == [
        1.0, 0.8, 1.0, 1.5, 4.0, 8.0, 15.0, 300.0]


def test_stats_line():
    summary = {"decode_tps": 42.123, "ttft_s": 0.314, "n_drafted": 120, "n_accepted": 84,
               "accept_rate": 0.7, "mean_accepted_length": 3.17, "stop_reason": "eos"}
    assert stats_line(summary) == "42.1 tok/s · first token in 0.31 s · drafted 120 / accepted 84 (70%) · 3.2 accepted per step"
    plain = {"decode_tps": 12.0, "ttft_s": 12.34, "n_drafted": 0, "n_accepted": 0, "stop_reason": "cancelled"}
    assert stats_line(plain) == "12.0 tok/s · first token in 12.3 s · no drafts · stopped"
    # Stats saved by an older version: what is missing is left out, never shown as 0 or NaN.
    assert stats_line({"n_predicted": 11, "decode_s": 2.0, "ttft_s": float("nan")}) == "5.0 tok/s"
    assert stats_line({}) == ""


def test_relative_time():
    now = time.mktime((2026, 11, 20, 15, 0, 0, 0, 0, -1))
    assert relative_time(now - 5, now) == "just now"
    assert relative_time(now - 300, now) == "5 min ago"
    assert relative_time(now - 3 * 3600, now) == "3 h ago"
    assert relative_time(now - 20 * 3600, now) == "yesterday"
    assert relative_time(now - 3 * 86400, now) == time.strftime("%a", time.localtime(now - 3 * 86400))
    assert relative_time(now - 30 * 86400, now) == "21 Oct"
    assert relative_time(now - 400 * 86400, now).endswith("2025")


def test_a_reply_of_one_step_reads_in_seconds(charts, qtbot):
    """One step spans milliseconds: the time axis stays at least a second wide and never shows
    pyqtgraph's SI scale ("time (s) (x0.001)")."""
    charts.reset(100.0)
    charts.add_step(step(100.001, 1))
    charts.add_step(step(100.003, 3, n_drafted=3, n_accepted=2))
    qtbot.waitUntil(lambda: not charts.is_dirty(), timeout=2000)
    item = charts._speed_plot.getPlotItem()
    low, high = item.viewRange()[0]
    assert high - low >= 1.0
    for plot in (charts._speed_plot, charts._accept_plot):
        axis = plot.getPlotItem().getAxis("bottom")
        assert axis.labelString().count("x0.") == 0 and "time (s)" in axis.labelString()


def test_a_reply_that_drafted_once_shows_its_acceptance(charts, qtbot):
    """Issue 52 item 12: 8 drafted and 1 accepted in one step drew a bar by position and nothing
    on the acceptance chart (one point of a line draws nothing); the whole-reply entry of its
    legend never drew either."""
    from app.ui.chat.charts import ACCEPT
    from tests.gui_support import shot

    charts.reset(100.0)
    charts.add_step(step(100.01, 1))
    charts.add_step(step(100.02, 1))
    charts.add_step(step(100.05, 2, n_drafted=8, n_accepted=1))
    charts.add_step(step(100.06, 1))
    qtbot.waitUntil(lambda: not charts.is_dirty(), timeout=2000)
    plot = charts._accept_plot
    inner = plot.grab(plot.getPlotItem().getViewBox().sceneBoundingRect().toRect().adjusted(2, 2, -2, -2))
    assert _image_colour_pixels(inner.toImage(), ACCEPT) >= 8, "no acceptance drawn for the step that drafted"
    assert len(charts.cumulative_acceptance_points()) == 1
    assert charts._cumulative_curve.opts["symbol"] is not None  # the whole reply's point draws too
    shot(charts, "52-12-acceptance-one-step")


def _image_colour_pixels(image, colour, tolerance: int = 40) -> int:
    count = 0
    for y in range(image.height()):
        for x in range(image.width()):
            c = image.pixelColor(x, y)
            if abs(c.red() - colour.red()) + abs(c.green() - colour.green()) + abs(c.blue() - colour.blue()) < tolerance:
                count += 1
    return count
