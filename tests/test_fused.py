"""Stacked int4 products (q, k, v as one; gate and up as one) give every output's own bits."""

from __future__ import annotations

import pytest
import torch

from app.engine.cpu import fused, layout, quantlinear
from app.engine.cpu.leanstep import LeanStack
from app.engine.cpu.quantlinear import pack_linear
from app.engine.cpu.rowexact import RowExactLinear
from app.engine.loader import load_model
from tests.test_quantlinear import _k_quant_blocks, _quantized

requires_stacking = pytest.mark.skipif(not (quantlinear.int4_available() and layout.learned() is not None),
                                reason="stacking needs torch's int4 kernel and its packing layout (learned here)")
ALL_TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q5_K", "Q6_K"]
README_TEXT = (__import__("pathlib").Path(__file__).parents[1] / "README.md").read_text(encoding="utf-8")


def _linear(ggml_type: str, rows: int, seed: int, bias: bool = False) -> quantlinear.Int4Linear:
    k = 256
    raw = (_k_quant_blocks(ggml_type, (rows, k), seed) if ggml_type in ("Q5_K", "Q6_K")
           else _quantized(ggml_type, (rows, k), seed))
    b = torch.nn.Parameter(torch.randn(rows).bfloat16(), requires_grad=False) if bias else None
    return pack_linear(raw, ggml_type, (rows, k), bias=b)


@requires_stacking
@pytest.mark.parametrize("ggml_type", ALL_TYPES)
def test_a_stacked_product_gives_each_matrix_its_own_bits(ggml_type):
    parts = [_linear(ggml_type, 192, 1), _linear(ggml_type, 64, 2), _linear(ggml_type, 64, 3)]
    x = torch.randn(17, 256, generator=torch.Generator().manual_seed(4)).bfloat16()
    alone = [part(x) for part in parts]
    stacked = fused.stack_int4(parts)
    assert stacked is not None and stacked.out_features == 320
    assert torch.equal(stacked(x), torch.cat(alone, dim=-1))
    assert torch.equal(stacked(x[5:6]), stacked(x)[5:6])  # rows still stand alone
    # The parts now read their rows of the stacked weights, and still give their own products.
    for i in range(stacked.n_passes):
        base = getattr(stacked, f"packed{i}").untyped_storage().data_ptr()
        assert all(getattr(p, f"packed{i}").untyped_storage().data_ptr() == base for p in parts)
    assert all(torch.equal(part(x), before) for part, before in zip(parts, alone))


@requires_stacking
def test_biases_are_stacked_with_zeros_for_a_matrix_without_one():
    parts = [_linear("Q8_0", 128, 1, bias=True), _linear("Q8_0", 64, 2), _linear("Q8_0", 64, 3, bias=True)]
    x = torch.randn(3, 256).bfloat16()
    alone = torch.cat([part(x) for part in parts], dim=-1)
    assert torch.equal(fused.stack_int4(parts)(x), alone)


@requires_stacking
def test_what_cannot_be_stacked_is_left_apart(monkeypatch):
    assert fused.stack_int4([_linear("Q4_0", 64, 1), _linear("Q8_0", 64, 2)]) is None  # 1 pass and 2
    assert fused.stack_int4([_linear("Q4_0", 64, 1), torch.nn.Linear(256, 64)]) is None
    assert fused.stack_int4([_linear("Q4_0", 64, 1)]) is None
    ragged = pack_linear(_quantized("Q4_0", (80, 256), 5), "Q4_0", (80, 256))  # not whole blocks
    assert fused.stack_int4([_linear("Q4_0", 64, 1), ragged]) is None
    monkeypatch.setattr(layout, "learned", lambda: None)  # a torch whose packing we do not know
    assert fused.stack_int4([_linear("Q4_0", 64, 1), _linear("Q4_0", 64, 2)]) is None


def test_bf16_matrices_stack_into_one_product_holding_their_weights_once():
    parts = [torch.nn.Linear(256, n, bias=bias, dtype=torch.bfloat16) for n, bias in ((128, True), (64, False))]
    x = torch.randn(1, 256).bfloat16()
    alone = torch.cat([part(x) for part in parts], dim=-1)
    stacked = fused.stack(parts)
    assert isinstance(stacked, torch.nn.Linear) and torch.equal(stacked(x), alone)
    assert parts[1].weight.untyped_storage().data_ptr() == stacked.weight.untyped_storage().data_ptr()
    assert torch.equal(torch.cat([part(x) for part in parts], dim=-1), alone)
    assert fused.stack([torch.nn.Linear(256, 64), torch.nn.Linear(256, 64)]) is None  # float32: left to transformers


def test_row_by_row_bf16_matrices_stack_into_one_still_computed_row_by_row():
    # Multi-pass matrices an int4 load keeps as bf16 rows (app.engine.cpu.rowexact): each row of
    # the stack is its own product, so a verify's rows are one-token steps' bits, stacked or not.
    generator = torch.Generator().manual_seed(3)
    parts = [RowExactLinear(torch.nn.Linear(256, n, bias=False, dtype=torch.bfloat16)) for n in (128, 64, 64)]
    for part in parts:
        part.linear.weight.data.normal_(generator=generator)
    rows = torch.randn(5, 256, generator=generator).bfloat16()
    alone = [torch.cat([part(rows[i : i + 1]) for part in parts], dim=-1) for i in range(5)]
    stacked = fused.stack(parts)
    assert isinstance(stacked, RowExactLinear)
    assert torch.equal(stacked(rows), torch.cat(alone))
    assert parts[2].linear.weight.untyped_storage().data_ptr() == stacked.linear.weight.untyped_storage().data_ptr()
    assert fused.stack([parts[0], torch.nn.Linear(256, 64, dtype=torch.bfloat16)]) is None  # one of each kind


@pytest.mark.parametrize("name, int4", [pytest.param("smollm2-135m", True, marks=requires_stacking),
                                        pytest.param("gemma3-270m", True, marks=requires_stacking),
                                        ("gemma3-270m", False)])
def test_stacked_layers_decode_and_verify_as_the_separate_matrices_do(demo_path, name, int4):
    """The real files (Q4_1; Gemma's Q5_0 q/k with Q8_0 or Q5_0 v; and dequantized to bf16): every
    layer stacked, and the logits of steps (and, int4, of a 17-token verify: row-exact) are bit
    for bit those of the unstacked layers."""
    loaded = load_model(demo_path(name), device="cpu", dtype="bfloat16", int4=int4)
    stacked_kv = loaded.kv_model()
    stack = stacked_kv._lean
    assert stack.all_stacked
    apart = LeanStack(stack.base, stack.gemma, stacked=False)
    assert not any(layer.qkv is not None or layer.gate_up is not None for layer in apart._layers)
    apart_kv = loaded.kv_model()
    apart_kv._lean = apart
    assert loaded.kv_model()._lean is stack  # built once per model
    prompt = loaded.tokenizer.encode(README_TEXT[:600])
    tokens = loaded.tokenizer.encode(README_TEXT[5000:5300])[:17]
    for kv in (stacked_kv, apart_kv):
        kv.feed(prompt)
    steps = [torch.stack([kv.feed([t])[0] for t in tokens[:4]]) for kv in (stacked_kv, apart_kv)]
    assert torch.equal(steps[0], steps[1])
    if int4:
        for kv in (stacked_kv, apart_kv):
            kv.rewind(len(prompt))
        assert torch.equal(stacked_kv.feed(tokens, 17), apart_kv.feed(tokens, 17))
