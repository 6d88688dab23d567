"""`specula --self-test OUT.png`: the real window, offscreen, through a whole speculative reply.

It uses a temporary data folder (never the user's chats or settings), loads the built-in demo
model with prompt lookup, sends one message that asks for a rewrite (prompt lookup pays off when
the reply copies from the prompt), waits for the streamed reply and the charts, saves a
screenshot of the whole window and prints one line. Any failure or a timeout exits non-zero with
the reason. The packaged app runs it to check itself.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from PySide6.QtCore import QObject, QTimer

from app.ui.common.paths import DATA_DIR_ENV
from app.worker.requests import LOOKUP, GenSettings

DEMO_MODEL = "smollm2-135m"
PROMPT = (
    "Rewrite this Python function with clearer variable names, keeping the logic:\n\n"
    "```python\ndef f(a, b):\n    c = 0\n    for d in a:\n        if d > b:\n            c = c + d\n    return c\n```"
)
TIMEOUT_S = 300.0


class SelfTest(QObject):
    """Drives the window step by step; `result` is (exit code, one line) when done."""

    def __init__(self, app, window, out: Path, timeout_s: float) -> None:
        super().__init__()
        self.app, self.window, self.out = app, window, out
        self.stage = "reading the model library"
        self.result: tuple[int, str] | None = None
        self.started = time.monotonic()
        self.summary: dict | None = None
        self.redraws_before = 0
        self.first_token_s: float | None = None  # process start -> first streamed token shown
        window.library.entriesChanged.connect(self._on_library)
        window.host.loaded.connect(self._on_loaded)
        # Bound methods of this QObject (on the GUI thread), never lambdas: a lambda connected to
        # the host's signals would run on the host's thread.
        window.host.loadFailed.connect(self._on_load_failed)
        window.controller.replyFinished.connect(self._on_reply)
        window.host.steps.connect(self._on_steps)
        QTimer.singleShot(int(timeout_s * 1000), lambda: self.fail(f"timed out after {timeout_s:.0f} s while {self.stage}"))

    def _on_library(self, entries: list) -> None:
        if self.stage != "reading the model library":
            return
        from app.hub.builtin import builtin_path

        try:
            path = str(builtin_path(DEMO_MODEL))
        except FileNotFoundError as exc:
            self.fail(str(exc))
            return
        picker = self.window.picker
        if not picker.select_main(path):
            entry = next((e for e in entries if e.path == path), None)
            self.fail(f"{DEMO_MODEL} is not usable: {entry.error if entry else 'not in the library'}")
            return
        picker.select_draft(LOOKUP)
        # Greedy, so the screenshot shows the model's own reply and a reproducible acceptance.
        self.window.gen_form.set_settings(GenSettings(temperature=0.0, max_tokens=160))
        self.stage = f"loading {DEMO_MODEL}"
        self.window.load_pair(picker.spec())

    def _on_load_failed(self, message: str) -> None:
        self.fail(f"loading failed: {message}")

    def _on_loaded(self, facts: dict) -> None:
        self.stage = "generating the reply"
        self.redraws_before = self.window.charts.redraw_count
        if not self.window.controller.send(PROMPT):
            self.fail("the message was not sent")

    def _on_steps(self, events) -> None:
        if self.first_token_s is None:
            self.first_token_s = seconds_since_launch()

    def _on_reply(self, summary: dict | None, error: str) -> None:
        if error or summary is None:
            self.fail(f"the reply failed: {error or 'no summary'}")
            return
        self.summary = summary
        self.stage = "waiting for the charts"
        QTimer.singleShot(400, self._capture)  # past the charts' own redraw timer

    def _capture(self) -> None:
        charts = self.window.charts
        charts.redraw()
        if not charts.rolling_tps_points() or charts.redraw_count <= self.redraws_before:
            self.fail("the charts were not updated during the reply")
            return
        self.app.processEvents()
        self.out.parent.mkdir(parents=True, exist_ok=True)
        if not self.window.grab().save(str(self.out), "PNG"):
            self.fail(f"cannot write the screenshot to {self.out}")
            return
        s = self.summary
        self.finish(0, (
            f"self-test ok: {DEMO_MODEL} + prompt lookup, {s['n_predicted']} tokens at "
            f"{s['decode_tps']:.1f} tok/s, drafted {s['n_drafted']} / accepted {s['n_accepted']} "
            f"({100 * s['accept_rate']:.0f}%), first token {self.first_token_s or 0:.1f} s after launch "
            f"(TTFT {s['ttft_s']:.2f} s), {time.monotonic() - self.started:.0f} s; screenshot {self.out}"
        ))

    def fail(self, reason: str) -> None:
        self.finish(1, f"self-test failed: {reason}")

    def finish(self, code: int, line: str) -> None:
        if self.result is None:
            self.result = (code, line)
            self.app.exit(code)


def seconds_since_launch() -> float:
    """Seconds since this process started (psutil comes with accelerate); since this module was
    imported if the start time cannot be read."""
    try:
        import psutil

        return time.time() - psutil.Process().create_time()
    except Exception:  # noqa: BLE001 (a measurement, never a reason to fail)
        return time.monotonic() - _IMPORTED


_IMPORTED = time.monotonic()


@contextmanager
def window_in_temp_data(prefix: str) -> Iterator[Any]:
    """The real window (MainWindow), shown, over a temporary data folder (never the user's chats
    or settings); closed and the folder removed after."""
    data = tempfile.mkdtemp(prefix=prefix)
    os.environ[DATA_DIR_ENV] = data
    window = None
    try:
        from app.ui.shell.main_window import MainWindow

        window = MainWindow()
        window.resize(1440, 900)
        window.show()
        yield window
    finally:
        if window is not None:
            window.close()
        shutil.rmtree(data, ignore_errors=True)


def run_self_test(app, out_png: str, timeout_s: float = TIMEOUT_S) -> int:
    from app.engine.errors import SpeculaError

    out = Path(out_png).expanduser().resolve()
    window = None
    try:
        with window_in_temp_data("specula-self-test-") as window:
            test = SelfTest(app, window, out, timeout_s)
            app.exec()
            code, line = test.result or (1, "self-test failed: the window closed early")
    except SpeculaError as exc:
        code, line = 1, f"self-test failed: {exc}"
    print(line, file=sys.stdout if code == 0 else sys.stderr)
    if window is not None and window.thread_stuck:
        # A load still running past its cancel: leave without destroying its thread (which
        # would abort the process).
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code or 1)
    return code
