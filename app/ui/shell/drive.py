"""`specula --drive-window`: the real window, offscreen, driven line by line from another process,
so that `specula bench --via window` times replies where most users meet them: the worker thread
beside Qt's GUI thread, the conversation streaming and the live charts redrawing.

It uses a temporary data folder (never the user's chats or settings: selftest.window_in_temp_data). Each line on stdin is one
JSON command; each answer is one JSON line on stdout:

    {"cmd": "load", "main": PATH, "drafter": KIND, "draft": PATH | null}  -> {"ok": true, "facts": {...}}
    {"cmd": "reply", "text": TEXT, "max_tokens": N, "plain": false}        -> {"ok": true, "summary": {...}}
    {"cmd": "quit"}

A reply starts a new chat first (each reply answers the same prompt afresh, as in the other
engines), and runs greedy with the window's other defaults. A failure is {"ok": false, "error": LINE}.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import threading
import time
from collections import deque

from PySide6.QtCore import QObject, Signal

from app.worker.requests import GenSettings


class Driver(QObject):
    """Runs one command at a time on the GUI thread, as a user's clicks would: the next waits
    until the one before it has answered."""

    command = Signal(dict)  # from the stdin reader thread, queued to the GUI thread

    def __init__(self, app, window) -> None:
        super().__init__()
        self.app, self.window = app, window
        self._started = (0.0, 0.0)
        self._waiting: deque[dict] = deque()
        self._busy = False
        self.command.connect(self._queue)
        window.host.loaded.connect(self._on_loaded)
        window.host.loadFailed.connect(self._on_failed)
        window.controller.replyFinished.connect(self._on_reply)

    def _queue(self, command: dict) -> None:
        self._waiting.append(command)
        self._next()

    def _next(self) -> None:
        if not self._busy and self._waiting:
            self._busy = True
            self._run(self._waiting.popleft())

    def _answer(self, message: dict) -> None:
        answer(message)
        self._busy = False
        self._next()

    def _run(self, command: dict) -> None:
        what = command.get("cmd")
        try:
            if what == "load":
                self._load(command)
            elif what == "reply":
                self._reply(command)
            elif what == "quit":
                self.app.exit(0)
            else:
                self._answer({"ok": False, "error": f"unknown command {what!r}"})
        except Exception as exc:  # noqa: BLE001 - one line back to the bench, never a dead window
            self._answer({"ok": False, "error": f"{type(exc).__name__}: {exc}"})

    def _load(self, command: dict) -> None:
        window, main = self.window, str(command["main"])
        draft = command.get("draft")
        window.library.add_files([p for p in (main, draft) if p])
        wait_until(self.app, lambda: not window.library.is_scanning()
                   and main in {e.path for e in window.library.entries()})
        if not window.picker.select_main(main):
            raise ValueError(f"{main} cannot be selected as the main model")
        if not window.picker.select_draft(command.get("drafter", "none"), draft):
            raise ValueError(f"drafter {command.get('drafter')!r} cannot be selected")
        window.load_pair(window.picker.spec())

    def _on_loaded(self, facts) -> None:
        shown = {k: v for k, v in dataclasses.asdict(facts).items() if isinstance(v, (str, int, float, type(None)))}
        self._answer({"ok": True, "facts": shown})

    def _on_failed(self, message: str) -> None:
        self._answer({"ok": False, "error": message})

    def _reply(self, command: dict) -> None:
        window = self.window
        window.controller.new_chat()
        window.gen_form.set_settings(GenSettings(temperature=0.0, max_tokens=int(command.get("max_tokens", 64))))
        # The chat frame, as the other ways get it: the window turns plain completion on for a
        # model without a chat template, which would answer another prompt.
        window.panel.plain_toggle.setChecked(bool(command.get("plain", False)))
        self._started = (time.thread_time(), time.monotonic())
        if not window.controller.send(str(command["text"])):
            raise ValueError("the message was not sent")

    def _on_reply(self, summary: dict | None, error: str) -> None:
        """The summary, and the GUI thread's CPU seconds against the reply's wall seconds: what
        the window itself took from the cores the engine's threads wanted meanwhile."""
        cpu, wall = (time.thread_time() - self._started[0], time.monotonic() - self._started[1])
        self._answer({"ok": not error and summary is not None, "summary": summary, "error": error,
                      "gui_cpu_s": cpu, "wall_s": wall})


def answer(message: dict) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def wait_until(app, done, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            raise TimeoutError("the library did not list the model")
        app.processEvents()
        time.sleep(0.01)


def read_commands(driver: Driver) -> None:
    """The reader thread: a line read blocks here (no GIL held), never the GUI thread."""
    for line in sys.stdin:
        if line.strip():
            try:
                driver.command.emit(json.loads(line))
            except json.JSONDecodeError as exc:
                answer({"ok": False, "error": f"not JSON: {exc}"})
    driver.command.emit({"cmd": "quit"})


def run_driver(app) -> int:
    from app.ui.shell.selftest import window_in_temp_data

    with window_in_temp_data("specula-drive-") as window:
        driver = Driver(app, window)
        threading.Thread(target=read_commands, args=(driver,), daemon=True, name="specula-drive-stdin").start()
        answer({"ok": True, "ready": True})
        return app.exec()
