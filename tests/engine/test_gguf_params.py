"""Parameter counts count each weight once (issue 60 item 11): a GGUF that stores a tied output
layer again as output.weight (Qwen's own Qwen2.5-Coder files) said "1.8B params" for a 1.5B model
and "630M" for a 0.5B. Real GGUF files written by tests/header_gguf.py; the real built-in pair
where it is installed."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from app.engine.gguf.format import format_info
from app.engine.gguf.info import read_gguf_info
from app.engine.gguf.params import label_count
from app.hub.library_entries import count_text, fact_parts
from tests.header_gguf import make_tokens, small_tensors, write_gguf

VOCAB, EMBD = 256, 64
EMBED = VOCAB * EMBD  # 16,384
BODY = 2 * EMBD * EMBD + EMBD  # two layers' attn_q and the output norm: 8,256


def with_output(seed: int = 1) -> dict:
    """small_tensors plus an output.weight of token_embd's shape, in another type (as Qwen's files)."""
    tensors = small_tensors(VOCAB, EMBD)
    out = np.random.default_rng(seed).standard_normal((VOCAB, EMBD)).astype(np.float32)
    return {**tensors, "output.weight": (out, Q.Q8_0)}


def write(tmp_path, name: str, tensors: dict, size_label: str | None):
    return read_gguf_info(write_gguf(tmp_path / name, tokens=make_tokens(VOCAB), tensors=tensors,
                                     size_label=size_label))


def test_a_tied_output_stored_again_is_counted_once(tmp_path):
    tied = write(tmp_path, "tied.gguf", with_output(), "25K")  # the label counts the matrix once
    assert (tied.n_params, tied.tied_output) == (EMBED + BODY, EMBED)
    assert count_text(tied.n_params) == "25K" and "25K params" in fact_parts(tied)  # not 41K
    assert "counted once, 41.0K with both copies" in format_info(tied)  # `specula inspect` says what is counted
    assert tied.memory_bytes("float32") == (2 * EMBED + BODY) * 4  # memory still counts both copies


def test_an_untied_output_and_a_file_without_one_count_every_tensor(tmp_path):
    untied = write(tmp_path, "untied.gguf", with_output(), "41K")  # as Llama 3.1 8B: its own head
    assert (untied.n_params, untied.tied_output) == (2 * EMBED + BODY, 0)
    unlabelled = write(tmp_path, "unlabelled.gguf", with_output(), None)  # nothing to decide by
    assert (unlabelled.n_params, unlabelled.tied_output) == (2 * EMBED + BODY, 0)
    shared = write(tmp_path, "shared.gguf", small_tensors(VOCAB, EMBD), "25K")  # tied, stored once (Gemma)
    assert (shared.n_params, shared.tied_output) == (EMBED + BODY, 0)
    assert "with both copies" not in format_info(shared)


def test_size_labels():
    assert [label_count(x) for x in ("1.5B", "0.5B", "270M", "25K")] == [1.5e9, 0.5e9, 2.7e8, 25e3]
    assert [label_count(x) for x in ("8x7B", "30B-A3B", "", None, 7, "0B")] == [None] * 6


@pytest.mark.parametrize("key, shown", [("qwen2.5-coder-1.5b", "1.5B"), ("qwen2.5-coder-0.5b", "494M")])
def test_the_real_pair_counts_as_its_publisher_does(key, shown):
    from app.hub.builtin import builtin_path, is_installed

    if not is_installed(key):
        pytest.skip(f"the built-in {key} is not installed")
    info = read_gguf_info(builtin_path(key))
    assert count_text(info.n_params) == shown and info.tied_output > 0
