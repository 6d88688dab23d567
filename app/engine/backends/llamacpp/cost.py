"""What a llama.cpp step feeding n tokens costs here, with the logits of all n (what a verify
needs): the draft-length schedule's prior (app.engine.loop.schedule), measured once per model, build,
thread count and CPU, and cached.

On a 2-core CPU llama.cpp's short batches cost nearly linearly in n (Gemma 3 270M: 17 tokens
7.7-12.6x one; facts.md), but the price per token keeps falling past that (llama.cpp switches to
its batched matrix kernels: 2 tokens 2.1x one, 3 tokens 3.35x, 9 tokens 4.65x on a Zen 4), so the
curve is measured out to 65 tokens: the schedule drafts long where a long copy or a learned
continuation supports it. On a GPU or a wide CPU a verify costs little more than a token.

The cache is a file the app reads: a damaged entry (keys that are not plain numbers, two keys for
one length, durations that are no measurement) is ignored and the curve measured again.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import time
from pathlib import Path
from typing import Callable

from app.common.atomic import read_json_object, write_json_object
from app.common.machine import OtherWork

log = logging.getLogger(__name__)

POINTS = (1, 2, 3, 5, 9, 17, 33, 65)
_CURVE_VERSION = "2"  # in the cache key: curves measured to fewer points are measured again
_CONTEXT = 64
_REPEATS = 3
_MIN_STEP_S, _MAX_STEP_S = 1e-6, 600.0  # a cached step outside these is no measurement
_MAX_POINT = 4096
MAX_OTHER_CORES = 0.25  # other programs' CPU use, on average, past which a timing is not kept


class StepCurve:
    """Seconds of a step feeding n tokens, between measured points linearly. A step feeding more
    tokens does more work than one feeding fewer, so a point below an earlier one (a one-token
    step timed while the machine was busy: a verify of 2 read as 0.68x one token, and the
    schedule priced drafts below a plain step) is raised to it."""

    def __init__(self, points: dict[int, float]) -> None:
        self.points: dict[int, float] = {}
        highest = 0.0
        for n, seconds in sorted(points.items()):
            highest = self.points[n] = max(highest, seconds)

    def cost(self, n: int) -> float:
        xs = list(self.points)
        if n <= xs[0]:
            return self.points[xs[0]]
        for lo, hi in zip(xs, xs[1:]):
            if n <= hi:
                t = (n - lo) / (hi - lo)
                return self.points[lo] * (1 - t) + self.points[hi] * t
        lo, hi = xs[-2], xs[-1]  # past the last point: the last segment's slope
        return self.points[hi] + (self.points[hi] - self.points[lo]) / (hi - lo) * (n - hi)

    def ratio(self, n: int) -> float:
        """A step of n tokens against a step of one."""
        return self.cost(n) / self.cost(1)


def measure(weights, cancel: Callable[[], bool] | None = None) -> tuple[StepCurve, bool]:
    """Fewest seconds of each step size after a short context (about a second on a small model),
    and whether the machine was quiet while measuring: other processes used under a quarter of a
    core (/proc/stat), and the one-token step's repeats were within 1.5x of each other. A busy
    machine's curve is used, but not cached: a browser at work would price every later run."""
    with OtherWork() as others:
        curve, steady = _measure(weights, cancel)
    if others.cores is not None and others.cores > MAX_OTHER_CORES:
        log.info("other programs used %.2f cores while llama.cpp's steps were measured", others.cores)
        steady = False
    return curve, steady


def _measure(weights, cancel: Callable[[], bool] | None) -> tuple[StepCurve, bool]:
    kv = weights.context(_CONTEXT + max(POINTS) + 8)
    try:
        tokens = [(7 * i + 3) % max(weights.n_vocab - 1, 1) for i in range(_CONTEXT + max(POINTS))]
        kv.feed_rows(tokens[:_CONTEXT], 1)
        kv.feed_rows(tokens[_CONTEXT:_CONTEXT + 4], 4)  # warm-up
        best = {n: math.inf for n in POINTS}
        ones: list[float] = []
        for _ in range(_REPEATS):
            for n in POINTS:
                if cancel is not None and cancel():
                    break
                kv.rewind(_CONTEXT)
                started = time.perf_counter()
                kv.feed_rows(tokens[_CONTEXT:_CONTEXT + n], n).argmax(n - 1)
                elapsed = time.perf_counter() - started
                best[n] = min(best[n], elapsed)
                if n == 1:
                    ones.append(elapsed)
        steady = len(ones) == _REPEATS and max(ones) <= 1.5 * min(ones)
        return StepCurve({n: s for n, s in best.items() if math.isfinite(s)} or {1: 1.0, 2: 2.0}), steady
    finally:
        kv.close()


def cache_file() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "specula" / "llamacpp-steps.json"


def _key(weights, build: str) -> str:
    return _file_key(weights.path, weights.settings, weights.n_gpu_layers, build)


def _file_key(path: Path, settings, n_gpu_layers: int, build: str) -> str:
    stat = path.stat()
    text = f"{path.name}:{stat.st_size}:{int(stat.st_mtime)}:{settings}:{n_gpu_layers}:{build}:v{_CURVE_VERSION}"
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def cached_curve(path: Path, settings, n_gpu_layers: int, build: str) -> StepCurve | None:
    """The curve measured when this file was loaded with these settings, layers offloaded and
    build; None where it never was (or its entry is damaged). Reads the cache, measures nothing."""
    try:
        key = _file_key(path, settings, n_gpu_layers, build)
    except OSError:
        return None
    points = _valid(read_json_object(cache_file()).get(key))
    return StepCurve(points) if points is not None else None


def _valid(points: object) -> dict[int, float] | None:
    """Cached points, or None where anything in them is not what `store` writes: keys that are
    the plain decimal numbers 1..4096 ("01" or "²" are not), one of them 1, durations between a
    microsecond and ten minutes."""
    if not isinstance(points, dict) or len(points) < 2:
        return None
    out: dict[int, float] = {}
    for n, s in points.items():
        if not (isinstance(n, str) and n.isascii() and n.isdigit() and str(int(n)) == n and 1 <= int(n) <= _MAX_POINT):
            return None
        if isinstance(s, bool) or not isinstance(s, (int, float)) or not _MIN_STEP_S <= s <= _MAX_STEP_S:
            return None
        out[int(n)] = float(s)
    return out if 1 in out else None


def step_curve(weights, build: str, cancel: Callable[[], bool] | None = None) -> StepCurve:
    """The cached curve for this model, build, settings and CPU, or measured now and cached."""
    cached = read_json_object(cache_file())
    key = _key(weights, build)
    points = _valid(cached.get(key))
    if points is not None:
        return StepCurve(points)
    damaged = cached.pop(key, None) is not None
    if damaged:
        log.warning("llama.cpp's cached step costs for %s were damaged: measured again", weights.path.name)
    curve, steady = measure(weights, cancel)
    if not steady:
        log.info("the CPU was busy while llama.cpp's steps were measured: not cached, measured again next load")
        if damaged:
            _write(cached)  # the damaged entry goes either way
        return curve
    log.info("llama.cpp step costs for %s: %s", weights.path.name,
             ", ".join(f"{n}: {s * 1000:.1f} ms" for n, s in curve.points.items()))
    store(weights, build, curve, cached)
    return curve


def store(weights, build: str, curve: StepCurve, cached: dict | None = None) -> None:
    """Keep this curve for the model, build, settings and CPU (replacing an older one)."""
    cached = read_json_object(cache_file()) if cached is None else cached
    cached[_key(weights, build)] = {str(n): s for n, s in curve.points.items()}
    _write(cached)


def _write(cached: dict) -> None:
    try:
        write_json_object(cache_file(), cached)
    except OSError as exc:
        log.warning("could not cache llama.cpp's step costs: %s", exc)
