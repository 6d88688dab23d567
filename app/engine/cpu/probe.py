"""Timing the CPU's kernels once per process, for choices measured rather than read from a flag
(app.engine.cpu.screen.screening_pays, app.engine.cpu.rowexact.beats_int4_passes)."""

from __future__ import annotations

import time
from typing import Callable


def fastest(run: Callable[[], object], repeats: int, warmups: int = 1) -> float:
    """The fewest seconds of `repeats` runs, after `warmups` runs not timed (the first calls pick
    kernels and allocate); another program on the machine only ever makes a run slower."""
    for _ in range(warmups):
        run()
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - started)
    return best
