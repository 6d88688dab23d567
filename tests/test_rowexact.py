"""bf16 linears whose rows are computed as each row alone would be."""

from __future__ import annotations

import torch

from app.engine.loader import load_model
from app.engine.cpu.quantlinear import Int4Linear
from app.engine.cpu.rowexact import (MAX_BYTES, MAX_ROWS, RowExactLinear, beats_int4_passes, replaces_int4,
                                     wrap_linears)
from tests.tiny_gguf import TinySpec, write_tiny_gguf
from tests.kv_checks import verify_and_steps


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


def test_int4_loads_wrap_their_bf16_matrices_and_verify_as_they_decode(tmp_path):
    # A 2048-wide ffn_down: there bf16's product of several rows rounds differently from one row's
    # (at the default 128 it does not, and the verify below would pass without the wrapping).
    spec = TinySpec(qtype="Q4_0", hidden=256, intermediate=2048, f16_matrices=("ffn_down.weight",))
    path = write_tiny_gguf(tmp_path / "mixed.gguf", spec)
    mixed = load_model(path, device="cpu", dtype="bfloat16")
    wrapped = [m for m in mixed.model.modules() if isinstance(m, RowExactLinear)]
    assert mixed.plan.int4 and len(wrapped) == 2  # each layer's F16 ffn_down
    ids = mixed.tokenizer.encode("The quick brown fox jumps over the lazy dog. Hello world, this is")
    prompt, drafts = ids[:8], ids[8:28]
    kv = mixed.kv_model()
    assert torch.equal(*verify_and_steps(kv, prompt, drafts))
    plain = load_model(path, device="cpu", dtype="bfloat16", int4=False)
    assert not any(isinstance(m, RowExactLinear) for m in plain.model.modules())


def test_the_demo_files_layers_run_on_the_int4_kernel_or_row_by_row(demo_path):
    """Every matrix of their layers runs on the int4 kernel, or in bf16 row by row where this CPU
    computes that for clearly less than its passes (Gemma's Q6_K ffn_down on AVX2, also its
    two-pass Q5_0 and Q8_0 with torch's scalar kernels): none in a batched bf16 product."""
    for name in ("smollm2-135m", "gemma3-270m"):
        loaded = load_model(demo_path(name), device="cpu", dtype="bfloat16")
        layers = getattr(loaded.model, loaded.model.base_model_prefix).layers
        wrapped = {id(m.linear) for m in layers.modules() if isinstance(m, RowExactLinear)}
        assert not [m for m in layers.modules() if isinstance(m, torch.nn.Linear) and id(m) not in wrapped], name
        matrices = [t for t in loaded.info.tensors if t.name.startswith("blk.") and len(t.shape) == 2]
        assert len(wrapped) == sum(replaces_int4(t) for t in matrices), name
    four_passes = [m for m in layers.modules() if isinstance(m, Int4Linear) and m.n_passes == 4]
    if beats_int4_passes(4):  # Gemma's Q6_K ffn_down of 9 layers, in bf16 rows
        assert not four_passes and len(wrapped) >= 9
    else:
        assert len(four_passes) == 9


def test_a_q6_k_layer_in_bf16_verifies_as_it_decodes(demo_path):
    """Gemma's layers, whatever runs its Q6_K matrices here: a 9-token verify gives the logits
    of 9 one-token steps, bit for bit."""
    loaded = load_model(demo_path("gemma3-270m"), device="cpu", dtype="bfloat16")
    ids = loaded.tokenizer.encode("def add(a, b):\n    return a + b\n\nThe quick brown fox jumps over the lazy dog.")
    prompt, drafts = ids[:-9], ids[-9:]
    kv = loaded.kv_model()
    assert torch.equal(*verify_and_steps(kv, prompt, drafts))
