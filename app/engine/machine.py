"""Facts about this machine that need no torch: memory and CPU features.

The hub (fit checks) and the loader (memory checks) must agree on them, and the hub must start
without importing torch, so they live here.
"""

from __future__ import annotations

import os
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
