"""llama.cpp's step-cost cache (app.engine.backends.llamacpp.cost) is a file the app reads: a
damaged entry is ignored and the curve measured again, never a traceback; the curve reaches long
drafts (65 tokens)."""

from __future__ import annotations

import json
import math
import os

import pytest

from app.engine.backends.llamacpp import cost as llamacpp_cost
from app.common.machine import BusyCore, OtherWork
from tests.llama_support import llama_loaded, require_llama_cpp  # noqa: F401 - fixture


@pytest.mark.parametrize("points", [
    {"1": 0.01, "01": 0.02},           # two keys for one length: an IndexError once
    {"1": 0.01, "²": 0.02},            # isdigit() but not int(): a ValueError once
    {"1": 5e-324, "2": 0.02},          # no measurement: "a verify costs infx a token"
    {"1": 0.01, "2": 1e308},
    {"1": 0.01, "2": True},
    {"1": 0.01, " 2": 0.02},
    {"2": 0.01, "3": 0.02},            # no one-token step to compare with
    {"1": 0.01, "99999999999999999999": 0.02},
    {"1": 0.01, "-2": 0.02},
    {"1": 0.01, "2": "0.02"},
    [0.01, 0.02],
])
def test_a_damaged_entry_is_not_a_curve(points):
    assert llamacpp_cost._valid(points) is None


def test_what_store_writes_is_read_back():
    curve = llamacpp_cost.StepCurve({n: 0.001 * n for n in llamacpp_cost.POINTS})
    written = {str(n): s for n, s in curve.points.items()}
    assert llamacpp_cost._valid(written) == curve.points


def test_the_curve_reaches_long_drafts():
    assert max(llamacpp_cost.POINTS) >= 64


@pytest.mark.parametrize("damage", [{"1": 0.01, "01": 0.02}, {"1": 0.01, "²": 0.5}, {"1": 5e-324, "2": 1e308}])
def test_a_damaged_cache_is_measured_again(llama_loaded, damage):  # noqa: F811
    """The real loader's weights, a damaged entry under their very key: the curve is measured
    again (finite, every point) and the entry replaced."""
    weights = llama_loaded("llama-f32").model
    build = "test-build"
    key = llamacpp_cost._key(weights, build)
    path = llamacpp_cost.cache_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    cached = json.loads(path.read_text()) if path.exists() else {}
    cached[key] = damage
    path.write_text(json.dumps(cached))
    curve = llamacpp_cost.step_curve(weights, build)
    assert set(curve.points) == set(llamacpp_cost.POINTS)
    assert all(math.isfinite(curve.ratio(n)) and curve.ratio(n) > 0 for n in (1, 4, 16, 64))
    stored = json.loads(path.read_text()).get(key)
    assert stored is None or llamacpp_cost._valid(stored) is not None  # replaced (unless the CPU was busy)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs: one busy, one measuring")
def test_a_curve_measured_beside_a_busy_core_is_not_cached(tiny_paths):
    """Another process spinning on one core while llama.cpp's steps are measured on the other (a
    browser at work beside a one-thread run): the steps themselves look steady, yet the curve only
    serves this run and is not cached (issue 51 item 2). The machine's own accounting
    (/proc/stat) says so, not the step times."""
    require_llama_cpp()
    from app.engine.backends.llamacpp.kv import LlamaSettings
    from app.engine.loader import load_model

    weights = load_model(tiny_paths["llama-f32"], backend="llama.cpp", llama=LlamaSettings(threads=1)).model
    build = "test-build-busy"
    key = llamacpp_cost._key(weights, build)
    mine = os.sched_getaffinity(0)
    busy_cpu, own_cpu = sorted(mine)[:2]
    with BusyCore(busy_cpu):
        os.sched_setaffinity(0, {own_cpu})
        try:
            with OtherWork() as others:
                curve = llamacpp_cost.step_curve(weights, build)
        finally:
            os.sched_setaffinity(0, mine)
    assert others.cores is not None and others.cores > llamacpp_cost.MAX_OTHER_CORES
    assert set(curve.points) == set(llamacpp_cost.POINTS)
    path = llamacpp_cost.cache_file()
    assert not path.exists() or key not in json.loads(path.read_text())
