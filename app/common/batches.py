"""Items handed from a worker thread to another thread's loop together: the first at once, then
at most every `every_s`. Each hand-off wakes the receiving thread (Qt's GUI thread, uvicorn's
event loop), and on two cores a woken thread takes its time from llama.cpp's, whose threads spin
while they wait for each other: a reply's steps at 100-200 a second cost a step more than their
own work. The receivers show text at 10-20 Hz, so nothing they show arrives later."""

from __future__ import annotations

import time
from typing import Any, Callable

EVERY_S = 0.05  # a reply's steps reach another thread at most 20 times a second


class Batcher:
    """add() items as they come, send() what is left at the end; `send` gets a tuple."""

    def __init__(self, send: Callable[[tuple], Any], every_s: float = EVERY_S) -> None:
        self._send = send
        self._every_s = every_s
        self._pending: list = []
        self._sent_at: float | None = None

    def add(self, item: Any) -> None:
        self._pending.append(item)
        if self._sent_at is None or time.monotonic() - self._sent_at >= self._every_s:
            self.send()

    def send(self) -> None:
        if self._pending:
            items, self._pending = tuple(self._pending), []
            self._send(items)
            self._sent_at = time.monotonic()
