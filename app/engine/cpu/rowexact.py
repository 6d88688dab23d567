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

import torch

from app.engine.cpu.attention import ROW_BY_ROW_QUERIES as MAX_ROWS  # the most rows a verify has

MAX_BYTES = 8 << 20


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
                    and weight.numel() * weight.element_size() <= MAX_BYTES):
                setattr(parent, name, RowExactLinear(child))
                wrapped += 1
    return wrapped
