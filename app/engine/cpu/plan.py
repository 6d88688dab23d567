"""Which plan runs a model fastest on this CPU: float32, bf16 with dequantized weights, or bf16
with the file's int4 weights, each of the bf16 ones also with an int8 output projection
(app.engine.cpu.int8head) — chosen from measurements, never from a CPU flag.

The three differ the other way round on different CPUs (shared/facts.md): on AVX2 without bf16
instructions bf16 still decodes one token twice as fast as float32, but float32 verifies 16 drafts
for little more than one token while bf16's verify cost grows with every token. So the choice
needs the cost of a one-token step *and* of verifying a few drafts, for this model's shape, on
this machine (app.engine.cpu.calibrate measures them in a few seconds), and what drafting is
expected to accept:

    speed(plan) = max over k of E(alpha, k) / cost_plan(k + 1)

with E the expected tokens a step of k drafts yields (app.engine.schedule.expected_tokens) and
alpha 0 when nothing drafts. Drafting runs only on a plan whose verify gives bit for bit the
one-token steps' logits (the int4 plan) where one is offered: the others verify in batched
products, which can flip a near-tied greedy token. Curves are cached per machine, torch version
and model shape (`plans.json` beside the tokenizer cache) and redone by `specula calibrate MODEL`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from app.engine.cpu import rowexact
from app.engine.cpu.probe import cache_dir, machine_key, read_json, write_json
from app.engine.gguf_info import GGUFInfo
from app.engine.schedule import expected_tokens


# A one-token step and verifies of 1, 3, 7, 15 and 16 drafts. torch's int4 kernel computes rows in
# blocks of four: on AVX2 4 rows cost 1.4-1.9 times one row and 5 rows as much as 8, so a verify
# of 4 drafts is the dearest per token and one of 3 the cheapest; points at the ends of blocks
# see the cheap lengths, and CostCurve.cost holds a verify between two points at the later one's
# cost, which a draft length then never wastes. The last point is the longest verify at the
# default draft max (16, llama.cpp's): one row into a new block. Gemma 3 270M's 17-token step
# measured 1.11-1.20x its 16-token one in four calibrations on a Zen 3 (AVX2; SmolLM2 1.0-1.13x);
# extrapolated in proportion to its tokens, as before, it looked 1.06x, and the schedule drafted
# 16 after every run of 15.
MEASURED_TOKENS = (1, 2, 4, 8, 16, 17)
# What drafting is expected to accept when choosing a plan, before anything is generated: prompt
# lookup and draft models accept about half their tokens on llama.cpp users' mixed workloads
# (far more when rewriting, near none in free chat); the schedule then adapts within the plan.
EXPECTED_ACCEPTANCE = {"none": 0.0, "lookup": 0.5, "draft": 0.6}
# A step yields at most 1 / (1 - alpha) tokens on average, so a plan whose one-token step is this
# many times the fastest one's cannot win at any expected acceptance: its verifies are not timed.
HOPELESS_STEP_RATIO = 1.0 / (1.0 - max(EXPECTED_ACCEPTANCE.values()))
_CACHE_VERSION = 6  # 2: MEASURED_TOKENS at the ends of the int4 kernel's blocks; 3: int8 heads; 4: their cheaper verifies;
# 5: steps timed more often; 6: the 17-token verify


@dataclass(frozen=True)
class PlanOption:
    name: str  # "float32", "bf16", "bf16-int4", "bf16-i8head"...: what the window, inspect and bench show
    dtype: torch.dtype
    int4: bool
    # Whether a verify's rows are bit for bit the one-token steps' (the int4 plan's row-by-row
    # kernels, app.engine.cpu.rowexact): only then does greedy speculation keep plain decoding's
    # output exactly. The others verify in batched GEMMs and attention, whose other order of
    # accumulation flips near-ties: bf16 on Gemma 3 270M's rewrite prompt; float32 too, less
    # often (torch 2.13, AVX2: a 9-token verify of SmolLM2's logits differed from 9 one-token
    # steps by up to 4e-5, and a float32 GEMM's rows differ from one-row products from 2 rows on).
    exact_verify: bool = True
    # The output projection as int8 weights with exact products for the tokens that can lead
    # (app.engine.cpu.int8head) instead of the plan's own head; row-exact like the int4 kernel.
    int8_head: bool = False

    @property
    def label(self) -> str:
        body = {"float32": "float32", "bf16": "bf16 (dequantized weights)", "bf16-int4": "bf16 + int4 weights"}
        return body[self.name.removesuffix(_INT8_SUFFIX)] + (" + int8 head" if self.int8_head else "")


_INT8_SUFFIX = "-i8head"
FLOAT32 = PlanOption("float32", torch.float32, False, exact_verify=False)
BF16 = PlanOption("bf16", torch.bfloat16, False, exact_verify=False)
BF16_INT4 = PlanOption("bf16-int4", torch.bfloat16, True)
BF16_I8HEAD = PlanOption("bf16" + _INT8_SUFFIX, torch.bfloat16, False, exact_verify=False, int8_head=True)
BF16_INT4_I8HEAD = PlanOption("bf16-int4" + _INT8_SUFFIX, torch.bfloat16, True, int8_head=True)
OPTIONS = {o.name: o for o in (FLOAT32, BF16, BF16_INT4, BF16_I8HEAD, BF16_INT4_I8HEAD)}


def with_int8_head(option: PlanOption) -> PlanOption:
    """The bf16 plan of the same weights with an int8 head."""
    return OPTIONS[option.name.removesuffix(_INT8_SUFFIX) + _INT8_SUFFIX]


@dataclass(frozen=True)
class CostCurve:
    """Seconds of one main-model step feeding n tokens (logits of all n), at MEASURED_TOKENS; or
    only its one-token step, for a plan too slow to win by drafting (calibrate: pruned)."""

    seconds: tuple[float, ...]

    def cost(self, n_tokens: int) -> float:
        """The cost measured at the first point of at least n tokens (between two points a step
        may cost as much as at the later one: a new block of the int4 kernel's rows), beyond the
        last point in proportion to the tokens; n one-token steps where only that was measured."""
        if len(self.seconds) == 1:
            return self.seconds[0] * max(n_tokens, 1)
        for n, seconds in zip(MEASURED_TOKENS, self.seconds):
            if n_tokens <= n:
                return seconds
        return self.seconds[-1] * n_tokens / MEASURED_TOKENS[len(self.seconds) - 1]

    def relative_slope(self) -> float:
        """Extra cost per drafted token relative to a one-token step, over the longest verify measured."""
        drafts = MEASURED_TOKENS[max(len(self.seconds), 2) - 1] - 1
        return max((self.cost(drafts + 1) - self.cost(1)) / drafts / self.cost(1), 0.0)


@dataclass(frozen=True)
class PlanChoice:
    option: PlanOption
    reason: str
    curves: dict[str, CostCurve]

    @property
    def curve(self) -> CostCurve | None:
        return self.curves.get(self.option.name)


# Expected speeds this close count as a tie (choose): on a 2-core AVX-512 machine Gemma 3 270M's
# int4 and int4 + int8-head plans were both expected at 57 tok/s with lookup, and the int8 head's
# one-token step was 15% faster; the int4 one was chosen and decoded chat at 0.7x the other.
TIE_BAND = 0.05


def expected_speed(curve: CostCurve, alpha: float, k_max: int = 16) -> tuple[float, int]:
    """(tokens per second, best draft length) of a plan when drafts are accepted with rate alpha."""
    best = (1.0 / curve.cost(1), 0)
    if alpha <= 0:
        return best
    for k in range(1, k_max + 1):
        speed = expected_tokens(alpha, k) / curve.cost(k + 1)
        if speed > best[0]:
            best = (speed, k)
    return best


def choose(curves: dict[str, CostCurve], drafter: str) -> PlanChoice:
    """The plan of the highest expected speed with this drafter ("none", "lookup", "draft"), a
    tie (TIE_BAND) going to the faster one-token step."""
    alpha = EXPECTED_ACCEPTANCE.get(drafter, 0.0)
    left_out = []
    if drafter != "none" and any(OPTIONS[name].exact_verify for name in curves):
        # Speculation must not change the output: plans whose verify is not row-exact only decode.
        left_out = [name for name in curves if not OPTIONS[name].exact_verify]
    candidates = {name: curve for name, curve in curves.items() if name not in left_out}
    speeds = {name: expected_speed(curve, alpha) for name, curve in candidates.items()}
    plain = {name: 1.0 / curve.cost(1) for name, curve in candidates.items()}
    # Within TIE_BAND of the best expected speed (a guess from an assumed acceptance and verifies
    # timed once), the faster one-token step wins: it is measured more surely, and it is what a
    # reply runs at wherever drafts are rejected and the schedule stops drafting.
    best_expected = max(speed for speed, _ in speeds.values())
    tied = [name for name in speeds if speeds[name][0] >= (1 - TIE_BAND) * best_expected]
    best = max(tied, key=plain.__getitem__)
    # In a person's words (the plans' labels, not their cache names): the window shows this.
    others = ", ".join([f"{OPTIONS[n].label} {speeds[n][0]:.0f}" for n in speeds if n != best]
                       + [f"{OPTIONS[n].label} not with drafting (its verify is not row-exact)" for n in left_out])
    tie = ", the fastest one-token step of a tie" if speeds[best][0] < best_expected else ""
    if alpha > 0:
        drafting = {"lookup": "prompt lookup", "draft": "a draft model"}.get(drafter, drafter)
        reason = (f"measured: {speeds[best][0]:.0f} tok/s expected with {drafting} at {alpha:.0%} acceptance "
                  f"({plain[best]:.0f} plain{tie}); {others or 'no other plan'}")
    else:
        reason = f"measured: fastest one-token step, {plain[best]:.0f} tok/s; {others or 'no other plan'}"
    return PlanChoice(OPTIONS[best], reason, curves)


# --- the cache ----------------------------------------------------------------------------------


def cache_file() -> Path:
    return cache_dir() / "plans.json"


def shape_key(info: GGUFInfo, options: list[PlanOption]) -> str:
    """The model's shape and tensor types (what the cost depends on), not its name or values, and
    with int4 offered the layer types that load as bf16 rows instead on this CPU (a probe of each
    process, rowexact.replaces_int4, whose outcome changes the int4 plan's costs)."""
    types = sorted({f"{_short(t.name)}:{t.ggml_type}" for t in info.tensors})
    parts = [info.architecture, str(info.n_layers), str(info.vocab_size),
             *(f"{t.name}{list(t.shape)}" for t in info.tensors if t.name.startswith(("blk.0.", "token_embd", "output"))),
             *types, ",".join(o.name for o in options)]
    if any(o.int4 for o in options):
        as_bf16 = sorted({f"{_short(t.name)}:{t.ggml_type}" for t in info.tensors
                          if t.name.startswith("blk.") and rowexact.replaces_int4(t)})
        if as_bf16:
            parts.append("bf16 rows:" + ",".join(as_bf16))
    return "|".join(parts)


def _short(name: str) -> str:
    return name.split(".", 2)[-1] if name.startswith("blk.") else name


# Longer than this, a "step" is no measurement: a hand-edited or damaged cache.
_MAX_STEP_S = 3600.0


def cached_curves(info: GGUFInfo, options: list[PlanOption]) -> dict[str, CostCurve] | None:
    """This machine's curves for this shape, or None (a miss) when any value in the entry is not
    what calibrate writes: NaN, zero or negative seconds divided by zero or failed deep in the
    choice and the schedule, at every load and in `inspect`."""
    mine = _read_cache().get(machine_key())
    entry = mine.get(shape_key(info, options)) if isinstance(mine, dict) else None
    if not isinstance(entry, dict) or set(entry) != {o.name for o in options}:
        return None
    curves = {}
    for name, values in entry.items():
        seconds = _seconds(values)
        if seconds is None:
            return None
        curves[name] = CostCurve(seconds)
    return curves


def _seconds(values: object) -> tuple[float, ...] | None:
    """A stored curve: 1 or len(MEASURED_TOKENS) finite, positive, bounded numbers, else None."""
    if not isinstance(values, list) or len(values) not in (1, len(MEASURED_TOKENS)):
        return None
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v <= _MAX_STEP_S for v in values):
        return None  # NaN fails the comparison too
    return tuple(float(v) for v in values)


def store_curves(info: GGUFInfo, options: list[PlanOption], curves: dict[str, CostCurve]) -> None:
    data = _read_cache()
    mine = data.get(machine_key())
    data[machine_key()] = {**(mine if isinstance(mine, dict) else {}),
                           shape_key(info, options): {n: list(c.seconds) for n, c in curves.items()}}
    data["version"] = _CACHE_VERSION
    write_json(cache_file(), data)


def _read_cache() -> dict:
    """The cache, or {} when it is missing, unreadable or of another version (a miss, never an error)."""
    data = read_json(cache_file())
    return data if data.get("version") == _CACHE_VERSION else {}
