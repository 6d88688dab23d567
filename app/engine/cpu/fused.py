"""Side-by-side products: a layer's q, k and v projections (and its MLP's gate and up) as one.

A decoding step on a 2-core CPU is a few hundred small kernel calls, and each int4 call has a
fixed cost beside its arithmetic; k and v of a grouped-query model are the smallest matrices of
all (192 or 256 rows), too few blocks to keep both threads busy. One call over the three
matrices stacked (their outputs side by side) measured 1.18x faster per decoded token on SmolLM2
(30 layers) and 1.04x on Gemma 3 270M, whose step is mostly its 262k-row output projection.

Stacking keeps every output's bits: the kernel computes each output row of the weights from its
own packed block and scales (the sum runs over K, not over N), so the rows of the stacked matrix
give what each matrix gives alone (tests/test_fused.py checks it on every pass type). Each part
must be whole blocks of torch's packing (learned from torch, app.engine.cpu.layout); where the
layout is unknown nothing is stacked.

bf16 matrices (loads without int4) are stacked the same way: one bf16 product per stack, 1.06x
on SmolLM2 and 1.07x on Gemma 3 270M per decoded token, the same bits for one token (a batched
bf16 verify is not row-exact, stacked or not). So are the multi-pass matrices an int4 load keeps
in bf16, row by row, where this CPU computes them for less than their passes
(app.engine.cpu.rowexact): with torch's scalar kernels (ATEN_CPU_CAPABILITY=default, as on CPUs
without AVX2) that is every two-pass matrix of Gemma 3 270M (Q5_0, Q8_0), its q, k, v, gate and
up, which were five row-by-row products a layer instead of two.

Memory: the separate modules, which prompts (transformers' forward) still call, keep views of the
stacked packed weights, so those are held once; their scales and zeros (an eighth of the packed
bytes at K = 576) are held twice, because the kernel needs them contiguous and silently computes
garbage from a strided slice. bf16 weights are held once.
"""

from __future__ import annotations

import torch

from app.engine.cpu import layout
from app.engine.cpu.quantlinear import Int4Linear
from app.engine.cpu.rowexact import RowExactLinear


def stack(linears: list[torch.nn.Module]) -> torch.nn.Module | None:
    """One linear whose outputs are the given linears' outputs side by side (same input), the
    linears then sharing its weights, or None where they cannot be stacked: int4 ones as
    stack_int4 says, bf16 nn.Linear ones of the same input size on the CPU, and bf16 ones
    computed row by row (RowExactLinear) as one such linear, still row by row."""
    if linears and all(type(m) is torch.nn.Linear for m in linears):
        return _stack_bf16(linears)
    if linears and all(isinstance(m, RowExactLinear) for m in linears):
        stacked = _stack_bf16([m.linear for m in linears])
        return RowExactLinear(stacked) if stacked is not None else None
    return stack_int4(linears)


def _stack_bf16(linears: list[torch.nn.Linear]) -> torch.nn.Linear | None:
    first = linears[0].weight
    if len(linears) < 2 or any(m.weight.dtype != torch.bfloat16 or m.weight.device.type != "cpu"
                               or m.in_features != linears[0].in_features for m in linears):
        return None
    stacked = torch.nn.Linear(first.shape[1], sum(m.out_features for m in linears), bias=False,
                              dtype=first.dtype, device="meta")
    stacked.weight = torch.nn.Parameter(torch.cat([m.weight.detach() for m in linears]), requires_grad=False)
    stacked.bias = _stacked_bias(linears)
    row = 0
    for m in linears:
        m.weight = torch.nn.Parameter(stacked.weight[row : row + m.out_features], requires_grad=False)
        row += m.out_features
    return stacked


def stack_int4(linears: list[torch.nn.Module]) -> Int4Linear | None:
    """One Int4Linear whose outputs are the given linears' outputs side by side (same input), the
    linears then sharing its packed weights; None where they cannot be stacked (not all int4, a
    different number of passes or inputs, rows that are not whole blocks, an unknown layout)."""
    packing = layout.learned()
    if packing is None or len(linears) < 2 or not all(isinstance(m, Int4Linear) for m in linears):
        return None
    first = linears[0]
    if any(m.n_passes != first.n_passes or m.in_features != first.in_features
           or m.out_features % packing.block_rows for m in linears):
        return None
    passes = []
    for i in range(first.n_passes):
        packed = torch.cat([getattr(m, f"packed{i}") for m in linears])
        scales_zeros = torch.cat([getattr(m, f"scales_zeros{i}") for m in linears], dim=1).contiguous()
        passes.append((packed, scales_zeros))
    stacked = Int4Linear(passes, sum(m.out_features for m in linears), first.in_features, _stacked_bias(linears))
    _share_packed(stacked, linears)
    return stacked


def _stacked_bias(linears: list[torch.nn.Module]) -> torch.nn.Parameter | None:
    if all(m.bias is None for m in linears):
        return None
    parts = [m.bias.detach() if m.bias is not None else torch.zeros(m.out_features) for m in linears]
    dtype = next(m.bias.dtype for m in linears if m.bias is not None)
    return torch.nn.Parameter(torch.cat([p.to(dtype) for p in parts]), requires_grad=False)


def _share_packed(stacked: Int4Linear, linears: list[Int4Linear]) -> None:
    """Point each linear's packed weights at its rows of the stacked ones (a contiguous view)."""
    for i in range(stacked.n_passes):
        packed, row = getattr(stacked, f"packed{i}"), 0
        for m in linears:
            setattr(m, f"packed{i}", packed[row : row + m.out_features])
            row += m.out_features
