"""The in-place KV cache (app.engine.cpu.kvbuffer) against transformers' concatenating layers."""

import random

import pytest
import torch
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

from app.engine.cpu.kvbuffer import buffered_float32_cache


class _Cache:
    """What buffered_float32_cache needs of a DynamicCache: its layers."""

    def __init__(self, layer) -> None:
        self.layers = [layer]


def _twins(kind: str):
    """(transformers' layer, the same kind of layer made buffered)."""
    def make():
        if kind == "full":
            return DynamicLayer()
        layer = DynamicSlidingWindowLayer(sliding_window=24)
        if kind == "sliding, recording":
            layer.activate_past_recording()
        return layer
    reference, buffered = make(), make()
    buffered_float32_cache(_Cache(buffered))
    return reference, buffered


@pytest.mark.parametrize("kind", ["full", "sliding, recording", "sliding"])
def test_appending_in_place_gives_what_concatenating_gives(kind):
    """Prompts, single tokens, verifies and rewinds, past the buffer's first size (256 tokens)."""
    rng = random.Random(0)
    generator = torch.Generator().manual_seed(0)
    reference, buffered = _twins(kind)
    for step in range(120):
        n_new = rng.choice([1, 1, 1, 5, 17]) if step else 40
        keys = torch.randn(1, 3, n_new, 8, generator=generator).to(torch.bfloat16)
        values = torch.randn(1, 3, n_new, 8, generator=generator).to(torch.bfloat16)
        expected = reference.update(keys.float(), values.float())
        with torch.inference_mode():
            got = buffered.update(keys, values)
        for a, b in zip(got, expected):
            assert a.dtype == torch.float32 and torch.equal(a, b)
        assert torch.equal(buffered.keys, reference.keys) and torch.equal(buffered.values, reference.values)
        assert buffered.get_seq_length() == reference.get_seq_length()
        assert buffered.get_mask_sizes(1) == reference.get_mask_sizes(1)
        if kind != "sliding" and n_new > 1 and rng.random() < 0.7:  # a verify that kept some of its drafts
            removed = rng.randrange(1, n_new)
            reference.crop(-removed)
            buffered.crop(-removed)
    assert buffered.get_seq_length() > 256 or kind == "sliding"


def test_a_decoding_step_writes_into_the_memory_it_already_holds():
    _, layer = _twins("full")
    with torch.inference_mode():
        layer.update(torch.randn(1, 2, 10, 4), torch.randn(1, 2, 10, 4))
        before = layer.keys.data_ptr(), layer.values.data_ptr()
        for _ in range(5):
            keys, values = layer.update(torch.randn(1, 2, 1, 4), torch.randn(1, 2, 1, 4))
        layer.crop(-3)  # a rewind is a slice of the same memory, and the next step writes after it
        keys, values = layer.update(torch.randn(1, 2, 1, 4), torch.randn(1, 2, 1, 4))
    assert (keys.data_ptr(), values.data_ptr()) == before
    assert keys.shape == (1, 2, 13, 4)


def test_room_to_spare_stops_at_the_context_length():
    layer = DynamicLayer()
    buffered_float32_cache(_Cache(layer), max_tokens=300)
    with torch.inference_mode():
        for _ in range(290):
            layer.update(torch.randn(1, 1, 1, 4), torch.randn(1, 1, 1, 4))
    assert layer.keys.shape[-2] == 290
    assert layer._key_buffer.shape[-2] <= 300


def test_a_buffer_made_in_inference_mode_takes_states_outside_it():
    """Prompts may run transformers' forward under no_grad after decoding steps in inference mode."""
    _, layer = _twins("full")
    with torch.inference_mode():
        layer.update(torch.ones(1, 1, 2, 4), torch.ones(1, 1, 2, 4))
    with torch.no_grad():
        keys, _ = layer.update(torch.full((1, 1, 3, 4), 2.0), torch.full((1, 1, 3, 4), 2.0))
    assert keys[0, 0, :, 0].tolist() == [1.0, 1.0, 2.0, 2.0, 2.0]
