"""A causal LM with one KV cache and the token ids that cache holds.

Both the main model and a draft model are driven through this: feed tokens, get the logits of the
last few positions, and rewind to any earlier length. Syncing to a new context by longest common
prefix is what makes multi-turn chat reuse the cache and keeps a draft model in step.
"""

from __future__ import annotations

import inspect
from typing import Callable, Sequence

import torch
import transformers
from transformers import DynamicCache, PreTrainedModel

from app.engine.cpu.attention import uses_cpu_attention
from app.engine.cpu.kvbuffer import buffered_float32_cache
from app.engine.cpu.leanstep import MAX_TOKENS, LeanStack
from app.engine.cpu.quantlinear import Int4Linear
from app.engine.cpu.screen import ScreenedHead, can_screen, screening_pays
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
        # An int4 head's rows are computed when first asked for, a few at a time (LogitRows), so
        # that a verify stops computing them at the first rejected draft.
        self._rowwise_head = isinstance(head, Int4Linear)
        self._softcap = getattr(model.config, "final_logit_softcapping", None)
        # With a bf16 twin of the int4 head (a tied embedding) and no soft cap, greedy verifies
        # find each position's argmax by screening (app.engine.cpu.screen), exactly, where this
        # CPU's bf16 products make that cheaper than the int4 rows themselves.
        table = getattr(model.get_input_embeddings(), "weight", None)
        screenable = self._softcap is None and can_screen(head, table)
        self._screen = ScreenedHead(head, table) if screenable and screening_pays() else None
        # A few new tokens (decoding, verifying) skip transformers' module tree where it can be.
        self._lean = LeanStack.for_model(model)
        self.ids: list[int] = []
        self.cache = self._new_cache()
        # Seconds of a step feeding n tokens, as measured for the model's plan (CostCurve.cost),
        # when the loader measured one: the draft-length schedule's prior.
        self.step_cost: Callable[[int], float] | None = None

    def _new_cache(self) -> DynamicCache:
        cache = DynamicCache(config=self.model.config)
        # Sliding-window layers (Gemma 3, Mistral) refuse a rollback past the window unless they
        # keep their past states (facts.md).
        if hasattr(cache, "activate_past_recording"):
            cache.activate_past_recording()
        if uses_cpu_attention(self.model):
            # float32, what that attention computes in, appended in place: app.engine.cpu.kvbuffer
            buffered_float32_cache(cache, self.n_ctx)
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

    def feed(self, new_ids: Sequence[int], n_logits: int = 1) -> torch.Tensor:
        """Append tokens to the cache; return float32 logits [n_logits, V] of the last positions."""
        return self.feed_rows(new_ids, n_logits).all()

    @torch.inference_mode()
    def feed_rows(self, new_ids: Sequence[int], n_logits: int = 1) -> "LogitRows":
        """Append tokens to the cache; the logits of the last n_logits positions, each computed
        when first asked for where the head runs row by row (an int4 head), else all at once."""
        if self._lean is not None and 0 < len(new_ids) <= MAX_TOKENS:
            rows = self._rows_of(self._lean.hidden(list(new_ids), self.cache, len(self.ids))[-n_logits:])
            self.ids.extend(int(t) for t in new_ids)
            return rows
        input_ids = torch.tensor([list(new_ids)], dtype=torch.long, device=self.device)
        if self._rowwise_head:
            base = getattr(self.model, self.model.base_model_prefix)
            out = base(input_ids=input_ids, cache=self.cache, use_cache=True)
            rows = self._rows_of(out.last_hidden_state[0, -n_logits:])
        else:
            out = self.model(input_ids=input_ids, cache=self.cache, use_cache=True, logits_to_keep=n_logits)
            rows = LogitRows(logits=out.logits[0, -n_logits:].float().cpu())
        self.cache = out.cache if getattr(out, "cache", None) is not None else self.cache
        self.ids.extend(int(t) for t in new_ids)
        return rows

    def _rows_of(self, hidden: torch.Tensor) -> "LogitRows":
        """The logits of these hidden rows: kept lazy for an int4 head, else computed at once."""
        if self._rowwise_head:
            return LogitRows(hidden=hidden, head=self._head, screen=self._screen)
        return LogitRows(logits=self._head(hidden))

    @torch.inference_mode()
    def _head(self, hidden: torch.Tensor) -> torch.Tensor:
        """The CausalLM's own head on hidden rows: the projection, then Gemma's soft cap if any."""
        logits = self.model.get_output_embeddings()(hidden)
        if self._softcap is not None:
            logits = torch.tanh(logits / self._softcap) * self._softcap
        return logits.float().cpu()

    def sync(self, context: Sequence[int]) -> torch.Tensor:
        """Make the cache hold `context` (reusing the common prefix); return the last logits [V]."""
        keep = min(common_prefix_length(self.ids, context), len(context) - 1)
        self.rewind(keep)
        return self.feed(context[keep:], 1)[0]


class LogitRows:
    """Logits of consecutive positions, given either computed or as hidden states and a head.

    A head given is run on several rows at once when the first of them is asked for: the first
    FIRST_ROWS, then all the others, since positions are read in order and a verify whose first
    drafts were all accepted is in a copied run. torch's int4 kernel computes rows in blocks: on
    Gemma 3 270M's 262k-token head (AVX2, one run) 4 rows cost 1.9 times one row and 16 rows 5
    times, where row by row they cost 4 and 16 times. A rejected first draft then wastes at most
    3 rows' share of a block. Which rows go together never changes a row's bits (the
    kernel sums over K only; tests/test_kvmodel.py)."""

    FIRST_ROWS = 4
    # Screening costs about two bf16 rows of the head where it pays (screening_pays); below this
    # many positions, computing the int4 rows is cheaper.
    SCREEN_FROM_ROWS = 3

    def __init__(self, logits: torch.Tensor | None = None, hidden: torch.Tensor | None = None,
                 head=None, screen: ScreenedHead | None = None) -> None:
        self._logits, self._hidden, self._head, self._screen = logits, hidden, head, screen
        self._rows: dict[int, torch.Tensor] = {}
        self._screened = None

    def __len__(self) -> int:
        return int((self._logits if self._logits is not None else self._hidden).shape[0])

    def row(self, i: int) -> torch.Tensor:
        """float32 logits [V] of position i."""
        if self._logits is not None:
            return self._logits[i]
        if i not in self._rows:
            self._compute(i, min(len(self), i + self.FIRST_ROWS) if not self._rows else len(self))
        return self._rows[i]

    def _compute(self, first: int, stop: int) -> None:
        """Rows [first, stop) in one product, those not computed yet."""
        stop = next((j for j in range(first, stop) if j in self._rows), stop)
        for j, logits in enumerate(self._head(self._hidden[first:stop]), start=first):
            self._rows[j] = logits

    def argmax(self, i: int) -> int:
        """The greedy token at position i: int(row(i).argmax()), screened where that is cheaper."""
        if self._logits is None and i not in self._rows and self._screen is not None and len(self) >= self.SCREEN_FROM_ROWS:
            if self._screened is None:
                self._screened = self._screen.rows(self._hidden)
            return self._screened.argmax(i)
        return first_argmax(self.row(i))

    def all(self) -> torch.Tensor:
        """float32 logits [n, V]; rows already computed are not computed again."""
        if self._logits is None:
            missing = [i for i in range(len(self)) if i not in self._rows]
            if missing:
                self._compute(missing[0], len(self))
            self._logits = torch.stack([self.row(i) for i in range(len(self))])
        return self._logits
