"""The seam between the speculative loop (with its drafters) and a backend that runs a model.

A backend's KV model (app.engine.backends.llamacpp.kv.LlamaKV, app.engine.backends.torch.kv.KVModel for
torch) holds one KV cache and the token ids in it, feeds tokens and hands back logit rows of the
positions asked for, and rewinds to any earlier length. The loop never asks which backend it
drives. Rows are numpy float32 arrays: the llama.cpp path imports neither torch nor
transformers (the torch backend converts at its edge).
"""

from __future__ import annotations

from typing import Callable, Protocol, Sequence

import numpy as np


class LogitRowsLike(Protocol):
    """Logits of consecutive positions of one feed."""

    def __len__(self) -> int: ...

    def row(self, i: int) -> np.ndarray:
        """float32 logits [V] of position i."""

    def argmax(self, i: int) -> int:
        """The greedy token at position i (the first of equal maxima)."""

    def all(self) -> np.ndarray:
        """float32 logits [n, V]."""


class KVModelLike(Protocol):
    """One KV cache over a model; `ids` always equals the tokens whose keys/values it holds."""

    ids: list[int]
    n_ctx: int
    vocab_size: int
    step_cost: Callable[[int], float] | None

    def reset(self) -> None: ...

    def rewind(self, n_tokens: int) -> None:
        """Keep only the first n_tokens of the cache."""

    def feed(self, new_ids: Sequence[int], n_logits: int = 1) -> np.ndarray:
        """Append tokens; float32 logits [n_logits, V] of the last positions."""

    def feed_rows(self, new_ids: Sequence[int], n_logits: int = 1) -> LogitRowsLike:
        """Append tokens; the logit rows of the last n_logits positions."""

    def sync(self, context: Sequence[int]) -> np.ndarray:
        """Make the cache hold `context` (reusing the common prefix); the last logits [V]."""


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def first_argmax(row) -> int:
    """The first index of the largest value of a 1-D float row (of the first NaN, if any), as
    llama.cpp's greedy sampler and torch's argmax pick."""
    return int(np.argmax(row))
