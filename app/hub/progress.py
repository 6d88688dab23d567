"""Download progress as plain immutable events: bytes, total, speed, time left.

The meter is fed by the download's file wrapper on every chunk and calls the user's callback at most
ten times a second (plus every phase change), so a window or a terminal bar never floods.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

EMIT_INTERVAL_S = 0.1
SPEED_WINDOW_S = 5.0


@dataclass(frozen=True)
class DownloadProgress:
    repo_id: str
    filename: str  # the model's file (first part when split)
    part: int  # 1-based part being transferred
    n_parts: int
    done: int  # bytes on disk, all parts
    total: int
    speed: float  # bytes per second over the last few seconds (0 until known)
    eta: float | None  # seconds left, None until the speed is known
    phase: str  # "checking" (hashing a partial), "downloading", "verifying", "done"
    resumed_from: int  # bytes already there when this attempt started

    @property
    def fraction(self) -> float:
        return self.done / self.total if self.total else 1.0


class Meter:
    """Counts bytes across the parts of one download and reports DownloadProgress."""

    def __init__(self, callback: Callable[[DownloadProgress], None] | None, repo_id: str,
                 filename: str, n_parts: int, total: int, done_before: int) -> None:
        self.callback, self.repo_id, self.filename = callback, repo_id, filename
        self.n_parts, self.total = n_parts, total
        self.part = 1
        self._finished = done_before  # bytes of parts already complete
        self._current = 0  # bytes of the part in progress
        self.resumed_from = done_before
        self._phase = "downloading"
        self._samples: deque[tuple[float, int]] = deque()
        self._last_emit = 0.0

    @property
    def done(self) -> int:
        return self._finished + self._current

    def start_part(self, index: int, resume: int) -> None:
        self.part, self._current = index, resume
        self.resumed_from = self.done
        self._samples.clear()
        self.phase("downloading")

    def finish_part(self) -> None:
        self._finished, self._current = self._finished + self._current, 0

    def checking(self, hashed: int) -> None:
        """Progress while hashing an existing partial before resuming it."""
        self._current = hashed
        self._phase = "checking"
        self._emit(force=False)

    def advance(self, n: int) -> None:
        self._current += n
        self._emit(force=False)

    def rewind(self, current: int) -> None:
        self._current = current
        self._samples.clear()

    def phase(self, name: str) -> None:
        self._phase = name
        self._emit(force=True)

    def _speed(self, now: float) -> float:
        self._samples.append((now, self.done))
        while len(self._samples) > 2 and now - self._samples[0][0] > SPEED_WINDOW_S:
            self._samples.popleft()
        t0, d0 = self._samples[0]
        return (self.done - d0) / (now - t0) if now - t0 >= 0.2 else 0.0

    def _emit(self, force: bool) -> None:
        now = time.monotonic()
        speed = self._speed(now)
        if self.callback is None or (not force and now - self._last_emit < EMIT_INTERVAL_S):
            return
        self._last_emit = now
        left = max(self.total - self.done, 0)
        eta = left / speed if speed > 0 else (0.0 if left == 0 else None)
        self.callback(DownloadProgress(self.repo_id, self.filename, self.part, self.n_parts,
                                       self.done, self.total, speed, eta, self._phase,
                                       self.resumed_from))
