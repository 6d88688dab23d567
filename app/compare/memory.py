"""Peak memory of one configuration: the process's resident set size, sampled while it runs.

ru_maxrss only ever grows over the whole process, and tracemalloc does not see torch's
allocations, so a background thread reads the current RSS (/proc/self/statm on Linux) every few
milliseconds and keeps the largest value since the last reset. Where there is no /proc (macOS,
Windows) the peak is unknown (None) rather than a misleading number.
"""

from __future__ import annotations

import os
import threading

SAMPLE_INTERVAL_S = 0.01  # a file read every 10 ms: well under 1 % of a core
_STATM = "/proc/self/statm"


def current_rss_bytes() -> int | None:
    try:
        with open(_STATM, "rb") as handle:
            resident_pages = int(handle.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return resident_pages * os.sysconf("SC_PAGE_SIZE")


class PeakRss:
    """`with PeakRss() as peak: ...; peak.reset(); ...; peak.value` — sampled on a daemon thread."""

    def __init__(self, interval_s: float = SAMPLE_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self._peak: int | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> PeakRss:
        self.reset()
        if current_rss_bytes() is not None:
            self._thread = threading.Thread(target=self._sample_loop, name="specula-rss", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(1.0)

    def reset(self) -> None:
        with self._lock:
            self._peak = current_rss_bytes()

    def sample(self) -> None:
        rss = current_rss_bytes()
        if rss is not None:
            with self._lock:
                self._peak = rss if self._peak is None else max(self._peak, rss)

    @property
    def value(self) -> int | None:
        self.sample()
        with self._lock:
            return self._peak

    def _sample_loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()
