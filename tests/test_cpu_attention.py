"""Half-precision CPU attention computed in float32, against an exact (float64) reference."""

from __future__ import annotations

import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from app.engine.cpu.attention import NAME, ROW_BY_ROW, float32_attention
from app.engine.loader import load_model
from tests.kv_checks import verify_and_steps


class _Layer(torch.nn.Module):
    is_causal = True

    def __init__(self, groups: int = 1, row_by_row: bool = False) -> None:
        super().__init__()
        self.num_key_value_groups = groups  # transformers' SDPA repeats or packs the KV heads by this
        setattr(self, ROW_BY_ROW, row_by_row)


def _inputs(n_heads, n_kv, n_queries, n_keys, dim, seed=0):
    g = torch.Generator().manual_seed(seed)
    make = lambda *shape: torch.randn(*shape, generator=g).to(torch.bfloat16)  # noqa: E731
    return make(1, n_heads, n_queries, dim), make(1, n_kv, n_keys, dim), make(1, n_kv, n_keys, dim)


def _reference(q, k, v, mask, scale):
    """Attention in float64 on the same bf16 inputs: [1, M, H, D]."""
    group = q.shape[1] // k.shape[1]
    k, v = (t.double().repeat_interleave(group, 1) for t in (k, v))
    scores = q.double() @ k.transpose(-1, -2) * scale
    scores = scores.masked_fill(~mask, float("-inf"))
    return (scores.softmax(-1) @ v).transpose(1, 2)


def _causal(n_queries, n_keys):  # end-aligned: the M new positions are the last M keys
    return torch.ones(n_queries, n_keys, dtype=torch.bool).tril(n_keys - n_queries)[None, None]


@pytest.mark.parametrize("n_heads, n_kv, n_queries, n_keys, dim", [
    (4, 1, 1, 140, 256),   # Gemma 3 270M, decoding
    (4, 1, 9, 300, 256),   # Gemma 3 270M, verifying 8 drafts
    (9, 3, 1, 157, 64),    # SmolLM2, decoding
    (9, 3, 17, 180, 64),   # SmolLM2, verifying 16 drafts
    (8, 8, 40, 40, 32),    # a prompt, no grouping
])
@pytest.mark.parametrize("row_by_row", [True, False])
def test_bf16_attention_is_float32_accurate(n_heads, n_kv, n_queries, n_keys, dim, row_by_row):
    q, k, v = _inputs(n_heads, n_kv, n_queries, n_keys, dim)
    mask = _causal(n_queries, n_keys)
    ours, _ = float32_attention(_Layer(n_heads // n_kv, row_by_row), q, k, v, mask, scaling=dim**-0.5)
    exact = _reference(q, k, v, mask, dim**-0.5)
    assert ours.dtype == torch.bfloat16 and ours.shape == (1, n_queries, n_heads, dim)
    # Only the final rounding to bf16 remains: within half a bf16 step (2^-9 relative) of exact.
    assert ((ours.double() - exact).abs() <= exact.abs() * 2**-8 + 1e-6).all()
    # transformers' own SDPA in bf16 rounds its intermediate products: further from exact.
    theirs, _ = sdpa_attention_forward(_Layer(n_heads // n_kv), q, k, v, mask, scaling=dim**-0.5)
    assert (ours.double() - exact).abs().mean() <= (theirs.double() - exact).abs().mean()


def test_a_sliding_window_mask_hides_what_it_hides():
    q, k, v = _inputs(4, 1, 3, 130, 16, seed=1)
    window = torch.zeros(1, 1, 3, 130, dtype=torch.bool)
    for row in range(3):  # a sliding window over the end-aligned causal mask: old keys hidden
        window[..., row, 10 + row : 128 + row] = True
    ours, _ = float32_attention(_Layer(4, row_by_row=True), q, k, v, window, scaling=0.25)
    exact = _reference(q, k, v, window, 0.25)
    assert ((ours.double() - exact).abs() <= exact.abs() * 2**-8 + 1e-6).all()
    # Changing a hidden key changes nothing.
    k2 = k.clone()
    k2[..., 5, :] += 10
    again, _ = float32_attention(_Layer(4, row_by_row=True), q, k2, v, window, scaling=0.25)
    assert torch.equal(again, ours)


def test_bf16_cpu_loads_use_it_and_float32_loads_keep_sdpa(tiny_paths):
    half = load_model(tiny_paths["llama-q8"], device="cpu", dtype="bfloat16")
    exact = load_model(tiny_paths["llama-q8"], device="cpu", dtype="float32")
    assert half.model.config._attn_implementation == NAME
    assert exact.model.config._attn_implementation == "sdpa"
    ids = half.tokenizer.encode("The quick brown fox jumps over the lazy dog.")
    logits = half.kv_model().feed(ids, len(ids))
    assert torch.isfinite(logits).all()
    reference = exact.kv_model().feed(ids, len(ids))
    assert (logits.argmax(-1) == reference.argmax(-1)).float().mean() >= 0.9


def test_the_float32_cache_holds_the_bf16_states_and_changes_no_result(tiny_paths):
    from transformers import DynamicCache

    half = load_model(tiny_paths["llama-q8"], device="cpu", dtype="bfloat16")
    ids = half.tokenizer.encode("The quick brown fox jumps over the lazy dog.")
    widened = half.kv_model()
    narrow = half.kv_model()
    narrow.cache = DynamicCache(config=half.model.config)  # transformers' own, storing bf16
    got = torch.stack([widened.feed([t])[0] for t in ids])
    expected = torch.stack([narrow.feed([t])[0] for t in ids])
    assert widened.cache.layers[0].keys.dtype == torch.float32
    assert narrow.cache.layers[0].keys.dtype == torch.bfloat16
    assert torch.equal(widened.cache.layers[0].keys, narrow.cache.layers[0].keys.float())
    assert torch.equal(got, expected)
    widened.rewind(3)  # a rollback keeps the cache float32 and in step
    narrow.rewind(3)
    assert widened.cache.layers[0].keys.shape[-2] == 3
    assert torch.equal(widened.feed(ids[3:5], 2), narrow.feed(ids[3:5], 2))


def test_each_row_sees_one_range_of_keys():
    from app.engine.cpu.attention import _visible_ranges

    assert _visible_ranges(None, 3, 10) == [(0, 8), (0, 9), (0, 10)]
    window = torch.zeros(1, 1, 2, 10, dtype=torch.bool)
    window[..., 0, 2:9] = True
    window[..., 1, 3:10] = True
    assert _visible_ranges(window, 2, 10) == [(2, 9), (3, 10)]
    window[..., 1, 5] = False  # a hole: not one range, so the whole mask goes to SDPA
    assert _visible_ranges(window, 2, 10) is None
    assert _visible_ranges(torch.zeros(1, 1, 2, 10), 2, 10) is None  # an additive mask


@pytest.mark.parametrize("name", ["smollm2-135m", "gemma3-270m"])
def test_verifying_drafts_gives_the_rows_of_decoding_them_one_by_one(demo_path, name):
    """The speculative guarantee at its root: the main model's logits for k drafted positions,
    computed in one verify, are bit for bit those of k one-token steps. Both run every matrix of
    their layers in int4 (Gemma's Q6_K ones in four passes); tests/test_rowexact.py has a file
    with bf16 matrices in its layers."""
    loaded = load_model(demo_path(name), device="cpu", dtype="bfloat16")
    prompt = loaded.tokenizer.encode("def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return")
    drafts = loaded.tokenizer.encode(" a - b\n\ndef mul(a, b):\n    return a * b\n\ndef div(a, b):\n    return a / b")[:20]
    kv = loaded.kv_model()
    verified, one_by_one = verify_and_steps(kv, prompt, drafts)
    assert torch.equal(verified, one_by_one)
