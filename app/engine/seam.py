"""The seam between the speculative loop (with its drafters) and a backend that runs a model.

A backend's KV model (app.engine.backends.llamacpp.kv.LlamaKV, app.engine.backends.torch.kv.KVModel for
torch) holds one KV cache and the token ids in it, feeds tokens and hands back logit rows of the
positions asked for, and rewinds to any earlier length. The loop never asks which backend it
drives. The drafter's interface is here too, so that the loop and the drafters meet here and
neither folder imports the other's modules for it. Rows are numpy float32 arrays: the llama.cpp path imports neither torch nor
transformers (the torch backend converts at its edge).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Protocol, Sequence

import numpy as np

if TYPE_CHECKING:
    from app.engine.loop.sampling import SamplingParams

# The ceiling of the adaptive draft length (--spec-draft-n-max, the window's Draft max): as far as
# llama.cpp's ngram-mod drafts (64). The schedule drafts long only where the measured step curve
# and the acceptance seen make it pay (a long copy, a learned continuation): on a 2-core CPU a
# batch's price per token keeps falling well past 16 tokens.
DEFAULT_DRAFT_MAX = 64


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


@dataclass(frozen=True)
class Draft:
    tokens: tuple[int, ...] = ()
    # Draft distributions q [k, V] for speculative sampling; None for a deterministic drafter.
    probs: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.tokens)


class Drafter:
    """The interface. `name` is what reports and charts call it."""

    name = "none"
    text_level = False  # True for a draft model with another vocabulary, drafting through text

    def propose(self, context: Sequence[int], max_tokens: int) -> Draft:
        raise NotImplementedError

    def accept(self, n_accepted: int) -> None:
        """Called after each verify step with how many of the proposed tokens were kept."""

    def configure(self, sampling: SamplingParams, draft_p_min: float) -> None:
        """Called once per generation with the settings in force."""

    def confident(self, context: Sequence[int]) -> bool | None:
        """Whether, at next to no cost, this drafter sees a draft that is likely to be accepted
        now (True: a schedule that has stopped drafting probes at once instead of waiting) or
        sees none (False: a schedule without evidence yet starts with one draft, and such
        steps' first drafts keep an acceptance rate of their own); None where it cannot tell
        without drafting (a draft model). Asked once a step."""
        return None

    def token_cost_s(self) -> float | None:
        """Seconds per drafted token once its own model has read the context: a draft model's
        measured one-token step (llama.cpp measures a model's steps at load). None for a
        model-free drafter (next to nothing) or where nothing was measured (torch): the
        schedule then goes by the drafting time the steps show."""
        return None

    def catch_up_s(self, context: Sequence[int]) -> float:
        """Seconds to bring its own model up to `context` before it can draft: a draft model
        reads what it has not seen (the prompt at first, the reply since it last drafted)."""
        return 0.0

    def finish(self, context: Sequence[int]) -> None:
        """Called once a generation ends, with its whole context (prompt and reply): a drafter
        that learns from conversations (app.engine.drafting.ngram_drafters) learns here."""

    def fresh(self) -> Drafter:
        """A drafter with this one's settings and shared resources (a draft model's KV cache,
        synced by prefix; a learned n-gram cache) but per-generation state of its own: what the
        server gives each request."""
        raise NotImplementedError(f"{type(self).__name__} has no fresh()")


class NoDrafter(Drafter):
    """Plain decoding: the baseline every speedup is measured against."""

    name = "none"

    def propose(self, context: Sequence[int], max_tokens: int) -> Draft:
        return Draft()

    def fresh(self) -> Drafter:
        return NoDrafter()
