"""bf16 linears that compute each of a few rows exactly as that row alone would.

With int4 weights (app.engine.cpu.quantlinear) most matrices of a layer are computed row by row by
torch's int4 kernel, and attention takes one position at a time (app.engine.cpu.attention), so a
verify of k drafts gives bit for bit the rows of k one-token steps. The matrices left in bf16
(types the kernel cannot run: F16, BF16, Q2_K, Q3_K...) go through torch's bf16 GEMM, which takes
another kernel for several rows than for one. The two differ in their order of accumulation and,
with the model's own activations, in their handling of tiny values: for Gemma 3 270M, whose Q6_K
matrices went this way before they ran on the int4 kernel, the greedy logits of a 17-token verify
differed from decoding by up to 0.5, and a probe on random values does not find it (random
values have no denormals). So up to MAX_ROWS rows, each row is its own product, the very call
decoding makes; prompts (more rows than a verify has) run in one call.

Measured on those 9 matrices of 2.6 MB: a 5-token verify cost about 4 ms more (of 70), a 17-token
one about 10 ms more (of 135), for outputs that cannot differ from plain decoding. A matrix too
large to stay in the CPU's caches (over MAX_BYTES, as in 7B+ models) would be read from memory
once per row, so it keeps the batched product; there a near-tie can still flip a greedy token,
as before.
"""

from __future__ import annotations

import functools
import logging

import torch

from app.engine.cpu.probe import fastest, remembered
from app.engine.gguf_info import INT4_PASSES, int4_packable

from app.engine.cpu.attention import ROW_BY_ROW_QUERIES as MAX_ROWS  # the most rows a verify has

MAX_BYTES = 8 << 20
# How much cheaper bf16 rows must be than the int4 passes to replace them: a margin, so that the
# choice does not flip from one process to the next on a noisy machine.
_CLEAR_MARGIN = 0.8

log = logging.getLogger(__name__)


class RowExactLinear(torch.nn.Module):
    """A bf16 nn.Linear whose rows, up to MAX_ROWS at a time, are computed one by one."""

    def __init__(self, linear: torch.nn.Linear) -> None:
        super().__init__()
        self.linear = linear
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Always as 2-D rows: torch takes another path for [1, 1, K] than for [1, K].
        rows = x.reshape(-1, self.in_features)
        if rows.shape[0] == 1 or rows.shape[0] > MAX_ROWS:
            out = self.linear(rows)
        else:
            out = torch.cat([self.linear(rows[i : i + 1]) for i in range(rows.shape[0])])
        return out.reshape(*x.shape[:-1], self.out_features)


def wrap_linears(module: torch.nn.Module) -> int:
    """Make every bf16 CPU nn.Linear of at most MAX_BYTES under `module` row-exact; the number
    wrapped."""
    wrapped = 0
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            weight = getattr(child, "weight", None)
            if (type(child) is torch.nn.Linear and weight.dtype == torch.bfloat16 and weight.device.type == "cpu"
                    and stays_cached(weight.numel())):
                setattr(parent, name, RowExactLinear(child))
                wrapped += 1
    return wrapped


def stays_cached(n_weights: int) -> bool:
    """A bf16 matrix of this many weights is small enough (MAX_BYTES) to be computed row by row."""
    return n_weights * 2 <= MAX_BYTES


def replaces_int4(tensor) -> bool:
    """Whether a file's layer matrix (a GGUF tensor's type and shape) that the int4 kernel could
    run loads as bf16 computed row by row instead (app.engine.fastload; the plan cache's key):
    several passes, small enough to stay in the caches, and clearly cheaper so on this CPU
    (beats_int4_passes; Gemma 3 270M's Q6_K ffn_down on AVX2), the same bits in a verify as in
    decoding."""
    if not int4_packable(tensor.ggml_type, tensor.shape):
        return False
    n_passes, (n, k) = INT4_PASSES[tensor.ggml_type], tensor.shape
    return n_passes > 1 and stays_cached(n * k) and beats_int4_passes(n_passes)


@functools.cache  # asked for every matrix of a load
def beats_int4_passes(n_passes: int) -> bool:
    """Whether a bf16 copy of a matrix that stays in the CPU's caches, computed row by row as
    RowExactLinear does, costs clearly less than torch's int4 kernel in n_passes passes, for one
    token and for a verify of four alike (so that decoding and drafting both gain). On AVX2 (2
    threads, one run): an int4 pass 0.11 ms for one row and 0.20 for four, a bf16 row 0.14, so
    Q6_K's four passes lose and two passes (Q5_0, Q8_0) win. Measured once per machine
    (probe.remembered): a close call must not come out another way in the next process."""
    def measure() -> bool:
        int4_one, int4_four, bf16_row = _measured_costs()
        return (bf16_row < _CLEAR_MARGIN * n_passes * int4_one
                and 4 * bf16_row < _CLEAR_MARGIN * n_passes * int4_four)

    return remembered(f"bf16 rows beat {n_passes} int4 passes", measure)


@functools.cache
def _measured_costs() -> tuple[float, float, float]:
    """Seconds of one int4 pass for one and four rows and of one bf16 row, on a 640 x 2048
    matrix (Gemma 3 270M's Q6_K ffn_down), about 20 ms, where beats_int4_passes has no outcome
    kept for this machine; never read from a CPU flag."""
    from app.engine.cpu.quantlinear import GROUP  # quantlinear needs nothing from here: no cycle

    n, k = 640, 2048
    packed = torch._convert_weight_to_int4pack_for_cpu(torch.randint(0, 16, (n, k), dtype=torch.int32), 1)
    scales_zeros = torch.randn(k // GROUP, n, 2).to(torch.bfloat16)
    weight = torch.randn(n, k).to(torch.bfloat16)
    one, four = torch.randn(1, k).to(torch.bfloat16), torch.randn(4, k).to(torch.bfloat16)

    with torch.inference_mode():
        costs = (fastest(lambda: torch._weight_int4pack_mm_for_cpu(one, packed, GROUP, scales_zeros), 7),
                 fastest(lambda: torch._weight_int4pack_mm_for_cpu(four, packed, GROUP, scales_zeros), 7),
                 fastest(lambda: torch.nn.functional.linear(one, weight), 7))
    log.info("int4 pass %.3f / %.3f ms at 1 / 4 rows, bf16 row %.3f ms", *(c * 1e3 for c in costs))
    return costs
