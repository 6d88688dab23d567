"""A causal LM with one KV cache and the token ids that cache holds.

Both the main model and a draft model are driven through this: feed tokens, get the logits of the
last few positions, and rewind to any earlier length. Syncing to a new context by longest common
prefix is what makes multi-turn chat reuse the cache and keeps a draft model in step.
"""

from __future__ import annotations

import inspect
from typing import Callable, Sequence

import numpy as np
import torch
import transformers
from transformers import DynamicCache, PreTrainedModel

from app.engine.errors import SpeculaError
from app.engine.seam import common_prefix_length, first_argmax  # noqa: F401 - re-exported

# The first transformers whose forward takes the KV cache as `cache` (5.23 and older call it
# past_key_values): pyproject.toml asks for it too.
MIN_TRANSFORMERS = "5.24"


def require_cache_argument(forward: Callable | None = None) -> None:
    """Raise a one-line SpeculaError when transformers' forward has no `cache` argument. An older
    transformers takes cache= silently into **kwargs and builds a cache of its own, so ours stays
    empty and the first rollback fails deep inside it (seen with 5.17 on a GPU machine).
    forward: a loaded model's (default: Llama's, the same in every architecture)."""
    if forward is None:
        forward = transformers.LlamaForCausalLM.forward
    if "cache" not in inspect.signature(forward).parameters:
        raise SpeculaError(
            f"transformers {transformers.__version__} is too old for Specula, which needs {MIN_TRANSFORMERS} "
            f"or newer: pip install -U 'transformers>={MIN_TRANSFORMERS},<6'")


class KVModel:
    """Owns a model's DynamicCache; `ids` always equals the tokens whose keys/values it holds."""

    def __init__(self, model: PreTrainedModel, n_ctx: int | None = None) -> None:
        require_cache_argument(model.forward)
        self.model = model
        self.n_ctx = n_ctx or int(getattr(model.config, "max_position_embeddings", 4096))
        head = model.get_output_embeddings()
        self.vocab_size = int(head.out_features if hasattr(head, "out_features") else head.weight.shape[0])
        self.device = next(model.parameters()).device
        self.ids: list[int] = []
        self.cache = self._new_cache()
        # Seconds of a step feeding n tokens, where a backend measured them: the draft-length
        # schedule's prior (torch has none; the schedule measures as it goes).
        self.step_cost: Callable[[int], float] | None = None

    def _new_cache(self) -> DynamicCache:
        cache = DynamicCache(config=self.model.config)
        # Sliding-window layers (Gemma 3, Mistral) refuse a rollback past the window unless they
        # keep their past states (facts.md).
        if hasattr(cache, "activate_past_recording"):
            cache.activate_past_recording()
        return cache

    def reset(self) -> None:
        self.ids = []
        self.cache = self._new_cache()

    def rewind(self, n_tokens: int) -> None:
        """Keep only the first n_tokens of the cache."""
        n_remove = len(self.ids) - n_tokens
        if n_remove <= 0:
            return
        if n_tokens == 0:
            self.reset()
            return
        self.cache.crop(-n_remove)  # transformers 5: a negative count of tokens to remove
        del self.ids[n_tokens:]

    def feed(self, new_ids: Sequence[int], n_logits: int = 1) -> np.ndarray:
        """Append tokens to the cache; return float32 logits [n_logits, V] of the last positions."""
        return self.feed_rows(new_ids, n_logits).all()

    @torch.inference_mode()
    def feed_rows(self, new_ids: Sequence[int], n_logits: int = 1) -> "LogitRows":
        """Append tokens to the cache; the float32 logits of the last n_logits positions."""
        input_ids = torch.tensor([list(new_ids)], dtype=torch.long, device=self.device)
        out = self.model(input_ids=input_ids, cache=self.cache, use_cache=True, logits_to_keep=n_logits)
        self.cache = out.cache if getattr(out, "cache", None) is not None else self.cache
        self.ids.extend(int(t) for t in new_ids)
        return LogitRows(out.logits[0, -n_logits:].float().cpu().numpy())

    def sync(self, context: Sequence[int]) -> np.ndarray:
        """Make the cache hold `context` (reusing the common prefix); return the last logits [V]."""
        keep = min(common_prefix_length(self.ids, context), len(context) - 1)
        self.rewind(keep)
        return self.feed(context[keep:], 1)[0]


class LogitRows:
    """Logits of consecutive positions (app.engine.seam.LogitRowsLike), computed at once: numpy
    float32, as the seam hands them to the loop."""

    def __init__(self, logits: np.ndarray) -> None:
        self._logits = logits

    def __len__(self) -> int:
        return int(self._logits.shape[0])

    def row(self, i: int) -> np.ndarray:
        """float32 logits [V] of position i."""
        return self._logits[i]

    def argmax(self, i: int) -> int:
        """The greedy token at position i: the first of the largest logits."""
        return first_argmax(self._logits[i])

    def all(self) -> np.ndarray:
        """float32 logits [n, V]."""
        return self._logits
