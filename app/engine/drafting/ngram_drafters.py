"""Drafters on n-grams beyond the current prompt: the learned cache, and combinations.

NgramCacheDrafter drafts from an NgramCache (app.engine.drafting.ngram_cache) that learns from every
finished generation, and LearningDrafter lets any other drafter teach it too; CombinedDrafter
asks several n-gram drafters and keeps the proposal whose match is longest (ties: the first
given, e.g. prompt lookup before the cache: the conversation at hand is the better evidence),
falling back to a draft model when no n-gram matches, as llama.cpp gives draftless drafting
precedence over a draft model.

All are deterministic (no draft distribution), so speculative sampling stays exact: the choice of
proposal depends on the context only, never on a random draw.
"""

from __future__ import annotations

from typing import Sequence

from app.engine.drafting.drafters import Draft, Drafter
from app.engine.drafting.ngram_cache import N_MAX, NgramCache
from app.engine.loop.sampling import SamplingParams


class NgramCacheDrafter(Drafter):
    """Drafts what followed the context's last 2..4 tokens in earlier conversations, and learns
    each finished one (prompt and reply) into the cache."""

    name = "ngram-cache"

    def __init__(self, cache: NgramCache) -> None:
        self.cache = cache

    def fresh(self) -> Drafter:
        return NgramCacheDrafter(self.cache)  # shared: every request learns into and drafts from it

    def match(self, context: Sequence[int], max_tokens: int) -> tuple[int, tuple[int, ...]]:
        if max_tokens <= 0:
            return 0, ()
        return self.cache.continuation(context, max_tokens)

    def propose(self, context: Sequence[int], max_tokens: int) -> Draft:
        return Draft(self.match(context, max_tokens)[1])

    def confident(self, context: Sequence[int]) -> bool | None:
        """False where the cache knows no continuation of the context (nothing learned yet, or
        a context unlike any before: a combination with prompt lookup then counts as unsure,
        and drafts little on a hopeful prior); None where it knows one, since a 2-4 token match
        cannot tell a running copy from a chance one."""
        return None if self.cache.predict(context[-N_MAX:]) is not None else False

    def finish(self, context: Sequence[int]) -> None:
        self.cache.learn_new(context)


class CombinedDrafter(Drafter):
    """The longest n-gram match among `matchers` (drafters with a `match` method, such as
    PromptLookupDrafter and NgramCacheDrafter) drafts; without one, `fallback` does."""

    def __init__(self, matchers: Sequence[Drafter], fallback: Drafter | None = None) -> None:
        self.matchers = list(matchers)
        self.fallback = fallback
        self.name = "+".join([m.name for m in self.matchers] + ([fallback.name] if fallback else []))
        self._last: Drafter | None = None
        self._match: tuple[int, int, Drafter | None, tuple[int, ...]] | None = None  # (len, budget, who, tokens)
        self._model_now = False  # the schedule chose the draft model over a match this step

    def fresh(self) -> Drafter:
        return CombinedDrafter([m.fresh() for m in self.matchers], self.fallback.fresh() if self.fallback else None)

    def propose(self, context: Sequence[int], max_tokens: int) -> Draft:
        chosen, best = (None, ()) if self._model_now else self._best_match(context, max_tokens)
        if chosen is not None:
            self._last = chosen
            return Draft(best[:max_tokens])
        self._last = self.fallback
        return self.fallback.propose(context, max_tokens) if self.fallback else Draft()

    def free_draft(self, context: Sequence[int], max_tokens: int) -> bool:
        """Whether an n-gram matcher drafts here, before the draft model would (its match is
        kept for the propose() of this step)."""
        return self._best_match(context, max_tokens)[0] is not None

    def use_free(self, free: bool) -> None:
        """The schedule's choice for this step (SplitSchedule): a match's free draft, or the
        draft model's even where a matcher has one (its drafts expected to pay more here)."""
        self._model_now = not free and self.fallback is not None

    def _best_match(self, context: Sequence[int], max_tokens: int) -> tuple[Drafter | None, tuple[int, ...]]:
        """The matcher with the longest match and its tokens; asked twice a step (free_draft,
        then propose with at most as many tokens), matched once."""
        memo = self._match
        if memo is not None and memo[0] == len(context) and memo[1] >= max_tokens:
            return memo[2], memo[3]
        best_n, best, chosen = 0, (), None
        for matcher in self.matchers:
            n, tokens = matcher.match(context, max_tokens)  # type: ignore[attr-defined]
            if tokens and n > best_n:
                best_n, best, chosen = n, tokens, matcher
        self._match = (len(context), max_tokens, chosen, tuple(best))
        return chosen, tuple(best)

    def token_cost_s(self) -> float | None:
        return self.fallback.token_cost_s() if self.fallback else None

    def catch_up_s(self, context: Sequence[int]) -> float:
        return self.fallback.catch_up_s(context) if self.fallback else 0.0

    def accept(self, n_accepted: int) -> None:
        self._match, self._model_now = None, False  # the context moves on
        if self._last is not None:
            self._last.accept(n_accepted)

    def confident(self, context: Sequence[int]) -> bool | None:
        """True where a matcher is; False where every matcher says no and no draft model backs
        them; else None."""
        answer = self.matchers_confident(context)
        return None if answer is False and self.fallback is not None else answer

    def matchers_confident(self, context: Sequence[int]) -> bool | None:
        """The matchers' own answer, the draft model left out (what a schedule of the free
        drafts alone goes by): True where one sees a copy, False where all say no, else None."""
        answers = [matcher.confident(context) for matcher in self.matchers]
        if any(answer is True for answer in answers):
            return True
        return False if all(answer is False for answer in answers) else None

    def configure(self, sampling: SamplingParams, draft_p_min: float) -> None:
        self._match, self._model_now = None, False
        for drafter in self._all():
            drafter.configure(sampling, draft_p_min)

    def finish(self, context: Sequence[int]) -> None:
        for drafter in self._all():
            drafter.finish(context)

    def _all(self) -> list[Drafter]:
        return self.matchers + ([self.fallback] if self.fallback else [])


def learned_cache(drafter: Drafter) -> NgramCache | None:
    """The NgramCache a drafter (or a combination) learns into, if any: what to save."""
    if isinstance(drafter, LearningDrafter):
        return drafter.cache
    for part in [drafter, *getattr(drafter, "matchers", [])]:
        if isinstance(part, NgramCacheDrafter):
            return part.cache
    return None


class LearningDrafter(Drafter):
    """Any drafter, and each finished generation learned into an n-gram cache besides: the cache
    of a main model learns from every chat with it, whatever drafts meanwhile, so it is warm the
    day it is chosen. Learning costs a pass over the new tokens at the end of a reply. Everything
    else is the wrapped drafter's (its name, its draft model, its per-step calls), each forwarded
    by name below."""

    def __init__(self, inner: Drafter, cache: NgramCache) -> None:
        self.inner, self.cache = inner, cache
        self.name, self.text_level = inner.name, inner.text_level

    @property
    def draft(self):
        """The wrapped draft model drafter's own KV model (the server resets it between
        requests); None for a model-free drafter."""
        return getattr(self.inner, "draft", None)

    def propose(self, context: Sequence[int], max_tokens: int) -> Draft:
        return self.inner.propose(context, max_tokens)

    def accept(self, n_accepted: int) -> None:
        self.inner.accept(n_accepted)

    def configure(self, sampling: SamplingParams, draft_p_min: float) -> None:
        self.inner.configure(sampling, draft_p_min)

    def confident(self, context: Sequence[int]) -> bool | None:
        return self.inner.confident(context)

    def token_cost_s(self) -> float | None:
        return self.inner.token_cost_s()

    def catch_up_s(self, context: Sequence[int]) -> float:
        return self.inner.catch_up_s(context)

    def finish(self, context: Sequence[int]) -> None:
        self.inner.finish(context)
        self.cache.learn_new(context)

    def fresh(self) -> Drafter:
        return LearningDrafter(self.inner.fresh(), self.cache)


def learning_into(drafter: Drafter, cache: NgramCache | None) -> Drafter:
    """`drafter`, learning each finished generation into `cache` too (unless it already does)."""
    if cache is None or learned_cache(drafter) is cache:
        return drafter
    return LearningDrafter(drafter, cache)
