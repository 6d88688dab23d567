"""A header checked against its own tensors before anything is built from it: the layer count,
heads, embedding, feed-forward, rope, layout, vocabulary and float keys must agree with the
tensor table (llama.cpp likewise refuses a tensor whose shape the header does not imply)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from app.engine.errors import ModelFileError
from app.engine.gguf.values import DEFAULT_ALIGNMENT, StringArray, as_int, is_count, kind_of

if TYPE_CHECKING:
    from app.engine.gguf.info import GGUFInfo


class _Mismatch(Exception):
    """What disagrees, said as the one line a user sees after the file's name."""


def check_tensor_table(info: GGUFInfo) -> None:
    """Refuse, naming the key, a header whose sizes disagree with its own tensors.

    What is built comes from the header (layer count, heads, vocabulary), while the memory check
    and the weights come from the tensors: `block_count = 1000000` beside 30 layers of tensors
    passed the check and then allocated without bound. llama.cpp likewise refuses any tensor whose
    shape differs from what the header implies. Run before anything is built; a split file's first
    part, which lacks the other parts' tensors, is refused here too."""
    try:
        _check_layers(info)
        _check_embedding(info)
        _check_heads(info)
        _check_feed_forward(info)
        _check_rope(info)
        _check_layout(info)
        _check_vocabulary(info)
        _check_floats(info)
    except _Mismatch as e:
        raise ModelFileError(f"{info.path.name}: {e}") from None


def _key(info: GGUFInfo, name: str) -> str:
    return f"{info.architecture}.{name}"


def _check_layers(info: GGUFInfo) -> None:
    present = set()
    for t in info.tensors:
        parts = t.name.split(".")
        if len(parts) > 2 and parts[0] == "blk" and parts[1].isdigit():
            present.add(int(parts[1]))
    key = _key(info, "block_count")
    if info.n_layers <= 0:
        raise _Mismatch(f"metadata {key} is {info.n_layers}: no layers to build")
    layers_with_tensors = len(present & set(range(info.n_layers)))
    if layers_with_tensors != info.n_layers or (present and max(present) >= info.n_layers):
        raise _Mismatch(f"metadata {key} = {info.n_layers} disagrees with the tensors "
                        f"({len(present)} layers, blk.{min(present, default=0)}-blk.{max(present, default=0)})")


def _check_embedding(info: GGUFInfo) -> None:
    by_name = {t.name: t for t in info.tensors}
    embd = by_name.get("token_embd.weight")
    if embd is None or len(embd.shape) != 2:
        raise _Mismatch("no 2-D token_embd.weight tensor")
    if embd.shape[1] != info.n_embd:
        raise _Mismatch(f"metadata {_key(info, 'embedding_length')} = {info.n_embd} disagrees with "
                        f"token_embd.weight {list(embd.shape)}")
    vocab_key = _key(info, "vocab_size")
    if vocab_key in info.metadata and int(info.metadata[vocab_key]) != embd.shape[0]:
        # transformers' config takes its vocabulary size from this key: 2,000,000 beside a
        # 49,152-row table sized the model (and calibrate's 15 GB) from the key. llama.cpp
        # refuses the same file for the tensor's shape.
        raise _Mismatch(f"metadata {vocab_key} = {info.metadata[vocab_key]} disagrees with "
                        f"token_embd.weight {list(embd.shape)}")
    tokens = info.metadata.get("tokenizer.ggml.tokens")
    for name in ("token_embd.weight", "output.weight"):
        tensor = by_name.get(name)
        if tokens is not None and tensor is not None and tensor.shape[0] != len(tokens):
            raise _Mismatch(f"metadata tokenizer.ggml.tokens has {len(tokens)} tokens but {name} "
                            f"has {tensor.shape[0]} rows")


def _per_layer(info: GGUFInfo, name: str, default: Any) -> list[int]:
    value = info.metadata.get(_key(info, name), default)
    if isinstance(value, np.ndarray):
        if len(value) != info.n_layers:
            raise _Mismatch(f"metadata {_key(info, name)} has {len(value)} values for {info.n_layers} layers")
        return [int(v) for v in value]
    return [int(value or 0)] * info.n_layers


def _check_heads(info: GGUFInfo) -> None:
    """Each layer's attention projections against the head counts and lengths they imply."""
    md, by_name = info.metadata, {t.name: t for t in info.tensors}
    heads = _per_layer(info, "attention.head_count", 0)
    kv_heads = _per_layer(info, "attention.head_count_kv", md.get(_key(info, "attention.head_count"), 0))
    for layer, (n_head, n_kv) in enumerate(zip(heads, kv_heads)):
        q, k = by_name.get(f"blk.{layer}.attn_q.weight"), by_name.get(f"blk.{layer}.attn_k.weight")
        v, qkv = by_name.get(f"blk.{layer}.attn_v.weight"), by_name.get(f"blk.{layer}.attn_qkv.weight")
        if q is None and qkv is None:
            continue  # no plain attention in this layer (recurrent, MLA): nothing to compare
        if n_head <= 0:
            raise _Mismatch(f"metadata {_key(info, 'attention.head_count')} is {n_head} for layer {layer}")
        if n_kv > n_head or (n_kv and n_head % n_kv):
            raise _Mismatch(f"metadata {_key(info, 'attention.head_count_kv')} = {n_kv} does not divide "
                            f"{_key(info, 'attention.head_count')} = {n_head}")
        k_len = as_int(md.get(_key(info, "attention.key_length"))) or info.n_embd // n_head
        v_len = as_int(md.get(_key(info, "attention.value_length"))) or k_len
        expected = ({q: n_head * k_len, k: n_kv * k_len, v: n_kv * v_len} if qkv is None
                    else {qkv: n_head * k_len + n_kv * (k_len + v_len)})
        for tensor, rows in expected.items():
            if tensor is not None and (len(tensor.shape) != 2 or tensor.shape[0] != rows
                                       or tensor.shape[1] != info.n_embd):
                raise _Mismatch(f"{tensor.name} {list(tensor.shape)} disagrees with the header's head "
                                f"counts and lengths (expects [{rows}, {info.n_embd}]; keys "
                                f"{_key(info, 'attention.head_count')}, {_key(info, 'attention.head_count_kv')}, "
                                f"{_key(info, 'attention.key_length')})")


def _check_feed_forward(info: GGUFInfo) -> None:
    """feed_forward_length (transformers' intermediate_size) against each layer's ffn_down, whose
    input is that size in every layout (ffn_up may hold gate and up fused, Phi-3's 2 x n_ff)."""
    key = _key(info, "feed_forward_length")
    if key not in info.metadata:
        return
    by_name = {t.name: t for t in info.tensors}
    for layer, n_ff in enumerate(_per_layer(info, "feed_forward_length", 0)):
        down = by_name.get(f"blk.{layer}.ffn_down.weight")
        if down is None:
            continue  # experts only, or no feed-forward in this layer: nothing to compare
        gate = by_name.get(f"blk.{layer}.ffn_gate.weight")
        if (n_ff <= 0 or down.shape != (info.n_embd, n_ff)
                or (gate is not None and gate.shape != (n_ff, info.n_embd))):
            raise _Mismatch(f"metadata {key} = {n_ff} disagrees with {down.name} {list(down.shape)} "
                            f"(layer {layer})")


# Architectures whose rotary dimension is the head's whole length: llama.cpp refuses any other
# (invalid n_rot), and transformers' config reads the key as head_dim, sizing every projection.
_ROPE_IS_HEAD = ("llama", "mistral", "deci", "falcon")
_MAX_HEAD_LENGTH = 1 << 16


def _check_rope(info: GGUFInfo) -> None:
    """rope.dimension_count: positive, even, at most the head's length (its whole length where
    the architecture rotates all of it)."""
    key = _key(info, "rope.dimension_count")
    if key not in info.metadata:
        return
    value = info.metadata[key]
    if not is_count(value):
        raise _Mismatch(f"metadata {key} must be a non-negative integer, not {kind_of(value)}")
    n_rot, head = int(value), info.head_dim
    if head <= 0:  # no attention heads to rotate: only a sane bound
        head = _MAX_HEAD_LENGTH
    if n_rot <= 0 or n_rot % 2 or n_rot > head or (info.architecture in _ROPE_IS_HEAD and n_rot != head):
        raise _Mismatch(f"metadata {key} = {n_rot} does not fit the heads' length {info.head_dim}")


def _check_layout(info: GGUFInfo) -> None:
    """Each tensor once, at an aligned offset, its data apart from the others': ggml's reader
    refuses any other layout, and torch would read shifted or shared bytes as weights."""
    alignment = as_int(info.metadata.get("general.alignment"), DEFAULT_ALIGNMENT)
    names: set[str] = set()
    end = 0
    for t in sorted(info.tensors, key=lambda t: t.offset):
        if t.name in names:
            raise _Mismatch(f"tensor {t.name!r} appears twice")
        names.add(t.name)
        if t.offset % alignment or t.offset < end:
            raise _Mismatch(f"tensor {t.name!r}: data at offset {t.offset} is not aligned to "
                            f"{alignment} or overlaps the tensor before it (which ends at {end})")
        end = t.offset + t.n_bytes


def _check_vocabulary(info: GGUFInfo) -> None:
    """What llama.cpp's vocabulary aborts the process on (a GGML_ASSERT, not an error it returns):
    a token text twice, once it names an empty token `[EMPTY_<id>]` as llama-vocab.cpp does, and
    a file without a vocabulary (tokenizer.ggml.model none), whose every token query asserts."""
    model = info.metadata.get("tokenizer.ggml.model")
    if model in ("none", "no_vocab"):
        raise _Mismatch(f"metadata tokenizer.ggml.model is {model!r}: no vocabulary to run with")
    tokens = info.metadata.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, StringArray):
        return
    blob = tokens.blob
    texts = [blob[s:e] or b"[EMPTY_%d]" % i
             for i, (s, e) in enumerate(zip(tokens.starts.tolist(), tokens.ends.tolist()))]
    if len(set(texts)) != len(texts):
        first: dict[bytes, int] = {}
        for i, text in enumerate(texts):
            if text in first:
                raise _Mismatch(f"metadata tokenizer.ggml.tokens has {text[:40]!r} twice "
                                f"(tokens {first[text]} and {i})")
            first[text] = i


# Floats whose hostile values llama.cpp does not refuse: a NaN or negative norm epsilon aborts in
# ggml-cpu's norm (GGML_ASSERT(eps >= 0)); a rope base of zero or below makes every logit NaN.
_FLOAT_KEYS = (("attention.layer_norm_rms_epsilon", False), ("attention.layer_norm_epsilon", False),
               ("rope.freq_base", True), ("rope.freq_base_swa", True))


def _check_floats(info: GGUFInfo) -> None:
    for name, positive in _FLOAT_KEYS:
        key = _key(info, name)
        if key not in info.metadata:
            continue
        value = info.metadata[key]
        number = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))
        if not number or not math.isfinite(value) or value < 0 or (positive and value == 0):
            raise _Mismatch(f"metadata {key} must be a finite number {'above' if positive else 'of at least'} 0, "
                            f"not {kind_of(value)}")
