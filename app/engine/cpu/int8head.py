"""The output projection as int8 weights in torch's quantized engine (fbgemm on x86, qnnpack on
arm64), each row of logits computed exactly as that row alone would be.

A decoding step's largest read is its output projection (Gemma 3 270M: 262k tokens by 640, two
thirds of its weights). On a CPU without bf16 instructions, torch's bf16 and int4 products cost
almost as much for each extra row as for the first. fbgemm's int8 kernels do not (AVX2, 2 threads,
Gemma's head):

    rows     1     8     16
    bf16     34   206   409 ms
    int4     30   114   275
    int8     19    50   100   (this head, its exact products included)

Two properties make it fit speculative decoding:

- **Row-exact.** Dynamic quantization takes the activations' scale from the whole input, so a
  row's result would depend on the rows beside it. Instead, each row is scaled to a largest
  magnitude of 0.99 and two columns of +1 and -1 (against zero weights) are appended. Every input's
  range is then [-1, 1], and its scale and zero point are constants. The product sums integers
  (exact in any order, for any number of rows) and scales them by constants. A row's logits
  therefore do not depend on which rows, or how many, go with it (tests/test_int8head.py).
- **Accurate.** One 7-bit part (fbgemm's reduced range) would be coarse for Gemma's hidden states,
  whose largest value is 80 times their typical one. So each row goes as two rows: its 7-bit part
  and the 7-bit part of what remains, about 13 bits together. The weights are the head's (the
  file's values, dequantized) rounded to int8 per output row. On Gemma 3 270M's Q8_0 head the
  logits differ from the bf16 product's by 0.06 on average; the bf16 product rounds its own outputs
  by up to 0.125.

Its numbers differ from the bf16 head's as bf16's differ from float32's. So the head is part of the
plan (app.engine.cpu.plan), measured against the others, and decoding and verifying always use
the same head.

torch 2.13 marks its quantized-tensor constructors deprecated. Where a later torch drops them, or
has no quantized engine, `available()` is False and the plans keep their own heads.
"""

from __future__ import annotations

import functools
import logging
import warnings
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import torch

from app.engine.errors import LoadCancelled

log = logging.getLogger(__name__)

_ROW_PEAK = 0.99  # each row's largest magnitude, inside the fixed range [-1, 1]
# Rows packed at a time. fbgemm's packing slows down with the matrix (Gemma's head: 6.3 s in one
# piece, 1.2 s in 32k-row pieces on two threads), and a piece's product costs the same per row.
_PIECE_ROWS = 32768
# Rows quantized at a time: their float32 copy (2.5 MiB for Gemma) stays in the CPU's caches
# through the block's few passes, which then cost a third of what they cost on 16k-row blocks.
_QUANTIZE_ROWS = 1024
_PAD = 32  # K is padded to a multiple of this: the two range columns, then zeros
_SAFETY = 1.25  # on the bounds (on Gemma 3 270M's hidden states the error reaches a fifth of its bound)
_ABSOLUTE_SLACK = 1e-4
_CHUNK = 1024
# Heads smaller than this (8 MiB in bf16) stay in the CPU's caches, where their product is a small
# part of a step: plans with an int8 head are not offered (nor measured) for them.
MIN_WEIGHTS = 4 << 20
_EXACT_ROWS = 16384  # (row, token) pairs whose exact products are computed at a time


def _engine() -> str | None:
    """The quantized engine to pack for: x86 (fbgemm for linears) or fbgemm where torch has one,
    qnnpack on arm64; None without any."""
    engines = torch.backends.quantized.supported_engines
    return next((name for name in ("x86", "fbgemm", "qnnpack") if name in engines), None)


class Int8Head(torch.nn.Module):
    """A bias-free output projection whose logits are its bf16 table's float32 products wherever
    they could be a row's largest, and int8 products elsewhere (see the module's docstring)."""

    def __init__(self, table: torch.Tensor, cancel: Callable[[], bool] | None = None) -> None:
        """table: the projection's weights [out_features, in_features] (bf16: the tied embedding or
        the output matrix), kept for the exact products. cancel is asked between pieces."""
        super().__init__()
        engine = _engine()
        if engine is None:
            raise RuntimeError("this torch has no quantized engine")
        n, k = table.shape
        self.table, self.out_features, self.in_features = table, int(n), int(k)
        self._width = (k + 2 + _PAD - 1) // _PAD * _PAD
        # fbgemm's AVX2 kernels add pairs of u8 x s8 products in int16: 7-bit activations never
        # saturate there (pytorch's default for fbgemm and x86).
        self._reduce = engine in ("x86", "fbgemm")
        self._step = 2.0 / (127 if self._reduce else 255)  # of the fixed range [-1, 1]
        self._ends = torch.zeros(1, self._width - k)
        self._ends[0, :2] = torch.tensor([1.0, -1.0])
        pieces = [(first, min(first + _PIECE_ROWS, n)) for first in range(0, n, _PIECE_ROWS)]
        # The warnings filter is the process's: set here, around both threads, never inside one
        # (catch_warnings is not thread-safe). torch 2.13 marks the constructors deprecated (see
        # the module's docstring).
        with warnings.catch_warnings(), _engine_set(engine), ThreadPoolExecutor(2) as pool:
            warnings.simplefilter("ignore", UserWarning)
            # fbgemm's packing releases the GIL: two pieces at a time.
            packed = list(pool.map(lambda piece: self._packed(*piece, cancel), pieces))
        self._pieces = [p for p, _, _ in packed]
        # Per token: the int8 step D (|w - w~| <= D / 2: slack per unit of |x|_1, with room for
        # the float32 roundings of the scales and the engine's output) and |w~|_1 <= |w|_1 + K D/2
        # (per unit of the inputs' rounding).
        steps = torch.cat([step for _, step, _ in packed])
        self._weight_slack = steps * (0.5 + 2.0**-12)
        self._abs_sums = torch.cat([sums for _, _, sums in packed]).add_(steps, alpha=k / 2)
        self._most_slack = float(self._weight_slack.max()), float(self._abs_sums.max())

    def _packed(self, first: int, stop: int, cancel: Callable[[], bool] | None):
        if cancel is not None and cancel():
            raise LoadCancelled("loading cancelled")
        with torch.inference_mode():  # a pool's thread: inference mode is per thread
            n, k = stop - first, self.in_features
            values = torch.zeros(n, self._width, dtype=torch.int8)
            sums, step = torch.empty(n), torch.empty(n)
            for lo in range(0, n, _QUANTIZE_ROWS):
                hi = min(lo + _QUANTIZE_ROWS, n)
                block = self.table[first + lo : first + hi].float()
                # amax and amin each cost a fifth of aminmax's one pass (torch 2.13, AVX2).
                step[lo:hi] = torch.maximum(block.amax(1), block.amin(1).neg_()).div_(127.0)
                sums[lo:hi] = block.abs().sum(1)
                values[lo:hi, :k] = block.div_(step[lo:hi].clamp_min(1e-30)[:, None]).round_()
            quantized = torch._make_per_channel_quantized_tensor(
                values, step.clamp_min(1e-30).double(), torch.zeros(n, dtype=torch.long), 0)
            return torch.ops.quantized.linear_prepack(quantized, None), step, sums

    @torch.inference_mode()
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """float32 logits [..., out_features] of hidden rows [..., in_features] (any float dtype)."""
        rows = x.reshape(-1, self.in_features).float()
        approx, scales = self._approximate(rows)
        # |approx - x.w| <= |x|_1 * weight_slack + input_slack * abs_sums, per row and token.
        input_slack = input_error(scales, self._step)
        norms = rows.abs().sum(1)
        self._make_exact(rows, approx, norms, input_slack)
        return approx.reshape(*x.shape[:-1], self.out_features)

    def _approximate(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(the int8 logits of each row as its two parts, the parts' scales [n, 2])."""
        n = rows.shape[0]
        # Each part is put on the engine's grid of the fixed range, so that the engine's own
        # rounding of it is exact and known: the first part keeps what it keeps, and the second
        # is the rest, whose rounding is at most half a step (times its scale) per input.
        high, high_scale = self._on_grid(rows)
        low, low_scale = self._on_grid(rows - high[:, : self.in_features] * high_scale)
        both = torch.cat([high, low])
        # Each piece's two parts are combined straight into the logits: concatenating the pieces'
        # products first copied 2n float32 rows of the vocabulary (33 MB for 16 of Gemma's rows).
        out = torch.empty(n, self.out_features)
        first = 0
        for piece in self._pieces:
            product = torch.ops.quantized.linear_dynamic(both, piece, self._reduce)
            part = out[:, first : first + product.shape[1]]
            torch.mul(product[:n], high_scale, out=part)
            part.add_(product[n:].mul_(low_scale))
            first += product.shape[1]
        return out, torch.cat([high_scale, low_scale], 1)

    def _on_grid(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(rows scaled to a largest magnitude of _ROW_PEAK and rounded to the engine's grid, then
        the range columns; the scale [n, 1] that undoes it)."""
        scale = rows.abs().amax(1, keepdim=True).clamp_min_(1e-30).div_(_ROW_PEAK)
        grid = torch.round(rows / scale / self._step).mul_(self._step)
        return torch.cat([grid, self._ends.expand(rows.shape[0], -1)], 1), scale

    def _make_exact(self, rows: torch.Tensor, approx: torch.Tensor, norms: torch.Tensor, input_slack: torch.Tensor) -> None:
        """Overwrite, in each row, the logits of every token whose bound reaches the row's best
        lower bound with the table's float32 products: a row's largest logit is then always an
        exact product, and which tokens are made exact depends on that row alone. All rows at
        once, as (row, token) pairs: a loop over the rows, with a looser floor, took 15-21 ms
        for 16 rows of Gemma 3 270M (its code prompt, AVX-512 and AVX2 kernels), now about 6."""
        n, n_tokens = approx.shape
        # [n]: no token's bound is larger
        most = (norms * self._most_slack[0] + input_slack * self._most_slack[1]) * _SAFETY + _ABSOLUTE_SLACK
        # The best lower bound is at least the row's largest int8 logit less that token's own
        # slack; a token more than `most` below that cannot reach it (with _ABSOLUTE_SLACK for
        # the roundings of these sums). Against the top less twice `most`, this leaves a tenth to
        # a twentieth of the tokens to bound one by one (Gemma 3 270M's code prompt: 37-7298 a
        # row instead of 1.5k-69k). Found within the 1024-token chunks whose largest logit
        # reaches the floor: a scan of the whole row costs 0.4 ms a row (262k tokens), of the
        # chunks' maxima 0.05.
        chunked = n_tokens % _CHUNK == 0
        chunks = approx.view(n, -1, _CHUNK) if chunked else approx.view(n, 1, -1)
        n_chunks, width = chunks.shape[1], chunks.shape[2]
        maxima = chunks.amax(2)
        top, top_chunk = maxima.max(1)
        # Gathers below are index_select on flat views: the same elements as advanced indexing,
        # which cost 15-180 us a call here (SmolLM2's head: 0.2 ms of a 2.3 ms head, per step).
        by_chunk, flat = chunks.reshape(-1, width), approx.view(-1)
        top_token = top_chunk * width + by_chunk.index_select(0, torch.arange(n) * n_chunks + top_chunk).argmax(1)
        top_slack = self._slack(top_token, norms, input_slack)
        floors = top - top_slack - most - _ABSOLUTE_SLACK
        row_of, chunk = torch.nonzero(maxima >= floors[:, None], as_tuple=True)
        reaching = by_chunk.index_select(0, row_of * n_chunks + chunk) >= floors.index_select(0, row_of)[:, None]
        pair, offset = torch.nonzero(reaching, as_tuple=True)
        row_of, tokens = row_of.index_select(0, pair), chunk.index_select(0, pair) * width + offset
        slack = self._slack(tokens, norms.index_select(0, row_of), input_slack.index_select(0, row_of))
        values = flat.index_select(0, row_of * n_tokens + tokens)
        best_lower = torch.full((n,), -torch.inf).scatter_reduce_(0, row_of, values - slack, "amax")
        keep = torch.nonzero(values + slack >= best_lower.index_select(0, row_of)).view(-1)
        row_of, tokens = row_of.index_select(0, keep), tokens.index_select(0, keep)
        # Each pair's product on its own (a float32 sum over the row's K products, the bf16 table
        # widened exactly), so that its bits never depend on the other pairs; in blocks, for a
        # row that ties everywhere.
        for lo in range(0, len(tokens), _EXACT_ROWS):
            at, these = row_of[lo : lo + _EXACT_ROWS], tokens[lo : lo + _EXACT_ROWS]
            exact = (rows.index_select(0, at) * self.table.index_select(0, these)).sum(1)
            flat.index_copy_(0, at * n_tokens + these, exact)

    def _slack(self, tokens: torch.Tensor, norms: torch.Tensor, input_slack: torch.Tensor) -> torch.Tensor:
        """How far each token's int8 logit may be from its exact product, for rows of these
        |x|_1 and input roundings (one per token)."""
        slack = self._weight_slack.index_select(0, tokens) * norms
        slack.add_(self._abs_sums.index_select(0, tokens) * input_slack)
        return slack.mul_(_SAFETY).add_(_ABSOLUTE_SLACK)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 per row"


def input_error(scales: torch.Tensor, step: float) -> torch.Tensor:
    """A bound [n] of how far each input the engine multiplies is from the row's own: half a
    step of the second part's grid, with room for the float32 roundings of its scaling, plus a
    few float32 roundings of the first part (which the second part is computed from), whatever
    the second part's scale (a row on the first part's grid has none)."""
    return scales[:, 1] * (step / 2 * (1 + 2.0**-6)) + scales[:, 0] * 2.0**-20


class _engine_set:
    """torch.backends.quantized.engine set for a block: weights are packed for the engine."""

    def __init__(self, engine: str) -> None:
        self._engine, self._before = engine, None

    def __enter__(self) -> None:
        self._before = torch.backends.quantized.engine
        torch.backends.quantized.engine = self._engine

    def __exit__(self, *exc) -> None:
        torch.backends.quantized.engine = self._before


@functools.cache
def available() -> bool:
    """Whether this torch runs the int8 head here, row-exact: a product of 5 rows of very
    different magnitudes gives each row's bits of that row alone (a probe of a few ms, once per
    process; any failure means no)."""
    try:
        generator = torch.Generator().manual_seed(0)
        head = Int8Head(torch.randn(512, 96, generator=generator).to(torch.bfloat16))
        rows = torch.randn(5, 96, generator=generator) * torch.logspace(-3, 2, 96)
        rows[3] *= 1e-20
        together = head(rows)
        alone = torch.cat([head(rows[i : i + 1]) for i in range(5)])
        exact = torch.equal(together, alone)
    except Exception as exc:  # an engine that is missing or refuses these shapes: no int8 head
        log.info("no int8 head: %s", exc)
        return False
    if not exact:
        log.info("no int8 head: its rows are not row-exact on this machine")
    return exact
