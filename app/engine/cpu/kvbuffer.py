"""A KV cache that appends into buffers it keeps, instead of concatenating at every step.

transformers' DynamicCache grows each layer's keys and values with torch.cat: every step copies
the whole cache once more, so a step's cost grows with the context beyond what attention itself
reads, and over 32k elements (SmolLM2: 170 tokens, Gemma 3 270M: 128) torch splits each copy over
both threads, which costs more than the copy at these sizes. Here each layer keeps a float32
buffer with room to spare and a step writes only its new states into it. A buffer that is full
grows to half as much again as it must hold, at most the context's length: at most 1.5x the
states' memory, 2.5x for the moment of a growth (concatenating took 2x at every step). The layer's
keys and values are views of the buffer, so transformers' own crop (a slice) still rewinds it, and
attention reads the same numbers: the same logits, bit for bit (tests/test_kvbuffer.py).

Measured against the concatenating cache (Zen 3, AVX2, 2 threads, steps interleaved in one
process, median ratio of 20), a one-token step of SmolLM2 at 60 / 150 / 400 / 1000 / 2000 tokens of
context: 0.98 / 0.98 / 0.96 / 0.89 / 0.88x in a quiet hour; 0.98-1.02x up to 400 tokens and
0.96-1.00x beyond in three runs on the same VM while it was busy (steps a third slower than
usual), where no gain shows. Gemma 3 270M, one quiet run: 0.99 / 0.99 / 0.96 / 0.96 / 0.98x, and
about 0.99x for a 16-token verify. (An earlier in-place cache on an AVX-512 machine had come out
no faster: its states are cold in the CPU's caches when attention reads them, where a copy
leaves them warm.)

The buffers hold the model's bf16 states widened exactly to float32, as the CPU attention computes
in float32 (app.engine.cpu.attention). Layers of another kind than transformers' dynamic full and
sliding-window layers keep transformers' update, widened.
"""

from __future__ import annotations

import functools

import torch
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

_MIN_TOKENS = 256  # the smallest buffer, in tokens: decoding then grows it rarely
# Suffix of the layer attribute holding (the view _appended returned last, where it starts in the
# buffer): a step that gets that very view back need not find where it starts (_start_in).
_LAST_VIEW = "_last_view"


def buffered_float32_cache(cache, max_tokens: int | None = None) -> None:
    """Make every layer of a transformers DynamicCache keep float32 keys and values in buffers
    that new states are written into (see the module's docstring); max_tokens bounds the room a
    buffer is given beyond what it must hold (the context's length)."""
    for layer in getattr(cache, "layers", []):
        update = _UPDATES.get(type(layer))
        if update is None:
            layer.update = functools.partial(_widened_update, layer.update)
            continue
        layer.__dict__["_most_tokens"] = max_tokens
        layer.update = functools.partial(update, layer)


def _widened_update(update, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
    return update(key_states.float(), value_states.float(), *args, **kwargs)


def _full_update(layer: DynamicLayer, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
    """DynamicLayer.update, appending into the layer's buffers."""
    layer.keys, layer.values = _append_states(layer, key_states, value_states)
    return layer.keys, layer.values


def _sliding_update(layer: DynamicSlidingWindowLayer, key_states: torch.Tensor, value_states: torch.Tensor,
                    *args, **kwargs):
    """DynamicSlidingWindowLayer.update (transformers 5), appending into the layer's buffers."""
    layer.cumulative_length += key_states.shape[-2]
    full_keys, full_values = _append_states(layer, key_states, value_states)
    if not layer.record_past:
        layer.keys = full_keys[:, :, -layer.sliding_window + 1 :, :]
        layer.values = full_values[:, :, -layer.sliding_window + 1 :, :]
        return full_keys, full_values
    # Recording the past: everything is kept until a crop restricts it to the window.
    layer.keys, layer.values = full_keys, full_values
    visible = layer.sliding_window - 1 + key_states.shape[-2]
    return full_keys[:, :, -visible:, :], full_values[:, :, -visible:, :]


_UPDATES = {DynamicLayer: _full_update, DynamicSlidingWindowLayer: _sliding_update}


def _append_states(layer, key_states: torch.Tensor, value_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(keys, values): views of the layer's buffers holding what it holds, then the new states."""
    if not torch.is_inference_mode_enabled():  # the buffers are written in place: keep them inference tensors
        with torch.inference_mode():
            return _append_states(layer, key_states, value_states)
    if not layer.is_initialized:
        layer.lazy_initialization(key_states, value_states)
    return (_appended(layer, "_key_buffer", layer.keys, key_states),
            _appended(layer, "_value_buffer", layer.values, value_states))


def _appended(layer, name: str, held: torch.Tensor | None, new: torch.Tensor) -> torch.Tensor:
    """A view of the layer's buffer `name` holding `held` (a view of it, or any tensor the layer
    holds otherwise) followed by `new` along the sequence, in float32."""
    buffer = layer.__dict__.get(name)
    n_new = new.shape[-2]
    last_view, last_start = layer.__dict__.get(name + _LAST_VIEW, (None, 0))
    if held is not None and held is last_view:  # decoding: the layer holds what this returned last step
        n_held, start = held.shape[-2], last_start
    elif held is None or held.dim() != new.dim() or held.shape[-2] == 0:
        n_held, start = 0, 0
    else:
        n_held = held.shape[-2]
        start = None if buffer is None else _start_in(buffer, held)
    if start is None or buffer is None or start + n_held + n_new > buffer.shape[-2]:
        needed = n_held + n_new
        capacity = max(_MIN_TOKENS, needed + needed // 2)
        most = layer.__dict__.get("_most_tokens")
        if most is not None:
            capacity = max(needed, min(capacity, most))
        grown = torch.empty(*new.shape[:-2], capacity, new.shape[-1], dtype=torch.float32, device=new.device)
        if n_held:
            grown.narrow(-2, 0, n_held).copy_(held)
        buffer, start = grown, 0
        layer.__dict__[name] = buffer
    buffer.narrow(-2, start + n_held, n_new).copy_(new)
    view = buffer.narrow(-2, start, n_held + n_new)
    layer.__dict__[name + _LAST_VIEW] = (view, start)
    return view


def _start_in(buffer: torch.Tensor, held: torch.Tensor) -> int | None:
    """Where along the sequence `held` starts in `buffer` when it is a view this module made or a
    crop of one (a slice along the sequence), else None. (Views made in inference mode have no
    _base to ask: the memory they point into says it.)"""
    row_bytes = buffer.stride(-2) * buffer.element_size()
    offset = held.data_ptr() - buffer.data_ptr()
    inside = 0 <= offset < buffer.shape[-2] * row_bytes and offset % row_bytes == 0
    if held.stride() != buffer.stride() or not inside:
        return None
    return offset // row_bytes
