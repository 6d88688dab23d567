"""Facts about this machine that need no torch: memory and CPU features.

The hub (fit checks) and the loader (memory checks) must agree on them, and the hub must start
without importing torch, so they live here.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

_UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def _meminfo(key: str) -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _sysconf_bytes(pages: str) -> int | None:
    try:
        return os.sysconf(pages) * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def memory_limit_bytes() -> int | None:
    """Memory a model may use: SPECULA_MEMORY_LIMIT (bytes, or with a K/M/G suffix) when set,
    else what the OS reports as available; None where neither is known."""
    override = os.environ.get("SPECULA_MEMORY_LIMIT")
    if override:
        suffix = override[-1].upper()
        return int(float(override[:-1]) * _UNITS[suffix]) if suffix in _UNITS else int(override)
    found = _meminfo("MemAvailable")
    return found if found is not None else _sysconf_bytes("SC_AVPHYS_PAGES")


def ram_total() -> int | None:
    found = _meminfo("MemTotal")
    return found if found is not None else _sysconf_bytes("SC_PHYS_PAGES")


def _busy_jiffies() -> int | None:
    """Clock ticks all CPUs have spent working since boot (/proc/stat's first line: user, nice,
    system, irq, softirq, steal), or None where the OS does not say."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()
        user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields[1:9])
    except (OSError, ValueError, IndexError):
        return None
    return user + nice + system + irq + softirq + steal


class OtherWork:
    """How much CPU other processes used between start and stop (or while a `with` block ran),
    in cores (0.5: half a core on average): what a timing needs to know to be trusted. `cores`
    is None where the OS does not say (then nothing is known, and callers fall back on their own
    checks)."""

    def __init__(self) -> None:
        self.cores: float | None = None
        self.started = 0.0

    def start(self) -> "OtherWork":
        self._busy, self._own, self.started = _busy_jiffies(), _own_cpu_s(), time.monotonic()
        return self

    def stop(self) -> float | None:
        busy, wall = _busy_jiffies(), time.monotonic() - self.started
        if self._busy is not None and busy is not None and wall > 0:
            all_s = (busy - self._busy) / os.sysconf("SC_CLK_TCK")
            self.cores = max(0.0, all_s - (_own_cpu_s() - self._own)) / wall
        return self.cores

    def __enter__(self) -> "OtherWork":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _own_cpu_s() -> float:
    times = os.times()
    return times.user + times.system


def _spin(stop, cpu: int) -> None:
    os.sched_setaffinity(0, {cpu})
    while not stop.is_set():
        pass


class BusyCore:
    """Another program at work: a child process spinning on one CPU (the first this process may
    use, unless named) while the block runs. For measuring a busy desktop (`specula bench-busy`)
    and testing what the app does beside one."""

    def __init__(self, cpu: int | None = None, settle_s: float = 0.3) -> None:
        self.cpu = min(os.sched_getaffinity(0)) if cpu is None else cpu
        self._settle_s = settle_s

    def __enter__(self) -> "BusyCore":
        import multiprocessing

        self._stop = multiprocessing.Event()
        self._child = multiprocessing.Process(target=_spin, args=(self._stop, self.cpu), daemon=True)
        self._child.start()
        time.sleep(self._settle_s)  # let it take its core
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._child.join()
