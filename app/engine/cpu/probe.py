"""Timing the CPU's kernels, for choices measured rather than read from a flag
(app.engine.cpu.screen.screening_pays, app.engine.cpu.rowexact.beats_int4_passes), and
remembering their outcomes per machine.

A probe's outcome is kept in `probes.json` beside the plan cache (app.engine.cpu.plan), under the
same machine key. Measured afresh in every process, a close call came out either way by chance:
on a 2-core VM with AVX2 kernels, whether Gemma 3 270M's Q6_K ffn_down loads as bf16 rows
flipped between two loads, and with it the plan cache's key, so the second load measured its
plans again (10 s, 2.7 GB at its peak) and chose another plan. `specula calibrate` measures them
again (forget).
"""

from __future__ import annotations

import json
import logging
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Callable

import torch

log = logging.getLogger(__name__)


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


def cache_dir() -> Path:
    """Where measurements of this machine are kept (XDG_CACHE_HOME's specula folder)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "specula"


def machine_key() -> str:
    """This CPU as torch sees it: model name, the kernels torch dispatches to, threads, version."""
    return "|".join([_cpu_model(), torch.backends.cpu.get_cpu_capability(), str(torch.get_num_threads()),
                     torch.__version__, platform.machine()])


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def remembered(name: str, measure: Callable[[], bool]) -> bool:
    """The outcome of the probe `name` on this machine: as first measured here, else measured now
    and kept (an unwritable cache only means measuring again next time)."""
    data = read_json(_path())
    entry = data.get(machine_key())
    entry = entry if isinstance(entry, dict) else {}
    if isinstance(entry.get(name), bool):
        return entry[name]
    outcome = bool(measure())
    data[machine_key()] = {**entry, name: outcome}
    write_json(_path(), data)
    return outcome


def forget() -> None:
    """Drop this machine's probe outcomes: the next ones are measured again."""
    data = read_json(_path())
    if data.pop(machine_key(), None) is not None:
        write_json(_path(), data)


def _path() -> Path:
    return cache_dir() / "probes.json"


# Far more than a machine's plans and probes take (a few KB); a larger file is not ours.
_MAX_CACHE_BYTES = 4 << 20


def read_json(path: Path) -> dict:
    """A cache file's object, or {} when it is missing, unreadable, not a regular file, too large
    or not an object (a miss, never an error). The caller checks every value it takes from it."""
    try:
        if not path.is_file() or path.stat().st_size > _MAX_CACHE_BYTES:
            return {}  # a FIFO would block the read; a huge file would only cost memory
        data = json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError):  # RecursionError: 100,000 nested brackets
        return {}
    return data if isinstance(data, dict) else {}


def write_json(path: Path, data: dict) -> None:
    """Write a cache file whole (a temporary file renamed over it: never a half-written one); a
    failure is a warning in the log, and the measurement is only not kept."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=f".{path.stem}-", delete=False) as out:
            json.dump(data, out)
        os.replace(out.name, path)
    except OSError as exc:
        log.warning("could not save %s: %s", path, exc)
