"""Attention as two small products per KV head, against transformers' own SDPA attention."""

from __future__ import annotations

import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from app.engine.gemm_attention import NAME, gemm_attention
from app.engine.loader import load_model


class _Layer(torch.nn.Module):
    is_causal = True

    def __init__(self, groups: int = 1) -> None:
        super().__init__()
        self.num_key_value_groups = groups  # transformers' SDPA repeats the KV heads by this


def _inputs(n_heads, n_kv, n_queries, n_keys, dim, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    make = lambda *shape: torch.randn(*shape, generator=g).to(dtype)  # noqa: E731
    return make(1, n_heads, n_queries, dim), make(1, n_kv, n_keys, dim), make(1, n_kv, n_keys, dim)


@pytest.mark.parametrize("n_heads, n_kv, n_queries, n_keys, dim", [
    (4, 1, 1, 140, 256),   # Gemma 3 270M, decoding
    (4, 1, 9, 300, 256),   # Gemma 3 270M, verifying 8 drafts
    (9, 3, 1, 157, 64),    # SmolLM2, decoding
    (9, 3, 17, 180, 64),   # SmolLM2, verifying 16 drafts
    (8, 8, 5, 128, 32),    # no grouping
])
def test_matches_sdpa_causal_and_grouped(n_heads, n_kv, n_queries, n_keys, dim):
    q, k, v = _inputs(n_heads, n_kv, n_queries, n_keys, dim, torch.float32)
    ours, _ = gemm_attention(_Layer(), q, k, v, None, scaling=dim**-0.5)
    # SDPA's reference: repeated KV heads and an explicit end-aligned causal mask.
    mask = torch.ones(n_queries, n_keys, dtype=torch.bool).tril(n_keys - n_queries)[None, None]
    expected, _ = sdpa_attention_forward(_Layer(), q, k.repeat_interleave(n_heads // n_kv, 1),
                                         v.repeat_interleave(n_heads // n_kv, 1), mask, scaling=dim**-0.5)
    assert ours.shape == expected.shape == (1, n_queries, n_heads, dim)
    assert torch.allclose(ours, expected, atol=1e-5)


def test_an_explicit_mask_hides_what_it_hides():
    q, k, v = _inputs(4, 1, 3, 130, 16, torch.float32, seed=1)
    window = torch.zeros(1, 1, 3, 130, dtype=torch.bool)
    for row in range(3):  # a sliding window over the end-aligned causal mask: old keys hidden
        window[..., row, 10 + row : 128 + row] = True
    ours, _ = gemm_attention(_Layer(), q, k, v, window, scaling=0.25)
    expected, _ = sdpa_attention_forward(_Layer(), q, k.expand(1, 4, 130, 16), v.expand(1, 4, 130, 16), window, scaling=0.25)
    assert torch.allclose(ours, expected, atol=1e-5)


@pytest.mark.parametrize("n_queries, n_keys", [(40, 40), (1, 60)])  # a prompt; a short context
def test_prompts_and_short_contexts_go_to_sdpa_unchanged(n_queries, n_keys):
    q, k, v = _inputs(4, 2, n_queries, n_keys, 16, torch.float32, seed=2)
    ours, _ = gemm_attention(_Layer(2), q, k, v, None, scaling=0.25)
    expected, _ = sdpa_attention_forward(_Layer(2), q, k, v, None, scaling=0.25)
    assert torch.equal(ours, expected)


def test_bf16_cpu_loads_use_it_and_float32_loads_keep_sdpa(tiny_paths):
    packed = load_model(tiny_paths["llama-q8"], device="cpu", dtype="bfloat16")
    exact = load_model(tiny_paths["llama-q8"], device="cpu", dtype="float32")
    assert packed.plan.int4 == (packed.model.config._attn_implementation == NAME)
    assert exact.model.config._attn_implementation == "sdpa"
    kv = packed.kv_model()
    ids = packed.tokenizer.encode("The quick brown fox jumps over the lazy dog.")
    logits = kv.feed(ids, len(ids))
    assert torch.isfinite(logits).all()
    reference = exact.kv_model().feed(ids, len(ids))
    assert (logits.argmax(-1) == reference.argmax(-1)).float().mean() >= 0.9
