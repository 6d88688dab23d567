"""torch's int4 packing layout, learned from torch's own converter once per process.

`torch._convert_weight_to_int4pack_for_cpu` takes an int32 matrix (4x the bytes of the uint8 we
hold) and writes a layout that depends on the CPU kernels torch dispatches to: blocks of 64 rows
whose low nibbles are rows 0-31 on AVX-512, blocks of 32 rows split 16/16 on AVX2, neighbouring
rows paired on torch's scalar kernels (ATEN_CPU_CAPABILITY=default). Rather than hard-coding any
of them, a probe packs row and column numbers (in base-16 digits) and reads back where each one
went; the layout found is checked against the converter on a random matrix of another shape. Where
the probe finds no layout of the form below (a torch of another design, a CPU without the kernel),
`learned()` is None and the callers use the converter and skip what needs the layout.

The form: the rows split into blocks of `block_rows`; each block is stored as K runs (one per
column k) of block_rows/2 bytes, byte j holding row `low[j]` of the block in its low nibble and
row `high[j]` in its high one.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass

import torch

log = logging.getLogger(__name__)

# Every caller works in units of this many rows (head blocks, dequantized chunks); a layout whose
# blocks do not divide it is treated as unknown.
ROW_UNIT = 64
_PROBE_ROWS, _PROBE_COLS = 256, 64  # base-16 digits: two for rows and for columns


@dataclass(frozen=True)
class PackLayout:
    block_rows: int
    low: tuple[int, ...]
    high: tuple[int, ...]

    def pack(self, q: torch.Tensor) -> torch.Tensor:
        """q [N, K] in 0..15 (N a multiple of block_rows) -> the converter's packed [N, K/2]
        uint8, written straight from uint8."""
        n, k = q.shape
        blocks = q.to(torch.uint8).view(n // self.block_rows, self.block_rows, k)
        low, high = (_rows(blocks, rows) for rows in (self.low, self.high))
        return (low | (high << 4)).transpose(1, 2).contiguous().view(n, k // 2)

    def unpack(self, packed: torch.Tensor, k: int) -> torch.Tensor:
        """The inverse of pack: packed [N, K/2] uint8 -> q [N, K] uint8."""
        n = packed.shape[0]
        runs = packed.reshape(n // self.block_rows, k, self.block_rows // 2)
        by_position = torch.cat((runs & 0x0F, runs >> 4), dim=2)  # [blocks, K, B]: low then high rows
        rows = torch.argsort(torch.tensor(self.low + self.high))  # block row -> its position
        return by_position.index_select(2, rows).transpose(1, 2).reshape(n, k)


def _rows(blocks: torch.Tensor, rows: tuple[int, ...]) -> torch.Tensor:
    """blocks[:, rows] as a strided view when the rows are evenly spaced (every layout seen)."""
    step = rows[1] - rows[0] if len(rows) > 1 else 1
    if step > 0 and rows == tuple(range(rows[0], rows[0] + step * len(rows), step)):
        return blocks[:, rows[0] : rows[-1] + 1 : step]
    return blocks.index_select(1, torch.tensor(rows))


def kernel_exists() -> bool:
    return hasattr(torch, "_weight_int4pack_mm_for_cpu") and hasattr(torch, "_convert_weight_to_int4pack_for_cpu")


@functools.cache
def learned() -> PackLayout | None:
    """The layout torch's converter writes in this process, or None where it has no such form."""
    if not kernel_exists():
        return None
    try:
        layout = _probe()
    except (RuntimeError, ValueError, IndexError) as exc:  # a converter that refuses the probe
        log.warning("torch's int4 converter refused the layout probe (%s); using it as it is", exc)
        return None
    if layout is None:
        log.warning("torch's int4 packing has a layout of another form here; using its converter")
    else:
        log.debug("torch int4 layout: blocks of %d rows", layout.block_rows)
    return layout


def _convert(q: torch.Tensor) -> torch.Tensor:
    return torch._convert_weight_to_int4pack_for_cpu(q.to(torch.int32).contiguous(), 1)


def _probe() -> PackLayout | None:
    n, k = _PROBE_ROWS, _PROBE_COLS
    row = torch.arange(n).reshape(n, 1).expand(n, k)
    col = torch.arange(k).reshape(1, k).expand(n, k)
    digits = [_convert(v) for v in (row % 16, row // 16, col % 16, col // 16)]
    if any(d.shape != (n, k // 2) or d.dtype != torch.uint8 for d in digits):
        return None
    flat = [d.reshape(-1).long() for d in digits]
    low_row, high_row = (flat[0] & 15) + 16 * (flat[1] & 15), (flat[0] >> 4) + 16 * (flat[1] >> 4)
    low_col, high_col = (flat[2] & 15) + 16 * (flat[3] & 15), (flat[2] >> 4) + 16 * (flat[3] >> 4)
    if not torch.equal(low_col, high_col):
        return None  # a byte holds two columns of one row: not this form
    run = int((low_col == 0).long().cumprod(0).sum())  # bytes of the first run (column 0)
    block_rows = 2 * run
    if block_rows == 0 or ROW_UNIT % block_rows or n % block_rows:
        return None
    layout = PackLayout(block_rows, tuple(low_row[:run].tolist()), tuple(high_row[:run].tolist()))
    if sorted(layout.low + layout.high) != list(range(block_rows)):
        return None
    if not torch.equal(layout.pack(row % 16), digits[0]) or not torch.equal(layout.pack(col % 16), digits[2]):
        return None
    # Another shape, random values: the form holds beyond the probe.
    q = torch.randint(0, 16, (3 * ROW_UNIT, 3 * k), generator=torch.Generator().manual_seed(0), dtype=torch.uint8)
    if not torch.equal(layout.pack(q), _convert(q)) or not torch.equal(layout.unpack(layout.pack(q), 3 * k), q):
        return None
    return layout
