"""Write small, real GGUF files with gguf's own writer, for tests of header parsing and compatibility.

The writer is independent of our parser, so a file it writes is a fair test input.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import gguf
import numpy as np

Q = gguf.GGMLQuantizationType


def make_tokens(n: int, prefix: str = "tok") -> list[str]:
    """A token list with the usual specials first; ids 3+ are `{prefix}{id}` (unique, non-empty)."""
    specials = ["<unk>", "<s>", "</s>"]
    return (specials + [f"{prefix}{i}" for i in range(len(specials), n)])[:n]


def small_tensors(vocab_size: int, n_embd: int = 64, seed: int = 0, n_layers: int = 2) -> dict[str, tuple[np.ndarray, Q]]:
    """token_embd F16, a Q8_0 projection per layer, an F32 norm: one tensor of each writable kind,
    and a layer for each of the header's (the reader refuses a block_count the tensors lack)."""
    rng = np.random.default_rng(seed)
    layers = {f"blk.{i}.attn_q.weight": (rng.standard_normal((n_embd, n_embd)).astype(np.float32), Q.Q8_0)
              for i in range(n_layers)}
    return {
        "token_embd.weight": (rng.standard_normal((vocab_size, n_embd)).astype(np.float16), Q.F16),
        **layers,
        "output_norm.weight": (np.ones(n_embd, dtype=np.float32), Q.F32),
    }


def write_gguf(
    path: Path,
    *,
    arch: str = "llama",
    tokens: Sequence[str] | None = None,
    vocab_type: str | None = "gpt2",
    bos: int | None = 1,
    eos: int | None = 2,
    add_bos: bool | None = None,
    add_eos: bool | None = None,
    chat_template: str | None = None,
    tensors: Mapping[str, tuple[np.ndarray, Q]] | None = None,
    n_layers: int = 2,
    n_embd: int = 64,
    n_head: int = 4,
    n_head_kv: int | Sequence[int] | None = 2,
    context_length: int | None = 128,  # None: not written (a test's `extra` writes its own)
    name: str | None = "Tiny Test",
    size_label: str | None = None,
    file_type: int | None = None,
    merges: Sequence[str] | None = None,
    extra: Callable[[gguf.GGUFWriter], None] | None = None,
) -> Path:
    """Write a GGUF file; `tensors` maps name -> (float array, ggml type to store it as)."""
    tokens = make_tokens(256) if tokens is None else list(tokens)
    if tensors is None:
        tensors = small_tensors(len(tokens), n_embd, n_layers=n_layers)
    w = gguf.GGUFWriter(path, arch)
    if name is not None:
        w.add_name(name)
    if size_label is not None:
        w.add_size_label(size_label)
    if file_type is not None:
        w.add_file_type(file_type)
    if context_length is not None:
        w.add_context_length(context_length)
    w.add_block_count(n_layers)
    w.add_embedding_length(n_embd)
    w.add_head_count(n_head)
    if isinstance(n_head_kv, int):
        w.add_head_count_kv(n_head_kv)
    elif n_head_kv is not None:
        w.add_array(f"{arch}.attention.head_count_kv", list(n_head_kv))
    if vocab_type is not None:
        w.add_tokenizer_model(vocab_type)
    if tokens:
        w.add_token_list(tokens)
    if merges:
        w.add_token_merges(list(merges))
    if bos is not None:
        w.add_bos_token_id(bos)
    if eos is not None:
        w.add_eos_token_id(eos)
    if add_bos is not None:
        w.add_add_bos_token(add_bos)
    if add_eos is not None:
        w.add_add_eos_token(add_eos)
    if chat_template is not None:
        w.add_chat_template(chat_template)
    if extra is not None:
        extra(w)
    for tname, (data, qtype) in tensors.items():
        if qtype in (Q.F32, Q.F16):
            w.add_tensor(tname, data.astype(np.float32 if qtype == Q.F32 else np.float16))
        else:
            w.add_tensor(tname, gguf.quants.quantize(data.astype(np.float32), qtype), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
