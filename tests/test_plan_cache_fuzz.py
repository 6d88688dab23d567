"""plans.json and probes.json are files anyone (or a crash, or a full disk) may have written: any
value that is not what calibrate writes is a cache miss, never an error at load or in `inspect`.
The fuzz test is bounded in time and seeded, so it runs in the normal suite."""

from __future__ import annotations

import json
import math
import random
import time

import pytest

from app.engine.cpu import plan as cpu_plan
from app.engine.cpu import probe
from app.engine.cpu.plan import MEASURED_TOKENS, CostCurve, choose, expected_speed
from app.engine.gguf_info import read_gguf_info
from app.engine.loader import cpu_plan_options
from app.engine.schedule import AdaptiveDraftLength
from tests.tiny_gguf import TinySpec, write_tiny_gguf

GOOD = [0.01, 0.015, 0.02, 0.03, 0.04, 0.045]
FUZZ_SECONDS = 3.0


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    folder = tmp_path / "specula"
    folder.mkdir()
    return folder


@pytest.fixture(scope="module")
def info(tmp_path_factory):
    path = tmp_path_factory.mktemp("plan-fuzz") / "q4.gguf"
    return read_gguf_info(write_tiny_gguf(path, TinySpec(arch="llama", qtype="Q4_0", seed=6)))


def _plans(info, curves: dict) -> str:
    key = cpu_plan.shape_key(info, cpu_plan_options(info))
    return json.dumps({"version": cpu_plan._CACHE_VERSION, probe.machine_key(): {key: curves}})


def _use(curves: dict[str, CostCurve]) -> None:
    """What a load does with cached curves: choose a plan, then schedule drafts on its curve."""
    for drafter in ("none", "lookup", "draft"):
        choice = choose(curves, drafter)
        expected_speed(choice.curve, 0.5)
        schedule = AdaptiveDraftLength(16, choice.curve.cost)
        assert 1 <= schedule.probe_interval() and 0 <= schedule.length(16) <= 16


@pytest.mark.parametrize("bad", [float("nan"), 0, -0.01, float("inf"), 1e400, True, "0.01", None, [0.01],
                                 10**400, 1e300])
def test_a_curve_with_a_value_calibrate_never_writes_is_a_miss(cache, info, bad):
    names = [o.name for o in cpu_plan_options(info)]
    curves = {name: list(GOOD) for name in names}
    curves[names[-1]][2] = bad
    (cache / "plans.json").write_text(_plans(info, curves))
    assert cpu_plan.cached_curves(info, cpu_plan_options(info)) is None
    curves[names[-1]][2] = 0.02
    (cache / "plans.json").write_text(_plans(info, curves))
    _use(cpu_plan.cached_curves(info, cpu_plan_options(info)))


@pytest.mark.parametrize("name", ["plans.json", "probes.json"])
def test_deeply_nested_or_odd_cache_files_are_a_miss(cache, info, name):
    for text in ("[" * 100_000 + "]" * 100_000, '{"a":' * 100_000 + "1" + "}" * 100_000,
                 json.dumps({"version": cpu_plan._CACHE_VERSION, probe.machine_key(): [1, 2]}),
                 json.dumps({probe.machine_key(): [True]})):
        (cache / name).write_text(text)
        assert cpu_plan.cached_curves(info, cpu_plan_options(info)) is None
        assert probe.remembered("close call", lambda: True) is True
        (cache / name).write_text(text)  # remembered() rewrote it
    cpu_plan.store_curves(info, cpu_plan_options(info), {o.name: CostCurve(tuple(GOOD)) for o in cpu_plan_options(info)})


def test_the_schedule_survives_a_curve_of_infinite_cost():
    schedule = AdaptiveDraftLength(8, lambda n: 0.01 if n == 1 else float("inf"))
    assert schedule.probe_interval() >= 1 and schedule.length(8) == 0


def _mutate(rng: random.Random, value):
    """A random damage of one leaf, one container, or the text."""
    odd = [float("nan"), float("inf"), -1, 0, 1e308, 10**30, "x", None, True, [], {}, [[[]]], -0.0, 1e-320]
    if isinstance(value, dict) and value and rng.random() < 0.8:
        key = rng.choice(list(value))
        return {**value, key: _mutate(rng, value[key])}
    if isinstance(value, list) and value and rng.random() < 0.8:
        i = rng.randrange(len(value))
        return value[:i] + [_mutate(rng, value[i])] + value[i + 1:]
    return rng.choice(odd)


def test_fuzzed_plan_and_probe_caches_are_misses_or_usable(cache, info):
    rng = random.Random(42)
    options = cpu_plan_options(info)
    key = cpu_plan.shape_key(info, options)
    good = {"version": cpu_plan._CACHE_VERSION,
            probe.machine_key(): {key: {o.name: list(GOOD) for o in options}}}
    probes = {probe.machine_key(): {"close call": True, "other": False}}
    deadline, runs = time.monotonic() + FUZZ_SECONDS, 0
    while time.monotonic() < deadline:
        text = json.dumps(_mutate(rng, good))
        if rng.random() < 0.2:  # damage the text itself: cut, or a byte changed
            cut = rng.randrange(len(text))
            text = text[:cut] if rng.random() < 0.5 else text[:cut] + chr(rng.randrange(32, 127)) + text[cut + 1:]
        (cache / "plans.json").write_text(text)
        curves = cpu_plan.cached_curves(info, options)
        if curves is not None:
            assert all(all(math.isfinite(s) and s > 0 for s in c.seconds) for c in curves.values())
            assert all(len(c.seconds) in (1, len(MEASURED_TOKENS)) for c in curves.values())
            _use(curves)
        (cache / "probes.json").write_text(json.dumps(_mutate(rng, probes)))
        assert isinstance(probe.remembered("close call", lambda: False), bool)
        runs += 1
    assert runs > 20
