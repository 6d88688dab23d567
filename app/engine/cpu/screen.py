"""The exact argmax of an int4 output projection at many positions, screened by its bf16 twin.

Plain decoding reads the output projection once per token, and the int4 kernel reads it fastest
(app.engine.cpu.quantlinear). But that kernel costs the same for every row it computes, so verifying
k drafted tokens would read a 262k-token projection k+1 times. A bf16 product of k+1 rows costs
about twice one row, and a tied embedding already has its bf16 table. So a verify:

1. computes all rows with the bf16 table (cheap per row) and, for each logit, a bound on how far
   the int4 kernel's value can be from it, derived from the weights' groups and the input;
2. keeps as candidates the tokens whose bound reaches the best lower bound: every token that
   could be the int4 argmax is among them;
3. computes the int4 kernel's exact logits for the 64-row packed blocks holding any position's
   candidates, in one product for all positions, and takes each position's argmax (the first
   index on ties, as torch.argmax over the whole row does).

The result is the very token the int4 head gives that hidden state alone, as in one-token
decoding: screening never changes a greedy token. The bound, for a row x and a token n (every term >= 0):
|int4 - bf16| <= sum over groups g of |x|_g * E[n, g] + 2^-8 |bf16 logit| (both outputs rounded to
bf16), where E[n, g] covers the bf16 rounding of the table's weights, of the kernel's scales and
zeros, of its two partial products, and float32 accumulation over K terms; see `_group_bound`.
Everything is multiplied by a safety factor.
"""

from __future__ import annotations

import functools

import torch

from app.engine.cpu.probe import fastest, remembered

from app.engine.cpu.quantlinear import GROUP, PACK_ROWS, Int4Linear, layout_is_known, sum_passes

_SAFETY = 1.25
_BF16_ROUNDING = 2.0**-9  # relative, round to nearest
_F32_EPS = 2.0**-24
_AMORTIZED_ROWS_COST = 3.0  # 8 bf16 rows for less than this many one-row products: GEMM amortizes


def can_screen(head: torch.nn.Module, table: torch.Tensor | None) -> bool:
    """Gathering whole blocks of 64 rows needs a known layout (learned once per process: its
    blocks divide 64, so a gathered block is whole blocks of the kernel's)."""
    return (isinstance(head, Int4Linear) and layout_is_known() and table is not None and table.dtype == torch.bfloat16
            and tuple(table.shape) == (head.out_features, head.in_features)
            and head.out_features % PACK_ROWS == 0 and head.bias is None)


@functools.cache
def screening_pays() -> bool:
    """Whether torch's bf16 product of several rows costs little more than one row on this CPU
    (bf16 instructions: AVX-512 bf16, AMX), which screening needs in order to pay. Without them
    (AVX2) each bf16 row costs about what an int4 row does, and the int4 kernel computes four
    rows for about twice one: on Gemma 3 270M's head (AVX2, 2 threads) screening 4 rows took 104
    ms against 58 for their exact logits, 16 rows 361 against 149. Measured once per machine
    (probe.remembered) on a product of 8 MB (about 0.1 s), never read from a CPU flag."""
    return remembered("bf16 screening pays", _bf16_rows_amortize)


def _bf16_rows_amortize() -> bool:
    weight = torch.randn(4096, 1024).to(torch.bfloat16)
    one, eight = torch.randn(1, 1024).to(torch.bfloat16), torch.randn(8, 1024).to(torch.bfloat16)
    with torch.inference_mode():
        eight_rows = fastest(lambda: torch.nn.functional.linear(eight, weight), 6, warmups=6)
        one_row = fastest(lambda: torch.nn.functional.linear(one, weight), 6, warmups=6)
    return eight_rows < _AMORTIZED_ROWS_COST * one_row


def _group_bound(head: Int4Linear) -> torch.Tensor:
    """E [N, G] (float32). With C = sum over passes of 8|scale| + |zero| (each pass's weight is
    (q - 8)*scale + zero with |q - 8| <= 8, so C bounds |w| too):
    the table's weights are off by <= 2^-9 |w| <= 2^-9 C; the kernel's by <= 2^-9 C (bf16 scales
    and zeros); its partial products are rounded, <= 2^-9 C |x| each; float32 sums of K terms in
    either product, <= K 2^-24 (C + C)."""
    total = None
    for i in range(head.n_passes):
        scales_zeros = getattr(head, f"scales_zeros{i}").float()  # [G, N, 2]
        c = 8 * scales_zeros[..., 0].abs() + scales_zeros[..., 1].abs()
        total = c if total is None else total + c
    per_weight = 3 * _BF16_ROUNDING + 2 * head.in_features * _F32_EPS
    return (total * (1 + 2 * _BF16_ROUNDING) * per_weight).T.contiguous()


class ScreenedHead:
    """An int4 output projection with its bf16 table, for exact argmaxes of many rows."""

    def __init__(self, head: Int4Linear, table: torch.Tensor) -> None:
        self.head, self.table = head, table

    @torch.inference_mode()
    def rows(self, hidden: torch.Tensor) -> "ScreenedRows":
        """hidden: [M, K] rows fed to the projection (bf16)."""
        # E is built on first use (20 MB for 262k tokens) and kept with the head, so that every
        # KV cache over the same model shares it.
        bound = getattr(self.head, "screen_bound", None)
        if bound is None:
            bound = self.head.screen_bound = _group_bound(self.head)
        hidden = hidden.to(torch.bfloat16)
        approx = torch.nn.functional.linear(hidden, self.table).float()
        group_sums = hidden.float().abs().reshape(hidden.shape[0], -1, GROUP).sum(-1)  # [M, G]
        slack = (group_sums @ bound.T).mul_(_SAFETY)
        slack.add_(approx.abs(), alpha=2 * _BF16_ROUNDING * _SAFETY).add_(1e-6)
        return ScreenedRows(self, hidden, approx, slack)

    def block_logits(self, x: torch.Tensor, blocks: torch.Tensor) -> torch.Tensor:
        """The int4 kernel's logits (float32 [M, blocks * 64]) of the vocabulary rows in the given
        64-row packed blocks, in block order: bit for bit what the whole projection gives."""
        parts = []
        for i in range(self.head.n_passes):
            # Whole blocks are gathered as contiguous runs (a row-by-row gather of the scales,
            # strided by N, costs more than the product itself).
            packed = getattr(self.head, f"packed{i}")
            width = packed.shape[-1]
            packed = packed.view(-1, PACK_ROWS * width).index_select(0, blocks).view(-1, width)
            scales_zeros = getattr(self.head, f"scales_zeros{i}")
            groups = scales_zeros.shape[0]
            scales_zeros = scales_zeros.view(groups, -1, PACK_ROWS * 2).index_select(1, blocks).view(groups, -1, 2)
            parts.append(torch._weight_int4pack_mm_for_cpu(x, packed, GROUP, scales_zeros))
        return sum_passes(parts).float()


class ScreenedRows:
    def __init__(self, head: ScreenedHead, hidden: torch.Tensor, approx: torch.Tensor, slack: torch.Tensor) -> None:
        self._head, self._hidden, self._approx, self._slack = head, hidden, approx, slack
        self._tokens: list[int] | None = None

    @torch.inference_mode()
    def argmax(self, i: int) -> int:
        """The int4 argmax of row i (the first index of the largest logit)."""
        if self._tokens is None:
            self._tokens = self._winners(slice(None)) or []
        if self._tokens:
            return self._tokens[i]
        # The union over every row was too wide: this row's own candidates, else its whole row.
        alone = self._winners(slice(i, i + 1))
        if alone is not None:
            return alone[0]
        return int(self._head.head(self._hidden[i : i + 1])[0].float().argmax())

    def _winners(self, rows: slice) -> list[int] | None:
        """The argmax of each of these rows from one product over the union of their candidate
        blocks, or None when that union is too large to be worth gathering (flat distributions).
        Extra candidates from other rows do no harm: each row's winner is among them, exact."""
        approx, slack = self._approx[rows], self._slack[rows]
        best_lower = (approx - slack).max(dim=1, keepdim=True).values
        candidates = torch.nonzero(approx + slack >= best_lower)[:, 1]
        blocks = torch.unique(candidates // PACK_ROWS)  # sorted: vocabulary order is kept
        if 2 * len(blocks) * PACK_ROWS > self._head.head.out_features:
            return None
        best = self._head.block_logits(self._hidden[rows], blocks).argmax(dim=1)
        return (blocks[best // PACK_ROWS] * PACK_ROWS + best % PACK_ROWS).tolist()
