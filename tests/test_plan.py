"""The CPU plan: chosen from measured step costs for the model's shape, cached per machine, shown."""

from __future__ import annotations

import json

import pytest
import torch

from app.engine.cpu import calibrate, probe, quantlinear, rowexact
from app.engine.cpu import plan as cpu_plan
from app.engine.cpu.plan import CostCurve, choose, expected_speed
from app.engine.gguf_info import read_gguf_info
from app.engine.loader import cpu_plan_options, load_model
from app.engine.schedule import AdaptiveDraftLength
from tests.tiny_gguf import TinySpec, write_tiny_gguf

# Shapes seen on this workplace's AVX2 CPU (ms, SmolLM2-135M, one thread): float32's verify curve is
# flat, bf16's one-token step is fast and its verifies are not.
FLAT = CostCurve((0.066, 0.130, 0.153, 0.169, 0.212))
STEEP_FAST = CostCurve((0.054, 0.070, 0.130, 0.209, 0.360))


@pytest.fixture()
def plan_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    return tmp_path / "specula" / "plans.json"


@pytest.fixture(scope="module")
def tiny_q4_path(tmp_path_factory):
    return write_tiny_gguf(tmp_path_factory.mktemp("plan") / "q4.gguf", TinySpec(arch="llama", qtype="Q4_0", seed=6))


def test_the_fastest_one_token_step_wins_without_drafting():
    choice = choose({"float32": FLAT, "bf16-int4": STEEP_FAST}, "none")
    assert choice.option.name == "bf16-int4"
    assert "fastest one-token step" in choice.reason and "float32" in choice.reason


def test_a_flat_verify_curve_wins_when_drafts_are_expected_to_be_accepted(monkeypatch):
    """Among plans none of which verifies row-exactly (a file without int4-able tensors)."""
    monkeypatch.setitem(cpu_plan.EXPECTED_ACCEPTANCE, "lookup", 0.9)
    choice = choose({"float32": FLAT, "bf16": STEEP_FAST}, "lookup")
    assert choice.option.name == "float32"
    assert "90% acceptance" in choice.reason
    flat_speed, flat_k = expected_speed(FLAT, 0.9)
    assert flat_k >= 8 and flat_speed > expected_speed(STEEP_FAST, 0.9)[0]


def test_drafting_never_runs_on_a_plan_whose_verify_is_not_row_exact(monkeypatch):
    """float32 and bf16 with dequantized weights verify in batched GEMMs that can flip a near-tie:
    they may decode alone (bf16's one-token step is the fastest here), never verify drafts while
    the int4 plan is offered, however flat float32's verifies are."""
    monkeypatch.setitem(cpu_plan.EXPECTED_ACCEPTANCE, "lookup", 0.9)
    int4 = CostCurve(tuple(s * 1.5 for s in STEEP_FAST.seconds))
    curves = {"float32": FLAT, "bf16": STEEP_FAST, "bf16-int4": int4}
    assert not cpu_plan.FLOAT32.exact_verify and not cpu_plan.BF16.exact_verify and cpu_plan.BF16_INT4.exact_verify
    assert choose(curves, "none").option.name == "bf16"
    assert expected_speed(FLAT, 0.9)[0] > expected_speed(int4, 0.9)[0]
    for drafter in ("lookup", "draft"):
        choice = choose(curves, drafter)
        assert choice.option.name == "bf16-int4" and choice.option.exact_verify
        assert "bf16 (dequantized weights) not with drafting" in choice.reason and "float32 not with drafting" in choice.reason
    assert choose({"bf16": STEEP_FAST}, "lookup").option.name == "bf16"  # nothing exact to choose


def test_within_a_tie_of_expected_speeds_the_faster_one_token_step_wins():
    """Gemma 3 270M's curves measured on a 2-core AVX-512 machine (ms): both expected at 57 tok/s
    with lookup, the int8 head's one-token step 15% faster."""
    int4 = CostCurve(tuple(ms / 1000 for ms in (21.4, 26.1, 138.1, 62.3, 99.1)))
    int8_head = CostCurve(tuple(ms / 1000 for ms in (18.6, 26.5, 37.2, 46.7, 134.4)))
    assert expected_speed(int8_head, 0.5)[0] < expected_speed(int4, 0.5)[0]
    choice = choose({"bf16-int4": int4, "bf16-int4-i8head": int8_head}, "lookup")
    assert choice.option.name == "bf16-int4-i8head" and "tie" in choice.reason
    # Beyond the band the expected speed decides, however fast the one-token step.
    slow_verify = CostCurve((0.0186, 0.0400, 0.0600, 0.0900, 0.2000))
    assert choose({"bf16-int4": int4, "bf16-int4-i8head": slow_verify}, "lookup").option.name == "bf16-int4"
    assert "tie" not in choose({"bf16-int4": int4}, "lookup").reason


def test_a_curve_holds_the_next_points_cost_between_points_and_grows_in_proportion_beyond():
    assert cpu_plan.MEASURED_TOKENS == (1, 2, 4, 8, 16, 17)
    curve = CostCurve(FLAT.seconds + (0.262,))  # 17 rows: one into a new block
    assert curve.cost(1) == pytest.approx(0.066)
    assert curve.cost(3) == curve.cost(4) == pytest.approx(0.153)  # 3 rows may cost what a block of 4 does
    assert curve.cost(9) == curve.cost(16) == pytest.approx(0.212)
    assert curve.cost(17) == pytest.approx(0.262)
    assert curve.cost(24) == pytest.approx(0.262 * 24 / 17)
    # A curve without the last point grows in proportion from the last one it has.
    assert FLAT.cost(17) == pytest.approx(0.212 * 17 / 16)
    assert STEEP_FAST.relative_slope() == pytest.approx((0.360 - 0.054) / 15 / 0.054)


def test_a_curve_makes_drafts_end_at_its_points():
    """Between two points a verify costs as much as at the later one, so the best length fills
    a block: drafts + 1 is a measured point (here the int4 kernel's 4-row blocks on AVX2)."""
    int4_avx2 = CostCurve((0.036, 0.040, 0.050, 0.097, 0.190))  # SmolLM2-135M's shape
    for alpha in (0.5, 0.7, 0.9, 0.99):
        assert expected_speed(int4_avx2, alpha)[1] + 1 in cpu_plan.MEASURED_TOKENS
        k = AdaptiveDraftLength(16, int4_avx2.cost).length(100)
        assert k + 1 in cpu_plan.MEASURED_TOKENS


def test_a_load_with_auto_measures_once_and_then_reads_the_cache(tiny_q4_path, plan_cache, monkeypatch):
    calls = []
    measure = calibrate.measure
    # Counted, and taken as steady (a busy test machine may time a tiny model's steps unevenly:
    # that rule is tested on its own below).
    monkeypatch.setattr(calibrate, "measure", lambda *a, **k: calls.append(1) or (measure(*a, **k)[0], True))
    first = load_model(tiny_q4_path, device="cpu", backend="torch")
    assert calls == [1] and first.choice is not None and plan_cache.exists()
    names = {o.name for o in cpu_plan_options(first.info)}
    assert set(first.choice.curves) == names and {"float32", "bf16"} <= names
    assert all(c.seconds[0] > 0 for c in first.choice.curves.values())
    # The model runs in the chosen plan, and says so (never "int4" unless it is).
    assert first.plan.dtype == first.choice.option.dtype and first.plan.int4 == first.choice.option.int4
    assert ("int4" in first.plan.describe()) == first.choice.option.int4
    assert first.plan_reason.startswith("measured")
    assert first.kv_model().step_cost is not None
    second = load_model(tiny_q4_path, device="cpu", backend="torch")
    assert calls == [1] and second.choice.curves == first.choice.curves


def test_each_plan_feeds_its_context_once_and_an_inexact_plan_times_no_verifies(tiny_q4_path, monkeypatch):
    """The calibration's time goes to the steps it needs: one primed cache per plan, and no
    verifies for a plan that plan.choose never lets draft while an exact one is offered."""
    from app.engine.loader import prepare_cpu_model

    info = read_gguf_info(tiny_q4_path)
    primed, steps = [], []
    prime, step_costs = calibrate._primed, calibrate._step_costs
    monkeypatch.setattr(calibrate, "_primed", lambda kv: primed.append(kv) or prime(kv))
    monkeypatch.setattr(calibrate, "_step_costs", lambda kv, c, tokens, r: steps.append((id(kv), tokens)) or step_costs(kv, c, tokens, r))
    monkeypatch.setattr(calibrate, "HOPELESS_STEP_RATIO", float("inf"))  # every exact plan times its verifies
    options = cpu_plan_options(info)
    curves, _ = calibrate.measure(info, options, lambda m, o: prepare_cpu_model(m, o.dtype, o.int4))
    assert len(primed) == len(options)
    assert len(curves["bf16"].seconds) == 1
    assert all(len(curves[o.name].seconds) == len(cpu_plan.MEASURED_TOKENS) for o in options if o.exact_verify)
    # The verifies of a plan are timed on the cache its one-token steps were timed on.
    by_cache = {}
    for cache, tokens in steps:
        by_cache.setdefault(cache, []).append(tokens)
    n_exact = sum(o.exact_verify for o in options)
    assert sorted(map(len, by_cache.values())) == [1] * (len(options) - n_exact) + [2] * n_exact
    # Offered alone, bf16 is the one plan drafting can run on: its verifies are timed.
    alone, _ = calibrate.measure(info, [cpu_plan.BF16], lambda m, o: prepare_cpu_model(m, o.dtype, o.int4))
    assert len(alone["bf16"].seconds) == len(cpu_plan.MEASURED_TOKENS)


class _ScriptedTimer:
    """A plan's timer whose one-token steps take the seconds given, in turn (for _run_off)."""

    def __init__(self, name: str, seconds: list[float], log: list[str]) -> None:
        self.name, self.seconds, self.log = name, iter(seconds), log

    def one_step(self) -> float:
        self.log.append(self.name)
        return next(self.seconds)


def test_a_run_off_times_two_close_plans_in_turns_and_scales_their_curves():
    log: list[str] = []
    # Timed apart, "a" ran while the machine was busy: 30 ms against b's 25.
    curves = {"a": CostCurve((0.030, 0.060)), "b": CostCurve((0.025, 0.050))}
    a = ("a", _ScriptedTimer("a", [0.022, 0.021, 0.035, 0.020, 0.021], log))
    b = ("b", _ScriptedTimer("b", [0.026, 0.024, 0.025, 0.030, 0.024], log))
    assert calibrate._run_off(a, b, curves) is a  # the faster in turns, kept for the next run-off
    assert log == ["a", "b"] * calibrate.STEP_REPEATS
    # Each curve at its fewest seconds of the run-off, its verifies in the same ratio to its step.
    assert curves["a"].seconds == pytest.approx((0.020, 0.040))
    assert curves["b"].seconds == pytest.approx((0.024, 0.048))


def test_every_close_half_precision_plan_is_run_off_against_the_fastest(tiny_q4_path, monkeypatch):
    """On a whole model each bf16 plan whose step is close to the fastest one's is timed in turns
    with it; float32's are never kept beside another model, nor any where float32's do not fit."""
    from app.engine.loader import prepare_cpu_model

    info = read_gguf_info(tiny_q4_path)
    run_offs = []
    run_off = calibrate._run_off
    monkeypatch.setattr(calibrate, "_run_off", lambda l, c, curves: run_offs.append((l[0], c[0])) or run_off(l, c, curves))
    monkeypatch.setattr(calibrate, "_RUNOFF_MARGIN", float("inf"))  # every plan counts as close
    options = cpu_plan_options(info)
    curves, _ = calibrate.measure(info, options, lambda m, o: prepare_cpu_model(m, o.dtype, o.int4))
    half = [o.name for o in options if o.dtype != torch.float32]
    assert len(half) >= 2 and len(run_offs) == len(half) - 1
    assert {name for pair in run_offs for name in pair} == set(half)
    assert set(curves) == {o.name for o in options}
    # Where float32 does not fit in memory (the loader leaves it out), two models at once may not either.
    run_offs.clear()
    calibrate.measure(info, [o for o in options if o.dtype != torch.float32], lambda m, o: prepare_cpu_model(m, o.dtype, o.int4))
    assert run_offs == []


def test_the_cache_is_per_machine_and_torch_version(tiny_q4_path, plan_cache, monkeypatch):
    info = read_gguf_info(tiny_q4_path)
    options = cpu_plan_options(info)
    cpu_plan.store_curves(info, options, {o.name: CostCurve((0.01, 0.015, 0.02, 0.03, 0.04, 0.045)) for o in options})
    assert cpu_plan.cached_curves(info, options) is not None
    with monkeypatch.context() as patch:
        patch.setattr(torch, "__version__", "9.9.9")  # another torch: the entry does not apply
        assert cpu_plan.cached_curves(info, options) is None
    with monkeypatch.context() as patch:
        # another CPU class than this one's, whichever this one is
        other = "AVX2" if torch.backends.cpu.get_cpu_capability().startswith("AVX512") else "AVX512"
        patch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: other)
        assert cpu_plan.cached_curves(info, options) is None
    assert cpu_plan.cached_curves(info, options) is not None
    # Another shape (fewer plans to choose among) is another entry too.
    assert cpu_plan.cached_curves(info, [cpu_plan.FLOAT32]) is None
    # Layer matrices that load as bf16 rows instead of int4 on this CPU (a probe of each process)
    # change the int4 plan's costs: a flipped probe is another entry.
    with monkeypatch.context() as patch:
        patch.setattr(rowexact, "replaces_int4", lambda tensor: True)
        assert "bf16 rows:" in cpu_plan.shape_key(info, options)
        assert cpu_plan.cached_curves(info, options) is None
        assert "bf16 rows:" not in cpu_plan.shape_key(info, [cpu_plan.FLOAT32, cpu_plan.BF16])


def test_a_damaged_cache_is_a_miss_not_an_error(tiny_q4_path, plan_cache):
    plan_cache.parent.mkdir(parents=True)
    info = read_gguf_info(tiny_q4_path)
    for damage in ("{not json", json.dumps({"version": 1, cpu_plan.machine_key(): {"x": "y"}}), "[]"):
        plan_cache.write_text(damage)
        assert cpu_plan.cached_curves(info, cpu_plan_options(info)) is None
    curves = {o.name: CostCurve((0.01, 0.015, 0.02, 0.03, 0.04, 0.045)) for o in cpu_plan_options(info)}
    cpu_plan.store_curves(info, cpu_plan_options(info), curves)  # rewrites the damaged file
    assert cpu_plan.cached_curves(info, cpu_plan_options(info)) == curves


def test_curves_measured_on_a_busy_cpu_are_not_kept():
    quiet = [(0.020, 0.021)] * 12
    assert calibrate.is_steady(quiet)
    assert calibrate.is_steady(quiet[:9] + [(0.020, 0.060)] * 3)  # a few hiccups
    assert not calibrate.is_steady(quiet[:8] + [(0.020, 0.060)] * 4)
    assert calibrate.is_steady([(0.0005, 0.0012)] * 12)  # tiny steps jitter: not a busy CPU


def test_a_point_slowed_above_a_later_one_takes_the_later_ones_cost():
    # Gemma 3 270M's int4 curve as a busy AVX-512 VM once timed it (ms): 4 tokens above 8.
    assert calibrate.monotone((0.0187, 0.0202, 0.1380, 0.0620, 0.1690)) == (0.0187, 0.0202, 0.0620, 0.0620, 0.1690)
    assert calibrate.monotone((0.01, 0.02, 0.03)) == (0.01, 0.02, 0.03)


def test_a_probe_is_measured_once_per_machine_and_again_after_forget(plan_cache):
    """A close call measured in every process came out either way by chance (and changed the plan
    cache's key with it): the first outcome on a machine is kept, until `specula calibrate`."""
    measured = []

    def measure(outcome):
        return lambda: measured.append(outcome) or outcome

    assert probe.remembered("close call", measure(True)) is True
    assert probe.remembered("close call", measure(False)) is True  # kept: not measured again
    assert probe.remembered("other", measure(False)) is False
    assert measured == [True, False]
    kept = json.loads((plan_cache.parent / "probes.json").read_text())
    assert kept == {probe.machine_key(): {"close call": True, "other": False}}
    probe.forget()
    assert probe.remembered("close call", measure(False)) is False
    (plan_cache.parent / "probes.json").write_text("{damaged")
    assert probe.remembered("close call", measure(True)) is True  # a damaged file is a miss


def test_an_unwritable_probe_cache_only_means_measuring_again(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))  # specula/ cannot be made under a file
    assert probe.remembered("close call", lambda: True) is True
    assert probe.remembered("close call", lambda: False) is False


def test_plans_that_do_not_fit_in_memory_are_left_out(tiny_q4_path, monkeypatch):
    info = read_gguf_info(tiny_q4_path)
    bf16_bytes = info.memory_bytes("bfloat16") + max(t.n_elements for t in info.tensors) * 4
    monkeypatch.setenv("SPECULA_MEMORY_LIMIT", str(bf16_bytes + 1))
    names = [o.name for o in cpu_plan_options(info)]
    assert "float32" not in names and "bf16" in names


def test_turning_int4_off_removes_its_plan(tiny_q4_path):
    info = read_gguf_info(tiny_q4_path)
    assert "bf16-int4" not in [o.name for o in cpu_plan_options(info, int4=False)]
    if quantlinear.int4_available():
        assert "bf16-int4" in [o.name for o in cpu_plan_options(info)]


@pytest.mark.parametrize("name", ["float32", "bf16", "bf16-int4"])
def test_the_shaped_model_computes_what_a_real_load_of_its_plan_would(tiny_q4_path, name):
    """Same modules, same CPU set-up as the loader's (its weights are zeros), so timing it times
    the plan."""
    info = read_gguf_info(tiny_q4_path)
    option = cpu_plan.OPTIONS[name]
    if option.int4 and not quantlinear.int4_available():
        pytest.skip("torch has no int4 CPU kernel here")
    shaped = calibrate.shaped_model(info, option)
    real = load_model(tiny_q4_path, device="cpu", dtype="float32" if name == "float32" else "bfloat16",
                      int4=option.int4).model
    kinds = lambda model: sorted(type(m).__name__ for m in model.modules())  # noqa: E731
    from app.engine.loader import prepare_cpu_model

    prepare_cpu_model(shaped, option.dtype, option.int4)
    assert kinds(shaped) == kinds(real)
    assert next(shaped.parameters()).dtype == option.dtype


def test_shaped_models_of_one_calibration_share_a_table_and_compute_as_one_built_alone(tiny_q4_path):
    """The embedding table is filled once per dtype and lent to the next shaped model (zeroing
    Gemma's took a third of a second a plan): each computes what it would with its own."""
    from app.engine.kvmodel import KVModel
    from app.engine.loader import prepare_cpu_model

    info = read_gguf_info(tiny_q4_path)
    names = ["bf16-int4", "bf16"] if quantlinear.int4_available() else ["bf16", "bf16"]
    tables: dict = {}
    lent = [calibrate.shaped_model(info, cpu_plan.OPTIONS[name], tables) for name in names]
    alone = [calibrate.shaped_model(info, cpu_plan.OPTIONS[name]) for name in names]
    assert len(tables) == 1
    first, second = (model.get_input_embeddings().weight for model in lent)
    assert first.data_ptr() == second.data_ptr() != alone[1].get_input_embeddings().weight.data_ptr()
    for name, ours, theirs in zip(names, lent, alone):
        option = cpu_plan.OPTIONS[name]
        logits = []
        for model in (ours, theirs):
            prepare_cpu_model(model, option.dtype, option.int4)
            with torch.inference_mode():
                logits.append(KVModel(model, n_ctx=32).feed_rows([3, 5, 7], 3).all())
        assert torch.equal(*logits)


@pytest.mark.parametrize("name", ["float32", "bf16", "bf16-int4"])
def test_the_timed_context_is_the_cache_the_shaped_model_would_fill(tiny_q4_path, name):
    """The calibration puts zero keys and values straight into the cache instead of feeding the
    shaped model a prompt: its zero projections would have written exactly these, so each step
    is timed on the same cache as before, in every layout and dtype."""
    from app.engine.kvmodel import KVModel
    from app.engine.loader import prepare_cpu_model

    option = cpu_plan.OPTIONS[name]
    if option.int4 and not quantlinear.int4_available():
        pytest.skip("torch has no int4 CPU kernel here")
    shaped = calibrate.shaped_model(read_gguf_info(tiny_q4_path), option)
    prepare_cpu_model(shaped, option.dtype, option.int4)
    fed = KVModel(shaped, n_ctx=96)
    with torch.inference_mode():
        fed.feed(list(range(1, calibrate.CONTEXT + 1)), 1)
    primed = calibrate._primed(KVModel(shaped, n_ctx=96))
    assert primed.ids == fed.ids and primed.cache.get_seq_length() == fed.cache.get_seq_length()
    assert len(primed.cache.layers) == len(fed.cache.layers)
    for ours, theirs in zip(primed.cache.layers, fed.cache.layers):
        assert ours.keys.dtype == theirs.keys.dtype and torch.equal(ours.keys, theirs.keys)
        assert torch.equal(ours.values, theirs.values)
    with torch.inference_mode():  # and a step runs on it
        assert primed.feed_rows([5, 6], 2).argmax(1) == fed.feed_rows([5, 6], 2).argmax(1)


def test_the_schedule_starts_from_the_measured_curve():
    """With a steep curve the first drafts are short, with a flat one long, before any step."""
    steep = AdaptiveDraftLength(16, STEEP_FAST.cost).length(100)
    flat = AdaptiveDraftLength(16, FLAT.cost).length(100)
    assert steep < flat and flat >= 8


def test_rejected_probes_back_off_until_probing_costs_almost_nothing():
    schedule = AdaptiveDraftLength(16, STEEP_FAST.cost)
    lengths = []
    for _ in range(2000):
        k = schedule.length(10_000)
        lengths.append(k)
        schedule.update(k, 0, STEEP_FAST.cost(k + 1))
    late = lengths[1000:]
    probe_cost = sum(STEEP_FAST.cost(k + 1) - STEEP_FAST.cost(1) for k in late)
    assert probe_cost / (len(late) * STEEP_FAST.cost(1)) < 0.01
    assert 1 in late  # it still probes
    # One accepted probe brings drafting back at once.
    while schedule.length(10_000) == 0:
        pass
    schedule.update(1, 1, STEEP_FAST.cost(2))
    assert schedule.probe_interval() < 64
