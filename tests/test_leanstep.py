"""A few new tokens through plain functions give what transformers' forward gives."""

from __future__ import annotations

import pytest
import torch

from app.engine.cpu.leanstep import MAX_TOKENS, LeanStack, _GemmaNorm, _LlamaNorm
from app.engine.loader import load_model

README_TEXT = (__import__("pathlib").Path(__file__).parents[1] / "README.md").read_text(encoding="utf-8")


def _pair(loaded):
    lean, reference = loaded.kv_model(), loaded.kv_model()
    reference._lean = None  # transformers' own forward
    return lean, reference


@pytest.mark.parametrize("name, prompt_chars", [("smollm2-135m", 1500), ("gemma3-270m", 1500),
                                                ("gemma3-270m", 2600)])  # past Gemma's 512-token window
def test_lean_steps_match_transformers_forward(demo_path, name, prompt_chars):
    loaded = load_model(demo_path(name), device="cpu", dtype="bfloat16")
    lean, reference = _pair(loaded)
    assert lean._lean is not None
    prompt = loaded.tokenizer.encode(README_TEXT[:prompt_chars])
    assert name != "gemma3-270m" or prompt_chars < 2000 or len(prompt) > 512
    lean.feed(prompt)
    reference.feed(prompt)
    tokens = loaded.tokenizer.encode(README_TEXT[5000:5400])[:24]
    ours = torch.stack([lean.feed([t])[0] for t in tokens])
    theirs = torch.stack([reference.feed([t])[0] for t in tokens])
    assert torch.allclose(ours, theirs, atol=1e-3, rtol=0)
    assert torch.equal(ours.argmax(-1), theirs.argmax(-1))
    lean.rewind(len(prompt))  # a verify of 17 drafts: bit for bit the one-token steps
    assert torch.equal(lean.feed(tokens[:17], 17), ours[:17])



@pytest.mark.parametrize("name, prompt_chars", [("smollm2-135m", 400), ("gemma3-270m", 2600)])
def test_unstacked_layers_decode_the_stacked_layers_bits(demo_path, name, prompt_chars):
    """Layers whose products cannot be stacked (int4 rows not in whole blocks, Gemma head norms of
    unequal epsilons) take attention's own one-token branch: the same bits as the stacked step."""
    loaded = load_model(demo_path(name), device="cpu", dtype="bfloat16")
    stacked, unstacked = loaded.kv_model(), loaded.kv_model()
    assert stacked._lean is not None
    if not stacked._lean.all_stacked:
        pytest.skip("this CPU's products do not stack (int4 packing layout not learned): no stacked step to match")
    unstacked._lean = LeanStack(stacked._lean.base, stacked._lean.gemma, stacked=False)
    assert not unstacked._lean.all_stacked
    prompt = loaded.tokenizer.encode(README_TEXT[:prompt_chars])
    tokens = loaded.tokenizer.encode(README_TEXT[5000:5200])[:6]
    for kv in (stacked, unstacked):
        kv.feed(prompt)
    ours = torch.stack([unstacked.feed([t])[0] for t in tokens])
    assert torch.equal(ours, torch.stack([stacked.feed([t])[0] for t in tokens]))

def test_the_norms_give_transformers_norms_bits():
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    generator = torch.Generator().manual_seed(0)
    llama, gemma = LlamaRMSNorm(576, eps=1e-5), Gemma3RMSNorm(640, eps=1e-6)
    with torch.no_grad():
        for module in (llama, gemma):
            module.weight.copy_(torch.randn(module.weight.shape, generator=generator))
    llama = llama.to(torch.bfloat16)
    for ours, theirs, width in ((_LlamaNorm.of(llama), llama, 576), (_GemmaNorm.of(gemma), gemma, 640)):
        for n_rows in (1, 2, 17, 2000):
            rows = torch.randn(n_rows, width, generator=generator) * torch.logspace(-3, 3, n_rows)[:, None]
            rows = rows.to(torch.bfloat16)
            with torch.inference_mode():
                assert torch.equal(ours(rows), theirs(rows))


@pytest.mark.parametrize("name", ["llama-q8", "qwen2-q8", "llama3-rope"])  # biases; Llama 3 rope scaling
def test_tiny_models_and_the_model_forward_agree(tiny_paths, name):
    loaded = load_model(tiny_paths[name], device="cpu", dtype="bfloat16")
    lean, reference = _pair(loaded)
    ids = loaded.tokenizer.encode("The quick brown fox jumps over the lazy dog.")
    ours = torch.cat([lean.feed(ids[:3], 3), lean.feed(ids[3:], len(ids) - 3)])
    theirs = reference.feed(ids, len(ids))
    assert torch.allclose(ours, theirs, atol=1e-2, rtol=0)


def test_prompts_and_float32_loads_keep_transformers_forward(tiny_paths):
    exact = load_model(tiny_paths["llama-q8"], device="cpu", dtype="float32")
    assert LeanStack.for_model(exact.model) is None
    half = load_model(tiny_paths["llama-q8"], device="cpu", dtype="bfloat16")
    kv = half.kv_model()
    calls = []
    kv._lean.hidden = lambda *args: calls.append(args) or (_ for _ in ()).throw(AssertionError("lean path"))
    kv.feed(list(range(5, 5 + MAX_TOKENS + 1)))  # longer than a verify: the model's forward
    assert not calls


def test_dequantized_loads_verify_in_one_batched_attention_call(demo_path):
    """Without int4 the matrices are batched (not row-exact), so attention is too: still the
    model's forward, closely."""
    loaded = load_model(demo_path("smollm2-135m"), device="cpu", dtype="bfloat16", int4=False)
    lean, reference = _pair(loaded)
    prompt = loaded.tokenizer.encode(README_TEXT[:800])
    tokens = loaded.tokenizer.encode(README_TEXT[5000:5300])[:17]
    lean.feed(prompt)
    reference.feed(prompt)
    ours, theirs = lean.feed(tokens, 17), reference.feed(tokens, 17)
    assert torch.allclose(ours, theirs, atol=0.15, rtol=0)
    assert (ours.argmax(-1) == theirs.argmax(-1)).float().mean() >= 0.9
