"""bf16 linears whose rows are computed as each row alone would be."""

from __future__ import annotations

import torch

from app.engine.loader import load_model
from app.engine.rowexact import MAX_BYTES, MAX_ROWS, RowExactLinear, wrap_linears


def _linear(rows=640, cols=2048) -> torch.nn.Linear:
    linear = torch.nn.Linear(cols, rows, bias=False)
    linear.weight.data = linear.weight.data.to(torch.bfloat16)
    return linear


def test_each_of_a_few_rows_is_the_product_of_that_row_alone():
    linear = _linear()
    exact = RowExactLinear(linear)
    # Activations as a model has them: some zeros and tiny (subnormal in bf16) values.
    x = torch.randn(1, MAX_ROWS, 2048).to(torch.bfloat16)
    x[..., ::7] = 0
    x[..., 1::11] = 1e-39
    alone = torch.cat([linear(x[0, i : i + 1]) for i in range(MAX_ROWS)])
    for rows in (1, 2, 5, 17, MAX_ROWS):
        assert torch.equal(exact(x[:, :rows])[0], alone[:rows])
    prompt = torch.randn(1, MAX_ROWS + 8, 2048).to(torch.bfloat16)  # a prompt: one product
    assert torch.equal(exact(prompt), linear(prompt))


def test_only_small_bf16_linears_are_wrapped():
    model = torch.nn.Sequential(_linear(), torch.nn.Linear(64, 64), _linear(4096, MAX_BYTES // 4096 // 2 + 1))
    assert wrap_linears(model) == 1
    assert isinstance(model[0], RowExactLinear)
    assert type(model[1]) is torch.nn.Linear  # float32
    assert type(model[2]) is torch.nn.Linear  # too large to stay in the caches


def test_int4_loads_wrap_their_bf16_matrices(demo_path):
    gemma = load_model(demo_path("gemma3-270m"), device="cpu", dtype="bfloat16")
    wrapped = [m for m in gemma.model.modules() if isinstance(m, RowExactLinear)]
    assert gemma.plan.int4 and wrapped  # its Q6_K matrices
    plain = load_model(demo_path("gemma3-270m"), device="cpu", dtype="bfloat16", int4=False)
    assert not any(isinstance(m, RowExactLinear) for m in plain.model.modules())
