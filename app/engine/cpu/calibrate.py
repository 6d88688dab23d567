"""Measure what a step costs in each plan, for one model's shape, in a few seconds.

Loading the real model three times would take longer than using it (dequantizing is most of a
load), so each plan is timed on a model of the same config (widths, heads, vocabulary, tensor
types) whose weights are zeros (dense kernels do not care about values; int4 weights of zero are
0x88 bytes in any packing layout), set up exactly as the loader sets up a real one
(app.engine.loader.prepare_cpu_model: int4 layers and head, float32 attention, row-exact
linears) and driven through the same KVModel. Small models are built whole; a large one with
_MAX_LAYERS layers, timed with its first layer and with all of them, which gives the cost of a
layer and of the rest (embedding, head): its step costs rest + n_layers * layer. Each figure is the
minimum of a few runs: another process on the machine only ever makes a run slower. Plans are
timed one after another, seconds apart, so a busy stretch can still slow one plan's runs and not
the next one's: a half-precision plan whose step comes out close to the fastest so far is timed
again in turns with it (_run_off), which decides between them.

Where the seconds go (Gemma 3 270M, AVX2, 2 threads, a noisy VM: 8.5-9 s in all, SmolLM2 3.2 s):
building the shaped models (3.7 s for Gemma's five; the first of each dtype fills a 262k-row
embedding that the others borrow), packing one int8 head for the plans with one (1.5 s for
Gemma's 262k rows), and the steps themselves; the run-offs, three of five rounds each, add about
0.7 s for SmolLM2 and 1.3 s for Gemma by their steps' times, within a busy hour's noise (with
them 4.2-5.5 s and 10.9-13.3 s in all, without 4.4-5.2 s and 9.6-12.0 s, the same hour). The
context the steps are timed from is put straight into the cache (_primed: 0.3-0.6 s per plan when it was fed as a prompt). Verifies are
timed only for plans that can win with drafts: not for a hopeless one, nor for bf16 with
dequantized weights, which plan.choose never lets draft while a row-exact plan is offered.
"""

from __future__ import annotations

import logging
import time
from typing import Callable

import torch
from transformers import AutoModelForCausalLM
from transformers.initialization import no_init_weights

from app.engine import fastload
from app.engine.cpu import quantlinear
from app.engine.cpu.int8head import Int8Head
from app.engine.cpu.plan import HOPELESS_STEP_RATIO, MEASURED_TOKENS, CostCurve, PlanOption
from app.engine.errors import LoadCancelled
from app.engine.fastload import packable_head_tensor, packable_layer_linear
from app.engine.gguf_info import INT4_PASSES, GGUFInfo
from app.engine.kvmodel import KVModel

log = logging.getLogger(__name__)

_MAX_LAYERS = 8
_WHOLE_BELOW_BYTES = 2 << 30  # models up to about 1B weights (bf16) are timed whole
CONTEXT = 32  # tokens already in the cache when steps are timed: a short chat turn
_REPEATS = 3  # timed runs of each verify: the schedule and the plan use their ratios to the one-token step
# Timed runs of the one-token step, the anchor of every ratio: a run slowed by the machine there
# made every verify look cheaper (SmolLM2, AVX-512, five calibrations with two runs each: its
# 8-token verify at 1.76-2.28x the step, 1.89-2.36x with three and five; run on the real model,
# 2.09x). Gemma 3 270M's calibration took 5.0-5.9 s on both kernel classes.
STEP_REPEATS = 5
_UNSTEADY_SPREAD = 1.5  # slowest / fastest run of one step beyond which the CPU was busy
# A plan whose one-token step is within this of the fastest one's is timed again in turns with it
# (_run_off): as far apart as one busy run can put them.
_RUNOFF_MARGIN = _UNSTEADY_SPREAD
_TOKENS_USED = 128  # token ids fed while timing: 1..CONTEXT, then 100..116


def measure(info: GGUFInfo, options: list[PlanOption], prepare: Callable[[torch.nn.Module, PlanOption], None],
            cancel: Callable[[], bool] | None = None) -> tuple[dict[str, CostCurve], bool]:
    """({option name: cost curve of the real model's steps}, steady). `prepare` is the loader's
    own CPU set-up (float32 attention, row-exact linears) applied to each shaped model. steady is
    False when repeated runs of the same step disagreed (another program was busy on the CPU):
    such curves serve this load but should not be kept."""
    started = time.monotonic()
    curves, spreads, fastest = {}, [], float("inf")
    leader: tuple[str, _Timer] | None = None  # the fastest plan so far, kept for a run-off (_run_off)
    # A run-off holds two half-precision models at once, about a float32 one's memory: only where
    # the float32 plan is offered, which the loader does where it fits (loader.cpu_plan_options).
    run_offs = any(o.dtype == torch.float32 for o in options)
    int8_heads: dict[tuple[int, int], Int8Head] = {}
    tables: dict = {}  # embedding tables shared by the shaped models (_fill)
    # A plan whose verify is not row-exact never runs drafts while an exact one is offered
    # (plan.choose), so its verifies are not timed.
    any_exact = any(o.exact_verify for o in options)
    # The plans likeliest to decode fastest first, so that a hopeless one is known as such before
    # its verifies are timed (HOPELESS_STEP_RATIO).
    for option in sorted(options, key=lambda o: (not o.int4, o.dtype == torch.float32)):
        if option.dtype == torch.float32:
            # The last plans: bf16's table and model are not needed beside float32's (which, twice
            # their size, never takes part in a run-off).
            tables.clear()
            leader = None
        model = shaped_model(info, option, tables)
        prepare(model, option)
        if option.int8_head:
            _install_int8_head(model, int8_heads)
        timer = _Timer(model, info.n_layers, cancel)
        step, spread = timer.time(MEASURED_TOKENS[:1], STEP_REPEATS)
        spreads.extend(spread)
        if step.seconds[0] > HOPELESS_STEP_RATIO * fastest or (any_exact and not option.exact_verify):
            curves[option.name] = step
        else:
            # Verifies are timed as often as the one-token step: the draft length and the plan
            # follow their ratios to it, and one timed run of each (before the cache's version 4)
            # put Gemma 3 270M's 8-token verify at 1.26x what five runs measured (48.5 ms against
            # 38.5, AVX-512); replayed through the schedule, that curve made the bench's
            # code-rewrite reply 1.97x plain decoding where the other made it 2.67x. Only the
            # one-token steps' spreads tell whether the CPU was busy.
            verifies, _ = timer.time(MEASURED_TOKENS[1:])
            curves[option.name] = CostCurve(monotone(step.seconds + verifies.seconds))
        if run_offs and timer.whole and option.dtype != torch.float32 and step.seconds[0] <= _RUNOFF_MARGIN * fastest:
            leader = (option.name, timer) if leader is None else _run_off(leader, (option.name, timer), curves)
        fastest = min(c.seconds[0] for c in curves.values())
        del model, timer
    steady = is_steady(spreads)
    log.info("calibrated %s in %.1fs%s: %s", info.path.name, time.monotonic() - started,
             "" if steady else " (the CPU was busy: not kept)",
             {n: [round(s * 1000, 1) for s in c.seconds] for n, c in curves.items()})
    return {o.name: curves[o.name] for o in options}, steady


def _run_off(leader: tuple[str, "_Timer"], challenger: tuple[str, "_Timer"],
             curves: dict[str, CostCurve]) -> tuple[str, "_Timer"]:
    """Time the one-token steps of two plans whose steps came out close in turns (A B A B...),
    scale each plan's curve to its fewest seconds there, and return the faster of the two: the one
    kept for the next run-off. Timed one after the other, seconds apart, whichever plan ran while
    another program was busy looked slower: on a busy 2-core Zen 3 SmolLM2's int8-head plan, 8-10%
    faster in a step and 15-20% in the bench's decoding, measured 1.19x slower and was left out.
    Only whole models in half precision (up to about 1B weights), where float32's fit in memory,
    take part: two cut large ones, or a float32 one beside another, could be more than it holds."""
    best = {leader[0]: float("inf"), challenger[0]: float("inf")}
    for _ in range(STEP_REPEATS):
        for name, timer in (leader, challenger):
            best[name] = min(best[name], timer.one_step())
    log.info("run-off of one-token steps: %s", {name: f"{curves[name].seconds[0] * 1e3:.1f} -> {seconds * 1e3:.1f} ms"
                                                for name, seconds in best.items()})
    for name, seconds in best.items():
        scale = seconds / curves[name].seconds[0]
        curves[name] = CostCurve(tuple(s * scale for s in curves[name].seconds))
    return min(leader, challenger, key=lambda entry: best[entry[0]])


def monotone(seconds: tuple[float, ...]) -> tuple[float, ...]:
    """Each point at most any later one: a step of fewer tokens does no more work than one of
    more, so a point above a later one was slowed by something else on the CPU."""
    return tuple(min(seconds[i:]) for i in range(len(seconds)))


def is_steady(spreads: list[tuple[float, float]]) -> bool:
    """(fastest, slowest) seconds of each step timed: steady unless a quarter of them differ by
    over _UNSTEADY_SPREAD times and a millisecond (tiny steps jitter by more than their size)."""
    unsteady = [s for s in spreads if s[1] > _UNSTEADY_SPREAD * s[0] and s[1] - s[0] > 1e-3]
    return len(unsteady) <= len(spreads) // 4


def shaped_model(info: GGUFInfo, option: PlanOption, tables: dict | None = None) -> torch.nn.Module:
    """The model's config, zero weights, in the option's dtype and weight form; large models
    with _MAX_LAYERS layers. tables, kept by the caller across shaped models of one model, lends
    each the embedding table an earlier one of its dtype filled (_fill)."""
    config = fastload.build_config(info)
    whole = info.memory_bytes("bfloat16") <= _WHOLE_BELOW_BYTES
    layers = info.n_layers if whole else min(_MAX_LAYERS, info.n_layers)
    config.num_hidden_layers = layers
    if getattr(config, "layer_types", None):
        config.layer_types = list(config.layer_types[:layers])
    with no_init_weights():
        model = AutoModelForCausalLM.from_config(config, dtype=option.dtype)
    if option.int4:  # first: the bf16 weights these replace are then never written
        _zero_int4_layers(model, info)
    _fill(model, {} if tables is None else tables)
    if option.int4 and not option.int8_head:
        _zero_int4_head(model, info)
    return model.eval()


def _install_int8_head(model: torch.nn.Module, built: dict[tuple[int, int], Int8Head]) -> None:
    """The shaped model's head as an int8 head (app.engine.cpu.int8head), built once per
    calibration (packing Gemma's 262k rows takes one or two seconds) and shared by every plan with
    one: their tables hold the same values (_fill)."""
    weight = model.get_output_embeddings().weight
    key = tuple(weight.shape)
    if key not in built:
        built[key] = Int8Head(weight)
    model.set_output_embeddings(built[key])


@torch.no_grad()
def _fill(model: torch.nn.Module, tables: dict) -> None:
    """Zero weights, but a random embedding and norms that pass it on, so that the final hidden
    state of a token is its own embedding, normalized: its logits then peak at that token, as a
    trained model's are peaked, and the int4 head's screening (app.engine.cpu.screen) narrows
    to a few candidates as it does on real text instead of giving up on a flat row.
    The embedding is the same in every plan of a dtype, so it is filled once and then taken from
    `tables` ({(shape, dtype): table}): zeroing Gemma's 262k rows took 0.3-0.4 s a plan in bf16."""
    embedding = model.get_input_embeddings().weight
    key = (tuple(embedding.shape), embedding.dtype)
    shared = tables.get(key)
    for parameter in model.parameters():
        if parameter is embedding and shared is not None:
            parameter.data = shared  # a tied head is the same parameter, and shares it too
        else:
            parameter.zero_()
    for module in model.modules():
        name = type(module).__name__
        if name.endswith("RMSNorm") and not name.startswith("Gemma"):  # Gemma scales by (1 + w)
            module.weight.fill_(1.0)
    used = embedding[:_TOKENS_USED]  # only the tokens timed: a 262k-row table would take seconds
    if shared is None:
        used.copy_(torch.randn(used.shape, generator=torch.Generator().manual_seed(0)))
        tables[key] = embedding.data
    head = model.get_output_embeddings().weight
    if head.data_ptr() != embedding.data_ptr() and head.shape == embedding.shape:
        head[:_TOKENS_USED].copy_(used)  # an untied head peaks alike (the int8 head's exact products)


def _zero_int4_layers(model: torch.nn.Module, info: GGUFInfo) -> None:
    """Each layer linear the loader would pack (fastload.packable_layer_linear) as an Int4Linear
    with the file's number of passes, all of zero weights."""
    types = {t.name: t for t in info.tensors}
    for gguf_name, hf_name in fastload.gguf_to_hf_names(model, info).items():
        tensor = types.get(gguf_name)
        linear = packable_layer_linear(model, hf_name, tensor) if tensor is not None else None
        if linear is None:
            continue
        parent, _, child = hf_name.rpartition(".")[0].rpartition(".")
        setattr(model.get_submodule(parent), child, _zero_int4(tensor.ggml_type, *tensor.shape, linear.bias))


def _zero_int4_head(model: torch.nn.Module, info: GGUFInfo) -> None:
    tensor = packable_head_tensor(model, info)
    if tensor is not None:
        model.set_output_embeddings(_zero_int4(tensor.ggml_type, *tensor.shape, None))


def _zero_int4(ggml_type: str, rows: int, k: int, bias) -> quantlinear.Int4Linear:
    """Weights (q - 8) * 0 + 0: every nibble 8, whatever the layout, and zero scales."""
    passes = [(torch.full((rows, k // 2), 0x88, dtype=torch.uint8),
               torch.zeros(k // quantlinear.GROUP, rows, 2, dtype=torch.bfloat16))
              for _ in range(INT4_PASSES[ggml_type])]
    return quantlinear.Int4Linear(passes, rows, k, bias)


class _Timer:
    """Times steps of a shaped model. A whole model keeps one KV cache, its context fed once for
    every timing; a cut one (large models) is timed whole and with its first layer, each time."""

    def __init__(self, model: torch.nn.Module, n_layers: int, cancel: Callable[[], bool] | None) -> None:
        self.model, self.n_layers, self.cancel = model, n_layers, cancel
        base = getattr(model, model.base_model_prefix)
        self.whole = len(base.layers) == n_layers
        self._kv = _primed(KVModel(model, n_ctx=CONTEXT + 64)) if self.whole else None

    @torch.inference_mode()
    def time(self, tokens: tuple[int, ...], repeats: int = _REPEATS) -> tuple[CostCurve, list[tuple[float, float]]]:
        """The real model's seconds for steps of these numbers of tokens, and the (fastest,
        slowest) run of each step timed."""
        if self.whole:
            full, spread = _step_costs(self._kv, self.cancel, tokens, repeats)
            return CostCurve(tuple(full[n] for n in tokens)), spread
        model = self.model
        base = getattr(model, model.base_model_prefix)
        built, all_layers = len(base.layers), base.layers
        full, spread = _step_costs(_primed(KVModel(model, n_ctx=CONTEXT + 64)), self.cancel, tokens, repeats)
        layer_types = getattr(model.config, "layer_types", None)
        one_kv = _primed(KVModel(_first_layer_only(model), n_ctx=CONTEXT + 64))
        one, one_spread = _step_costs(one_kv, self.cancel, tokens, repeats)
        base.layers, model.config.num_hidden_layers = all_layers, built  # as built, for the next timing
        if layer_types:
            model.config.layer_types = layer_types
        seconds = []
        for n in tokens:
            layer = max(full[n] - one[n], 0.0) / (built - 1)
            seconds.append(max(one[n] - layer, 0.0) + self.n_layers * layer)
        return CostCurve(tuple(seconds)), spread + one_spread

    @torch.inference_mode()
    def one_step(self) -> float:
        """Seconds of one more one-token step of a whole model (its cache is warm by then)."""
        return _timed_step(self._kv, self.cancel, 1)


def _primed(kv: KVModel) -> KVModel:
    """The cache holding CONTEXT positions, the context every step is timed from: zero keys and
    values put straight into each layer's cache, as the model's own update would put them there
    (a step's cost does not depend on their values; feeding the shaped model a prompt took
    0.3-0.6 s per plan, a fifth of Gemma's calibration)."""
    config = kv.model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    zeros = torch.zeros(1, config.num_key_value_heads, CONTEXT, head_dim, dtype=kv.model.dtype)
    with torch.inference_mode():
        for layer in range(config.num_hidden_layers):
            kv.cache.update(zeros, zeros, layer)
    kv.ids = list(range(1, CONTEXT + 1))
    return kv


def _first_layer_only(model: torch.nn.Module) -> torch.nn.Module:
    """The same model cut to its first layer (the cache is laid out from the config, so the
    config lists exactly the layers that run)."""
    base = getattr(model, model.base_model_prefix)
    base.layers = torch.nn.ModuleList(list(base.layers)[:1])
    model.config.num_hidden_layers = 1
    if getattr(model.config, "layer_types", None):
        model.config.layer_types = list(model.config.layer_types[:1])
    return model


def _step_costs(kv: KVModel, cancel: Callable[[], bool] | None, tokens: tuple[int, ...],
                repeats: int) -> tuple[dict[int, float], list[tuple[float, float]]]:
    """Minimum seconds of a step feeding n tokens and reading every position's greedy token (a
    verify of n - 1 drafts, all accepted), from the context of CONTEXT tokens the cache holds
    (_primed); and per n the (fastest, slowest) run."""
    best = {n: float("inf") for n in tokens}
    worst = {n: 0.0 for n in tokens}
    for repeat in range(repeats + 1):  # the first round (short) warms caches and allocators up
        for n in tokens if repeat else (tokens[0],):
            elapsed = _timed_step(kv, cancel, n)
            if repeat:
                best[n], worst[n] = min(best[n], elapsed), max(worst[n], elapsed)
    return best, [(best[n], worst[n]) for n in tokens]


def _timed_step(kv: KVModel, cancel: Callable[[], bool] | None, n: int) -> float:
    """Seconds of a step feeding n tokens after the primed context, reading every position's
    greedy token; the cache is rewound to the context after it."""
    if cancel is not None and cancel():
        raise LoadCancelled("loading cancelled")  # cancelled while measuring the plan
    started = time.perf_counter()
    rows = kv.feed_rows(list(range(100, 100 + n)), n)
    for i in range(n):
        rows.argmax(i)
    elapsed = time.perf_counter() - started
    kv.rewind(CONTEXT)
    return elapsed
