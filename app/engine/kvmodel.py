"""A causal LM with one KV cache and the token ids that cache holds.

Both the main model and a draft model are driven through this: feed tokens, get the logits of the
last few positions, and rewind to any earlier length. Syncing to a new context by longest common
prefix is what makes multi-turn chat reuse the cache and keeps a draft model in step.
"""

from __future__ import annotations

from typing import Sequence

import torch
from transformers import DynamicCache, PreTrainedModel


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class KVModel:
    """Owns a model's DynamicCache; `ids` always equals the tokens whose keys/values it holds."""

    def __init__(self, model: PreTrainedModel, n_ctx: int | None = None) -> None:
        self.model = model
        self.n_ctx = n_ctx or int(getattr(model.config, "max_position_embeddings", 4096))
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        self.device = next(model.parameters()).device
        self.ids: list[int] = []
        self.cache = self._new_cache()

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

    @torch.inference_mode()
    def feed(self, new_ids: Sequence[int], n_logits: int = 1) -> torch.Tensor:
        """Append tokens to the cache; return float32 logits [n_logits, V] of the last positions."""
        input_ids = torch.tensor([list(new_ids)], dtype=torch.long, device=self.device)
        out = self.model(
            input_ids=input_ids, cache=self.cache, use_cache=True, logits_to_keep=n_logits
        )
        self.cache = out.cache if getattr(out, "cache", None) is not None else self.cache
        self.ids.extend(int(t) for t in new_ids)
        return out.logits[0, -n_logits:].float().cpu()

    def sync(self, context: Sequence[int]) -> torch.Tensor:
        """Make the cache hold `context` (reusing the common prefix); return the last logits [V]."""
        keep = min(common_prefix_length(self.ids, context), len(context) - 1)
        self.rewind(keep)
        return self.feed(context[keep:], 1)[0]
