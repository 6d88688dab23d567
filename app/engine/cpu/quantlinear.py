"""Linear layers that keep a GGUF file's own low-bit weights and run torch's int4 CPU kernel.

Decoding one token is a chain of matrix-vector products, so its speed is the bytes of weights read
per token. A bf16 copy of a Q4 file reads 2 bytes per weight where llama.cpp reads about 0.6;
torch's `_weight_int4pack_mm_for_cpu` reads half a byte, 4-6x faster than a bf16 product here.

Every type handled here stores, for each group of 32 weights along a row, w = s*u + o with u a
small unsigned integer and the group's scale s and offset o. That is exactly the kernel's form
w = (q - 8)*scale + zero when u has 16 levels (Q4_0, Q4_1, Q4_K). Types with more levels (Q5_0,
Q5_1, Q5_K: 32; Q8_0: 256) are split as u = 16*h + l into two 4-bit matrices whose products are
added: still the file's weights, read at one byte each. Q6_K scales each run of 16 weights, half
the kernel's group, so it takes four passes (_sub_block_passes). Scales and zeros are held in bf16
by the kernel, as a bf16 copy of the weights would round them.

The kernel computes each input row on its own, so in these layers a k+1 token verify gives each
position the same bits as one-token decoding (tests/test_quantlinear.py checks it); the model's
other pieces do the same on the CPU (app.engine.cpu.attention, app.engine.cpu.rowexact). Its cost
grows with every row, though, so prompts (DEQUANTIZE_FROM_ROWS rows or more, never a decoding or
verifying step) dequantize the weights to bf16 a chunk at a time for one bf16 product instead.
"""

from __future__ import annotations

import functools
import logging
from typing import Callable

import gguf
import numpy as np
import torch

from app.engine.cpu import layout
from app.engine.gguf_info import INT4_GROUP, INT4_PASSES
from app.engine.machine import int4_enabled

log = logging.getLogger(__name__)

GROUP = INT4_GROUP
PACK_ROWS = layout.ROW_UNIT  # rows handled together (head blocks, dequantized chunks)
# Prompts: from this many rows on, the weights are dequantized to bf16 for one bf16 product, which
# costs less than the kernel's, whose cost grows with every row (on Gemma 3 270M's matrices about
# equal at 128 rows, 2-3x less at 512). Decoding and verifying (at most 32 rows) keep the kernel.
DEQUANTIZE_FROM_ROWS = 128
_DEQUANTIZE_CHUNK = 1 << 20  # weights dequantized at a time: 4 MB of float32
# ggml type -> (bytes per block, levels of u)
_BLOCKS = {
    "Q4_0": (18, 16), "Q4_1": (20, 16), "Q4_K": (144, 16),
    "Q5_0": (22, 32), "Q5_1": (24, 32),
    "Q8_0": (34, 256),
    "Q5_K": (176, 32),
    "Q6_K": (210, 64),  # scales per 16 weights: split into passes apart (_sub_block_passes)
}
assert set(_BLOCKS) == set(INT4_PASSES)


def int4_available() -> bool:
    """torch's CPU int4 kernels exist (torch >= 2.6) and the user has not turned them off."""
    return int4_enabled() and layout.kernel_exists()


def group_affine(raw: np.ndarray, ggml_type: str) -> tuple[np.ndarray, np.ndarray]:
    """(s, o) of every group of 32 weights, in file order (row by row), as float32 arrays."""
    block_bytes, _ = _BLOCKS[ggml_type]
    blocks = raw.reshape(-1, block_bytes)

    def half(offset: int) -> np.ndarray:
        return blocks[:, offset : offset + 2].copy().view(np.float16)[:, 0].astype(np.float32)

    d = half(0)
    if ggml_type == "Q4_0":
        return d, -8 * d
    if ggml_type == "Q5_0":
        return d, -16 * d
    if ggml_type == "Q8_0":
        return d, -128 * d  # q is int8: u = q + 128
    if ggml_type in ("Q4_1", "Q5_1"):
        return d, half(2)
    # Q4_K, Q5_K: a super-block of 8 groups with 6-bit scales and mins; w = d*sc*q - dmin*m.
    if ggml_type not in ("Q4_K", "Q5_K"):
        raise ValueError(f"{ggml_type} has no scale per group of {GROUP}")
    scales, mins = gguf.quants.Q4_K.get_scale_min(blocks[:, 4:16])
    s = d[:, None] * scales.astype(np.float32)
    o = -half(2)[:, None] * mins.astype(np.float32)
    return s.reshape(-1), o.reshape(-1)


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    """16 bytes per group -> its 32 values: the low nibbles are values 0-15, the high ones 16-31."""
    return torch.cat([qs & 0x0F, qs >> 4], dim=-1)


def group_integers(raw: np.ndarray, ggml_type: str) -> torch.Tensor:
    """u of every weight, uint8 [groups, 32], unpacked straight from the blocks (ggml's layouts),
    with torch ops so that large tensors use every thread."""
    block_bytes, _ = _BLOCKS[ggml_type]
    blocks = torch.from_numpy(raw).reshape(-1, block_bytes)
    if ggml_type == "Q8_0":
        # u = q + 128 for int8 q: flipping the sign bit.
        return blocks[:, 2:34] ^ 0x80
    if ggml_type in ("Q4_0", "Q4_1"):
        start = 2 if ggml_type == "Q4_0" else 4
        return _nibbles(blocks[:, start : start + 16])
    if ggml_type in ("Q5_0", "Q5_1"):
        start = 2 if ggml_type == "Q5_0" else 4
        # 4 bytes of fifth bits, little-endian: bit j of the 32-bit word is value j's.
        bits = blocks[:, start : start + 4, None] >> torch.arange(8, dtype=torch.uint8)
        fifth = (bits & 1).reshape(-1, 32)
        return _nibbles(blocks[:, start + 4 : start + 20]) | (fifth << 4)
    # Q4_K, Q5_K: 4 runs of 32 bytes; run r holds group 2r in its low nibbles and 2r+1 in its
    # high ones. Q5_K's 32 bytes before them hold the fifth bits: bit j of byte l is group j's.
    start = 16 if ggml_type == "Q4_K" else 48
    runs = blocks[:, start : start + 128].reshape(-1, 4, 1, 32)
    low = torch.cat([runs & 0x0F, runs >> 4], dim=2).reshape(-1, 8, 32)
    if ggml_type == "Q4_K":
        return low.reshape(-1, 32)
    fifth = (blocks[:, None, 16:48] >> torch.arange(8, dtype=torch.uint8)[None, :, None]) & 1
    return (low | (fifth << 4)).reshape(-1, 32)


def q6_k_values(raw: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """Q6_K's signed integers v (int8 [blocks, 256], -32..31) and the scale d*sc of each run of 16
    (float32 [blocks, 16]): w = d*sc*v, in ggml's layout (as gguf.quants.Q6_K reads it)."""
    blocks = torch.from_numpy(raw).reshape(-1, 210)
    low = blocks[:, :128].reshape(-1, 2, 1, 64)
    low = torch.cat([low & 0x0F, low >> 4], dim=2).reshape(-1, 8, 32)
    shifts = torch.tensor([0, 2, 4, 6], dtype=torch.uint8).reshape(1, 1, 4, 1)
    high = ((blocks[:, 128:192].reshape(-1, 2, 1, 32) >> shifts) & 3).reshape(-1, 8, 32)
    values = (low | (high << 4)).to(torch.int8).reshape(-1, 256) - 32
    scales = blocks[:, 192:208].contiguous().view(torch.int8).float()
    d = blocks[:, 208:210].contiguous().view(torch.float16).float()
    return values, d * scales


class Int4Linear(torch.nn.Module):
    """y = x W^T (+ b) with W held as one or two int4-packed matrices (see the module's note)."""

    def __init__(self, passes: list[tuple[torch.Tensor, torch.Tensor]], out_features: int,
                 in_features: int, bias: torch.nn.Parameter | None) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        for i, (packed, scales_zeros) in enumerate(passes):
            self.register_buffer(f"packed{i}", packed)
            self.register_buffer(f"scales_zeros{i}", scales_zeros)
        self.n_passes = len(passes)
        self._pass_names = tuple((f"packed{i}", f"scales_zeros{i}") for i in range(self.n_passes))
        # The linear's own bias parameter, shared: the loader may fill it after the weight.
        if bias is not None and not isinstance(bias, torch.nn.Parameter):
            raise TypeError("Int4Linear's bias must be a Parameter (rows_product reads it from _parameters)")
        self.bias = bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2 and x.dtype == torch.bfloat16 and x.shape[0] < DEQUANTIZE_FROM_ROWS:
            return self.rows_product(x)  # decoding and verifying: the common case, kept short
        rows = x.reshape(-1, self.in_features)
        if rows.dtype != torch.bfloat16:
            rows = rows.to(torch.bfloat16)
        if rows.shape[0] >= DEQUANTIZE_FROM_ROWS and self.can_dequantize():
            y = self._dequantized_product(rows)
            y = y if self.bias is None else y + self.bias
        else:
            y = self.rows_product(rows)
        return y.reshape(*x.shape[:-1], self.out_features)

    def rows_product(self, rows: torch.Tensor) -> torch.Tensor:
        """rows [M, K] (bf16) W^T (+ b) by torch's int4 kernel, pass by pass. Read straight from
        the module's buffers: a decoding step makes over a hundred of these calls, and each
        attribute lookup through nn.Module costs about a microsecond (1.07x per SmolLM2 step)."""
        buffers = self._buffers
        names = self._pass_names
        if len(names) == 1:
            y = torch._weight_int4pack_mm_for_cpu(rows, buffers[names[0][0]], GROUP, buffers[names[0][1]])
        else:
            y = sum_passes([torch._weight_int4pack_mm_for_cpu(rows, buffers[packed], GROUP, buffers[scales])
                            for packed, scales in names])
        bias = self._parameters.get("bias")
        return y if bias is None else y + bias

    def rows_function(self) -> Callable[[torch.Tensor], torch.Tensor]:
        """rows_product as a function of the rows alone, for callers that make many products on
        2-D bf16 rows of decoding size (app.engine.cpu.leanstep): for one pass and no bias, the
        kernel itself with this module's buffers bound, 2.4 of a 37 us product less than
        forward (SmolLM2's o_proj, one row, Zen 3). The buffers are bound when it is asked for:
        ask again after they change."""
        if self.n_passes == 1 and self._parameters.get("bias") is None:
            (packed, scales), = self._pass_names
            return functools.partial(torch._weight_int4pack_mm_for_cpu, mat2=self._buffers[packed],
                                     qGroupSize=GROUP, qScaleAndZeros=self._buffers[scales])
        return self.rows_product

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, passes={self.n_passes}"

    def _dequantized_product(self, rows: torch.Tensor) -> torch.Tensor:
        """rows W^T with W dequantized to bf16 a chunk of output rows at a time (never whole)."""
        step = max(PACK_ROWS, _DEQUANTIZE_CHUNK // self.in_features // PACK_ROWS * PACK_ROWS)
        return torch.cat([torch.nn.functional.linear(rows, self.dequantized(first, min(first + step, self.out_features)))
                          for first in range(0, self.out_features, step)], dim=-1)

    def can_dequantize(self) -> bool:
        """Rows can be read back from the packing: the layout is known and every block is whole
        (a partial last block is packed by torch's converter in another form)."""
        packing = layout.learned()
        return packing is not None and self.out_features % packing.block_rows == 0

    def dequantized(self, first: int = 0, stop: int | None = None) -> torch.Tensor:
        """Weight rows [first, stop) in bf16 (both multiples of 64 but the end; needs the learned
        layout): each pass's (q - 8) * scale + zero with the kernel's bf16 scales and zeros, added
        in float32."""
        stop = self.out_features if stop is None else stop
        n, k = stop - first, self.in_features
        packing = layout.learned()
        assert packing is not None, "dequantized() needs torch's int4 layout (layout.learned())"
        total = None
        for i in range(self.n_passes):
            q = packing.unpack(getattr(self, f"packed{i}")[first:stop], k).view(n, k // GROUP, GROUP)
            scales_zeros = getattr(self, f"scales_zeros{i}")[:, first:stop].float()  # [G, n, 2]
            scale, zero = (scales_zeros[..., j].T.contiguous().unsqueeze(-1) for j in (0, 1))  # [n, G, 1]
            weights = q.float().mul_(scale).add_(zero.sub_(scale, alpha=8))
            total = weights if total is None else total.add_(weights)
        return total.reshape(n, k).to(torch.bfloat16)


def sum_passes(parts: list[torch.Tensor]) -> torch.Tensor:
    """The passes' bf16 products added in float32 and rounded once (for two, bf16 + bf16 is formed
    in float32 and rounded once as well). Every caller adds them this way, so that a product of
    some vocabulary blocks (app.engine.cpu.screen) gives the whole projection's bits."""
    if len(parts) == 1:
        return parts[0]
    if len(parts) == 2:
        return parts[0].add_(parts[1])
    total = parts[0].float()
    for part in parts[1:]:
        total.add_(part)
    return total.to(parts[0].dtype)


def _pack(q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q [N, K] in 0..15 (uint8), scale and zero [N, K/32] -> the kernel's packed weight and
    [K/32, N, 2]."""
    scales_zeros = torch.stack([scale, zero], dim=-1).transpose(0, 1).contiguous().to(torch.bfloat16)
    packing = layout.learned()
    if packing is not None and q.shape[0] % packing.block_rows == 0:
        return packing.pack(q), scales_zeros
    return torch._convert_weight_to_int4pack_for_cpu(q.to(torch.int32).contiguous(), 1), scales_zeros


def layout_is_known() -> bool:
    """Whether this process learned torch's int4 layout (app.engine.cpu.layout): the fast
    packing, the dequantized prompt product and head screening need it."""
    return layout.learned() is not None


Passes = list[tuple[torch.Tensor, torch.Tensor]]


def pack_passes(raw: np.ndarray, ggml_type: str, shape: tuple[int, int],
                row_order: np.ndarray | None = None) -> Passes:
    """The kernel's (packed weight, scales and zeros) for each pass of the matrix stored in `raw`
    (`shape` [N, K]); `row_order`: which file row each model row comes from."""
    n_rows, k = shape
    if ggml_type == "Q6_K":
        values, scales = q6_k_values(raw)
        return _sub_block_passes(*_in_row_order(row_order, values.reshape(n_rows, k), scales.reshape(n_rows, k // 16)))
    _, levels = _BLOCKS[ggml_type]
    s, o = (torch.from_numpy(a).reshape(n_rows, k // GROUP) for a in group_affine(raw, ggml_type))
    s, o, u = _in_row_order(row_order, s, o, group_integers(raw, ggml_type).reshape(n_rows, k))
    if levels == 16:
        return [_pack(u, s, o + 8 * s)]
    # u = 16*h + l. The high part is centred on the kernel's 8 (q_h = h + c) so that neither
    # partial product carries a large common offset; the low part's zero absorbs the rest.
    high_max = (levels - 1) >> 4
    c = 8 - (high_max + 1) // 2
    high, low = (u >> 4) + c, u & 15
    return [_pack(high, 16 * s, torch.zeros_like(s)), _pack(low, s, o + 8 * s + 16 * (8 - c) * s)]


def _in_row_order(row_order: np.ndarray | None, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    if row_order is None or np.array_equal(row_order, np.arange(len(row_order))):
        return tensors  # most matrices keep the file's order: no copies
    index = torch.from_numpy(np.asarray(row_order, dtype=np.int64))
    return tuple(t[index] for t in tensors)


def _sub_block_passes(values: torch.Tensor, scales: torch.Tensor) -> Passes:
    """Four passes for w = S*v, v in -32..31, with a scale S per run of 16 weights (Q6_K): the
    kernel's groups are 32 wide, so each group's first and second runs go to passes of their own
    (the other run's weights are 0 there: q = 8). v = 16a + b with b in -8..7 and a in -2..2, so
    every pass is (q - 8) * scale with a zero of 0: [a, first runs], [a, second runs], [b, ...]."""
    high = torch.div(values + 8, 16, rounding_mode="floor")
    low = values - 16 * high
    first_run = (torch.arange(values.shape[1]) % GROUP) < GROUP // 2
    zero = torch.zeros_like(scales[:, ::2])
    passes = []
    for digits, factor in ((high, 16.0), (low, 1.0)):
        for run, keep in ((0, first_run), (1, ~first_run)):
            q = torch.where(keep, digits + 8, 8).to(torch.uint8)
            passes.append(_pack(q, factor * scales[:, run::2], zero))
    return passes


def pack_linear(raw: np.ndarray, ggml_type: str, shape: tuple[int, int], row_order: np.ndarray | None = None,
                bias: torch.nn.Parameter | None = None) -> Int4Linear:
    """An Int4Linear of the matrix stored in `raw` (see pack_passes)."""
    return Int4Linear(pack_passes(raw, ggml_type, shape, row_order), shape[0], shape[1], bias)
