"""Drafting strategies behind one small interface (app.engine.seam's Drafter, as transformers'
CandidateGenerator): prompt lookup and a draft model of the main model's vocabulary.

A drafter proposes up to `max_tokens` continuation tokens for a context; the loop verifies them
with the main model and tells the drafter how many it accepted. New strategies are new classes.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np

from app.engine.seam import Draft, Drafter, KVModelLike as KVModel, NoDrafter, common_prefix_length, first_argmax
from app.engine.loop.sampling import SamplingParams, logits_to_probs, make_generator, sample, softmax

__all__ = ["Draft", "Drafter", "NoDrafter", "PromptLookupDrafter", "DraftModelDrafter", "ModelDrafter"]


class PromptLookupDrafter(Drafter):
    """Model-free drafting (prompt lookup / n-gram): find an earlier occurrence of the context's
    last n tokens and propose what followed it. Pays off when the reply copies from the prompt
    (code edits, rewrites, summaries with quotes).

    Two refinements over taking the latest occurrence (llama.cpp's prompt lookup). Replaying the
    greedy replies to the bench's five prompts on both demo models (128 tokens, drafts of 3, 7 and
    15) they accepted as many drafted tokens as before or more in every case:
    - Of the occurrences, the one whose preceding tokens match the context's furthest back wins
      (the latest on ties): that is where a copy is running from, where code and prose repeat
      short n-grams (a newline and an indent, `result`) all over.
    - When no n-gram ends at the last token but the tokens before it copy at least COPY_RUN
      tokens of an earlier passage, the last token replaced one of that passage (a renamed
      variable, a changed number) and the copy goes on after the replaced token (not for
      ngram-mod, which matches exactly its last n tokens). On Gemma 3 270M's code-rewrite prompt
      7-token drafts went from 97 of 165 drafted tokens accepted to 107 of 138."""

    name = "lookup"
    COPY_RUN = 8  # tokens before a replaced one that make a copy, not a chance match
    _MAX_OCCURRENCES = 64  # latest occurrences compared per n-gram (bounds the cost in long chats)
    _MAX_EXTENSION = 64  # tokens compared before an occurrence

    def __init__(self, ngram_max: int = 3, ngram_min: int = 1, draft_min: int = 0,
                 draft_max: int | None = None, name: str = "lookup", past_replaced: bool = True) -> None:
        self.ngram_max = ngram_max
        self.ngram_min = ngram_min
        # Bounds of its own (ngram-mod's n-min/n-max), inside the loop's draft budget.
        self.draft_min = draft_min
        self.draft_max = draft_max
        self.name = name
        self.past_replaced = past_replaced  # ngram-mod matches exactly its last n tokens: off
        self._index = _TokenIndex()

    def fresh(self) -> Drafter:
        return PromptLookupDrafter(self.ngram_max, self.ngram_min, self.draft_min, self.draft_max, self.name,
                                   self.past_replaced)

    def propose(self, context: Sequence[int], max_tokens: int) -> Draft:
        return Draft(self.match(context, max_tokens)[1])

    def confident(self, context: Sequence[int]) -> bool | None:
        """A copy is running: the longest n-gram match and the tokens matching before it make at
        least COPY_RUN tokens of an earlier passage."""
        return self.copy_run(context) >= self.COPY_RUN

    def copy_run(self, context: Sequence[int]) -> int:
        """Tokens of an earlier passage that the context ends with, as match() finds them (0 for
        none): its n-gram and the tokens matching before it."""
        ids = self._index.update(context)
        return next((n + before for n, _, before in self._matches(ids)), 0)

    def match(self, context: Sequence[int], max_tokens: int) -> tuple[int, tuple[int, ...]]:
        """(length of the matched n-gram, the tokens that followed it); (0, ()) for none. A copy
        past a replaced token counts as a match of length 1, the weakest."""
        if self.draft_max is not None:
            max_tokens = min(max_tokens, self.draft_max)
        if max_tokens <= 0:
            return 0, ()
        ids = self._index.update(context)
        for n, start, _ in self._matches(ids):
            if self._fits(follow := overlapping_copy(ids, start + n, max_tokens)):
                return n, tuple(follow)
        if not self.past_replaced:
            return 0, ()
        for n in range(min(self.ngram_max, len(ids) - 2), 0, -1):  # the last token replaced one
            found = self._occurrence(ids, len(ids) - 1 - n, n)
            if found is not None and n + found[1] >= self.COPY_RUN:
                follow = overlapping_copy(ids, found[0] + n + 1, max_tokens)
                if self._fits(follow):
                    return 1, tuple(follow)
                break
        return 0, ()

    def _matches(self, ids: list[int]) -> Iterator[tuple[int, int, int]]:
        """(n, start, matched tokens before it) of the best earlier occurrence of the context's
        last n tokens (_occurrence), for each n that has one, longest first."""
        for n in range(min(self.ngram_max, len(ids) - 1), self.ngram_min - 1, -1):
            found = self._occurrence(ids, len(ids) - n, n)
            if found is not None:
                yield n, *found

    def _fits(self, follow: list[int]) -> bool:
        return bool(follow) and len(follow) >= self.draft_min

    def _occurrence(self, ids: list[int], at: int, n: int) -> tuple[int, int] | None:
        """(start, matched tokens before it) of the earlier occurrence of ids[at : at + n] whose
        preceding tokens match those before `at` furthest back (the latest on ties), or None."""
        pattern = ids[at : at + n]
        best, seen = None, 0
        for start in self._index.before(pattern[0], at):
            if ids[start : start + n] != pattern:
                continue
            before = 0
            while (before < self._MAX_EXTENSION and start - before > 0
                   and ids[start - before - 1] == ids[at - before - 1]):
                before += 1
            if best is None or before > best[1]:
                best = (start, before)
            seen += 1
            if seen >= self._MAX_OCCURRENCES or before >= self._MAX_EXTENSION:
                break
        return best


def overlapping_copy(ids: list[int], source: int, count: int) -> list[int]:
    """`count` tokens copied from ids[source:], the copy going on from itself where it reaches
    the end of the context (LZ77's overlapping copy): after a repeating pattern (a 2-token
    indentation, a list's separator) the latest occurrence of the last n-gram lies one period
    back, and its plain follow-up would end after one period. On Gemma 3 270M's code prompt such
    a pattern was drafted 2 tokens at a time, 35 of 35 accepted, slower than plain decoding.
    Only for a short period (up to _MAX_PERIOD tokens): a copy that runs to the end from further
    back is a passage being copied, not a pattern, and what follows it is not known."""
    out = ids[source : source + count]
    period = len(ids) - source
    if period <= _MAX_PERIOD:
        for i in range(len(out), count):
            out.append(out[i - period])
    return out


_MAX_PERIOD = 16


class _TokenIndex:
    """Where each token occurs in the context, kept as the context grows (a step appends a few
    tokens), so that looking for an n-gram visits only the places its first token occurs: in a
    4000-token chat a scan of every position took 1.8 ms per step, about 6% of a SmolLM2 step."""

    def __init__(self) -> None:
        self.ids: list[int] = []
        self._at: dict[int, list[int]] = {}

    def update(self, context: Sequence[int]) -> list[int]:
        """Index `context` (rebuilt when it does not extend the last one: a new conversation, an
        edited turn) and return it as a list."""
        ids, known = list(context), len(self.ids)
        if len(ids) < known or ids[:known] != self.ids:
            self._at, known = {}, 0
        for i in range(known, len(ids)):
            self._at.setdefault(ids[i], []).append(i)
        self.ids = ids
        return ids

    def before(self, token: int, stop: int) -> Iterator[int]:
        """The positions of `token` below `stop`, latest first."""
        positions = self._at.get(token, [])
        for i in range(bisect.bisect_left(positions, stop) - 1, -1, -1):
            yield positions[i]


class DraftModelDrafter(Drafter):
    """A drafter that runs a draft model of its own (`reading`, a DraftReading of it): priced by
    that model's measured step and by what it must read before it drafts."""

    reading: DraftReading

    def token_cost_s(self) -> float | None:
        return self.reading.token_cost_s()

    def catch_up_s(self, context: Sequence[int]) -> float:
        return self.reading.catch_up_s(context)


class ModelDrafter(DraftModelDrafter):
    """A small model of the same vocabulary drafts autoregressively with its own KV cache."""

    def __init__(self, draft: KVModel, main_vocab_size: int, name: str = "draft") -> None:
        self.draft = draft
        self.main_vocab_size = main_vocab_size
        self.name = name
        self.sampling = SamplingParams()
        self.p_min = 0.0
        self.generator = make_generator(0)
        self.reading = DraftReading(draft)

    def fresh(self) -> Drafter:
        return ModelDrafter(self.draft, self.main_vocab_size, name=self.name)

    def configure(self, sampling: SamplingParams, draft_p_min: float) -> None:
        self.sampling = sampling
        self.p_min = draft_p_min
        # The draft's own random stream, distinct from the main model's but reproducible.
        self.generator = make_generator(None if sampling.seed is None else sampling.seed + 1)

    def _distribution(self, logits) -> np.ndarray:
        """Draft logits -> q over the main model's vocabulary (sizes may differ by <= 128)."""
        logits = np.asarray(logits, dtype=np.float32)
        v = self.main_vocab_size
        if logits.shape[-1] > v:
            logits = logits[..., :v]
        elif logits.shape[-1] < v:
            pad = np.full((*logits.shape[:-1], v - logits.shape[-1]), -np.inf, dtype=np.float32)
            logits = np.concatenate([logits, pad], axis=-1)
        if self.sampling.greedy:
            return softmax(logits)  # confidence for draft_p_min only
        return logits_to_probs(logits[None], self.sampling)[0]

    def propose(self, context: Sequence[int], max_tokens: int) -> Draft:
        if max_tokens <= 0:
            return Draft()
        logits = self.draft.sync(context)
        self.reading.read(len(context))
        tokens: list[int] = []
        dists: list[np.ndarray] = []
        while True:
            q = self._distribution(logits)
            # Decide on the draft's confidence before sampling: a stop that depended on the
            # sampled token would skew the proposal away from q and break exact sampling.
            if float(q.max()) < self.p_min:
                break  # the draft is unsure: stop rather than waste verify work
            token = first_argmax(q) if self.sampling.greedy else sample(q, self.generator)
            tokens.append(token)
            dists.append(q)
            if len(tokens) >= max_tokens:
                break
            logits = self.draft.feed([token], 1)[0]
        probs = None if self.sampling.greedy or not dists else np.stack(dists)
        return Draft(tuple(tokens), probs)


class DraftReading:
    """What a draft model has read of the context, and what reading the rest would cost, from
    its measured step curve (`step_cost` seconds of a step feeding n tokens with every row's
    logits: for catching up, where only the last row's are needed, an upper bound)."""

    def __init__(self, draft: KVModel, same_vocabulary: bool = True) -> None:
        self.draft = draft
        # Another vocabulary's cache cannot be compared with the context: until its first draft
        # it is taken to hold none of it (for a probe's price, the dearer guess).
        self.same_vocabulary = same_vocabulary
        self._read: int | None = None  # context tokens in its cache as of its last draft

    def token_cost_s(self) -> float | None:
        step = getattr(self.draft, "step_cost", None)
        return float(step(1)) if step is not None else None

    def read(self, n_tokens: int) -> None:
        self._read = n_tokens

    def catch_up_s(self, context: Sequence[int]) -> float:
        step = getattr(self.draft, "step_cost", None)
        if step is None:
            return 0.0
        if self._read is None:  # a new generation: what the shared cache holds of this context
            self._read = common_prefix_length(self.draft.ids, context) if self.same_vocabulary else 0
        behind = len(context) - min(self._read, len(context))
        return float(step(behind)) if behind > 0 else 0.0
