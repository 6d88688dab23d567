"""The seam between the speculative loop (with its drafters) and a backend that runs a model.

A backend's KV model (app.engine.backends.llamacpp.LlamaKV, app.engine.backends.torch_kv.KVModel for
torch) holds one KV cache and the token ids in it, feeds tokens and hands back logit rows of the
positions asked for, and rewinds to any earlier length. The loop never asks which backend it
drives. Torch only here (no transformers), so that the llama.cpp path starts without it.
"""

from __future__ import annotations

from typing import Callable, Protocol, Sequence

import torch


class LogitRowsLike(Protocol):
    """Logits of consecutive positions of one feed."""

    def __len__(self) -> int: ...

    def row(self, i: int) -> torch.Tensor:
        """float32 logits [V] of position i."""

    def argmax(self, i: int) -> int:
        """The greedy token at position i (the first of equal maxima)."""

    def all(self) -> torch.Tensor:
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

    def feed(self, new_ids: Sequence[int], n_logits: int = 1) -> torch.Tensor:
        """Append tokens; float32 logits [n_logits, V] of the last positions."""

    def feed_rows(self, new_ids: Sequence[int], n_logits: int = 1) -> LogitRowsLike:
        """Append tokens; the logit rows of the last n_logits positions."""

    def sync(self, context: Sequence[int]) -> torch.Tensor:
        """Make the cache hold `context` (reusing the common prefix); the last logits [V]."""


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


_ARGMAX_CHUNK = 1024


def first_argmax(row: torch.Tensor) -> int:
    """int(row.argmax()) for a 1-D float row: the first index of the largest value (of the first
    NaN, if any). torch's argmax over a whole vocabulary runs one slow pass (0.33 ms for 262k
    logits, AVX2); the maxima of chunks, then the first chunk holding the largest, then its own
    argmax give the same index in 0.06 ms."""
    n = row.shape[0]
    if n < 64 * _ARGMAX_CHUNK:
        return int(row.argmax())
    main = n - n % _ARGMAX_CHUNK
    maxima = row[:main].reshape(-1, _ARGMAX_CHUNK).amax(1)
    if main < n:
        maxima = torch.cat([maxima, row[main:].amax(0, keepdim=True)])
    first = int(maxima.argmax()) * _ARGMAX_CHUNK
    return first + int(row[first : first + _ARGMAX_CHUNK].argmax())
