"""A persistent CPU threadpool for each llama.cpp context, as llama.cpp's own programs attach one
(common_threadpools: `llama-server`, `llama-cli`).

Without one, ggml's CPU backend creates and joins a disposable threadpool in every llama_decode:
on a 2-core AMD EPYC (Zen 2) SmolLM2's one-token steps through the binding ran at 0.88x of
llama-server's on the same build flags, the same file and threads. The binding does not wrap
llama_attach_threadpool nor ggml_threadpool_new, so they are called here through ctypes, the pool
function found as common.cpp finds it (the CPU backend's registry: a variants build loads the CPU
backend at run time). `poll` is ggml's polling level (0: threads sleep between steps, 100: they
spin; llama.cpp's default 50)."""

from __future__ import annotations

import ctypes
import logging
import math
import time
from typing import Callable

from app.common.machine import OtherWork

log = logging.getLogger(__name__)

GGML_MAX_N_THREADS = 512  # ggml.h
GGML_BACKEND_DEVICE_TYPE_CPU = 0  # ggml-backend.h
DEFAULT_POLL = 50  # ggml_threadpool_params_default's


class ThreadpoolParams(ctypes.Structure):
    """ggml.h's struct ggml_threadpool_params."""

    _fields_ = [("cpumask", ctypes.c_bool * GGML_MAX_N_THREADS), ("n_threads", ctypes.c_int),
                ("prio", ctypes.c_int), ("poll", ctypes.c_uint32), ("strict_cpu", ctypes.c_bool),
                ("paused", ctypes.c_bool)]


_NEW = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.POINTER(ThreadpoolParams))
_FREE = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class Threadpool:
    """One ggml CPU threadpool of n_threads, attached to a llama_context until closed (after the
    context is freed)."""

    def __init__(self, ggml: ctypes.CDLL, llama: ctypes.CDLL, n_threads: int, poll: int = DEFAULT_POLL) -> None:
        self._free_fn = None
        self.pool = None
        found = _pool_functions(ggml)
        if found is None:
            return
        new, self._free_fn = found
        params = ThreadpoolParams()
        params.n_threads, params.prio, params.poll = n_threads, 0, max(0, min(int(poll), 100))
        self.pool = new(ctypes.byref(params)) or None
        self._llama = llama

    def attach(self, ctx) -> bool:
        """Attach to a context (for one-token and batch steps alike); False where no pool could be made."""
        if self.pool is None:
            return False
        attach = self._llama.llama_attach_threadpool
        attach.argtypes, attach.restype = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p], None
        attach(ctx, self.pool, self.pool)
        return True

    def close(self) -> None:
        pool, self.pool = self.pool, None
        if pool is not None and self._free_fn is not None:
            self._free_fn(pool)


class ThreadGovernor:
    """The thread count of each stretch of decoding: all of the context's threads while the
    machine is quiet, one fewer for each core other programs keep busy.

    llama.cpp's threads meet at a barrier after every operation of a step, so one that shares its
    core with a busy program holds all of them back: on a 2-core AMD EPYC (Zen 2), Gemma 3 270M
    decoded at 63 tok/s on two threads and 39 on one while quiet, but at 27 on two and 39 on one
    beside a process spinning on a core. Other programs' use is read from the OS (/proc/stat,
    this process's own time taken out) over windows of WINDOW_S; within a window nothing is read,
    so a step costs one clock read. Each llama.cpp step takes the count it is given
    (llama_set_n_threads); the pool's spare threads wait out of the way."""

    WINDOW_S = 0.5
    FIRST_WINDOW_S = 0.1  # after a pause: the first decision comes sooner
    PAUSE_S = 0.1  # no step for this long: the context paused (between replies)
    BUSY_CORE = 0.35  # other programs' use, in cores, that counts as a core taken

    def __init__(self, n_max: int, apply: Callable[[int], None]) -> None:
        self.n_max, self.current = n_max, n_max
        self._apply = apply
        self._window = OtherWork().start()
        self._window_s = self.FIRST_WINDOW_S
        self._last_end = time.monotonic()

    def after_step(self) -> None:
        self._last_end = time.monotonic()

    def before_step(self) -> None:
        now = time.monotonic()
        # A pause is the time since the last step ended: a step that itself ran past PAUSE_S (a
        # batch, a large model, or two threads beside a busy core: 0.5 s for a 65-token batch of
        # SmolLM2's) is no pause, and counting it as one restarted the window before every step,
        # so the count never came down where it was needed most.
        paused = now - self._last_end > self.PAUSE_S
        if paused:
            # What other programs did while this context was not decoding (another program's
            # reply, llama-server's: the bench runs them in turn) says little about now: it took
            # a thread off the first 15 steps of each of SmolLM2's replies there (13.3 ms a step
            # against 8.8). A fresh, short window decides. (A context that pauses this long
            # between every step, a main model waiting on a slow draft model, keeps its count:
            # the draft model's own context steps aside.)
            self._window, self._window_s = OtherWork().start(), self.FIRST_WINDOW_S
            return
        if now - self._window.started < self._window_s:
            return
        others = self._window.stop()
        self._window, self._window_s = OtherWork().start(), self.WINDOW_S
        if others is None:
            return
        wanted = max(1, self.n_max - math.floor(others + 1 - self.BUSY_CORE))
        if wanted != self.current:
            log.info("other programs use %.2f cores: llama.cpp decodes on %d of %d threads", others, wanted, self.n_max)
            self.current = wanted
            self._apply(wanted)


def _pool_functions(ggml: ctypes.CDLL):
    """(ggml_threadpool_new, ggml_threadpool_free) from the CPU backend's registry, or None."""
    try:
        by_type, reg_of, proc = (ggml.ggml_backend_dev_by_type, ggml.ggml_backend_dev_backend_reg,
                                 ggml.ggml_backend_reg_get_proc_address)
    except AttributeError:
        return None
    by_type.argtypes, by_type.restype = [ctypes.c_int], ctypes.c_void_p
    reg_of.argtypes, reg_of.restype = [ctypes.c_void_p], ctypes.c_void_p
    proc.argtypes, proc.restype = [ctypes.c_void_p, ctypes.c_char_p], ctypes.c_void_p
    device = by_type(GGML_BACKEND_DEVICE_TYPE_CPU)
    registry = reg_of(device) if device else None
    if not registry:
        return None
    new, free = proc(registry, b"ggml_threadpool_new"), proc(registry, b"ggml_threadpool_free")
    if not new or not free:
        log.info("llama.cpp's CPU backend offers no threadpool functions: one is made per step")
        return None
    return _NEW(new), _FREE(free)
