"""The window keeps quiet while a reply decodes (issue 61): on two cores a paint that falls on
a decoding step costs llama.cpp's spinning threads more than its own time. The start of a reply
(the message sent, the cleared charts, the buttons) is painted before the model gets it, and the
text cursor does not blink meanwhile.
"""

from __future__ import annotations

from PySide6.QtCore import QEvent, QObject
from PySide6.QtWidgets import QApplication

from app.ui.common.budget import TimedPlotWidget
from app.worker.requests import NONE
from tests.gui_support import LONG, WAIT_MS, add_models, load_pair, open_window, send, start_reply


class PaintLog(QObject):
    """Which of the watched widgets painted, in order."""

    def __init__(self, widgets: dict[str, object]) -> None:
        super().__init__()
        self.painted: list[str] = []
        self._names = {}
        for name, widget in widgets.items():
            self._names[widget] = name
            widget.installEventFilter(self)

    def eventFilter(self, watched, event) -> bool:  # noqa: N802 (Qt's name)
        if event.type() == QEvent.Type.Paint:
            self.painted.append(self._names[watched])
        return False


def test_the_start_of_a_reply_is_painted_before_the_model_gets_it(qtbot, data_dir, tiny_paths, monkeypatch):
    window = open_window(qtbot)
    add_models(qtbot, window, [tiny_paths["llama-f32"]])
    load_pair(qtbot, window, tiny_paths["llama-f32"], NONE)
    send(qtbot, window, "Tell me about foxes.")  # the charts now hold a reply, for the next one to clear
    # The speed plot held the last reply's points, which the new reply clears; the acceptance
    # plots had none (no drafter) and may have nothing to repaint.
    speed = [p for p in window.charts.findChildren(TimedPlotWidget) if "Tokens per second" in p.getPlotItem().titleLabel.text]
    assert len(speed) == 1 and window.charts.tps_points()
    watched = {"speed plot": speed[0].viewport(), "conversation": window.panel.view.viewport()}
    log = PaintLog(watched)
    qtbot.wait(200)
    log.painted.clear()

    painted_when_asked: list[list[str]] = []
    generate = window.host.generate

    def generate_after_noting_the_paints(request) -> None:
        painted_when_asked.append(list(log.painted))
        generate(request)

    monkeypatch.setattr(window.host, "generate", generate_after_noting_the_paints)
    with qtbot.waitSignal(window.controller.replyFinished, timeout=WAIT_MS):
        start_reply(qtbot, window, "And about wolves?")
    assert len(painted_when_asked) == 1
    assert set(painted_when_asked[0]) == set(watched), (
        f"painted before the model got the reply: {painted_when_asked[0]}; all of {sorted(watched)} should have")


def test_the_text_cursor_stays_still_while_a_reply_streams(qtbot, data_dir, tiny_paths):
    """Each blink repaints the message box twice a second, during the reply too; it shows,
    steady, until the reply ends, then blinks at the desktop's rate again."""
    window = open_window(qtbot)
    add_models(qtbot, window, [tiny_paths["llama-f32"]])
    load_pair(qtbot, window, tiny_paths["llama-f32"], NONE)
    desktop_rate = QApplication.cursorFlashTime()
    assert desktop_rate > 0
    during: list[int] = []
    window.host.steps.connect(lambda _events: during.append(QApplication.cursorFlashTime()))
    send(qtbot, window, "Tell me about foxes.", LONG)
    assert during and set(during) == {0}
    assert QApplication.cursorFlashTime() == desktop_rate
