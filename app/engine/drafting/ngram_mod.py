"""llama.cpp's `ngram-mod` (common/ngram-mod.*, speculative.cpp's common_speculative_impl_ngram_mod):
one pool of n-grams -> the token that followed, shared by every request a server (or the window)
answers, learning each prompt and reply, and drafting by chaining lookups: what lets a repeated
request draft a whole earlier reply at once.

As llama.cpp: the pool is a fixed table of 4M int32 entries (16 MB) indexed by a polynomial hash of
the last n_match tokens (a collision overwrites: a wrong draft costs a rejection, never a wrong
answer); it is emptied when a quarter of it is used and after 5 drafts in a row with less than a
quarter accepted; a sequence's new n-grams are added in chunks of 32 tokens while it drafts; a
draft needs a chain of at least n_min tokens. Ours differs in two ways, each said where it is:
the chain is cut to the length the schedule asks for (llama.cpp drafts the whole chain; here a
chain of n_min known tokens is the evidence, the measured schedule the length), and a finished
reply's last n-grams are learned too (llama.cpp leaves the last chunk to its next prompt)."""

from __future__ import annotations

import threading
from typing import Sequence

import numpy as np

from app.engine.drafting.drafters import Draft, Drafter
from app.engine.loop.sampling import SamplingParams

_MUL = 6364136223846793005  # llama.cpp's multiplier
_MASK = (1 << 64) - 1
_EMPTY = -1
_CHUNK = 32  # tokens learned at a time while drafting
_RESET_OCCUPANCY = 0.25
_LOW_ACCEPT, _LOW_STREAK = 0.25, 5


class NgramModPool:
    """The shared table: n-grams of n tokens -> the token that followed."""

    def __init__(self, n: int, size: int = 4 * 1024 * 1024) -> None:
        self.n = n
        self.entries = np.full(size, _EMPTY, dtype=np.int32)
        self.used = 0
        self.lock = threading.Lock()  # a server's requests learn from several threads

    def index(self, tokens: Sequence[int]) -> int:
        h = 0
        for t in tokens[-self.n:]:
            h = (h * _MUL + int(t)) & _MASK
        return h % len(self.entries)

    def get(self, tokens: Sequence[int]) -> int:
        return int(self.entries[self.index(tokens)])

    def add_all(self, ids: Sequence[int], start: int, stop: int) -> None:
        """Learn the n-grams starting at start..stop-1 (each with the token after it), at once."""
        n = self.n
        stop = min(stop, len(ids) - n)
        if stop <= start:
            return
        tokens = np.asarray(ids, dtype=np.uint64)
        h = np.zeros(stop - start, dtype=np.uint64)
        with np.errstate(over="ignore"):
            for i in range(n):
                h = h * np.uint64(_MUL) + tokens[start + i:stop + i]
        where = (h % np.uint64(len(self.entries))).astype(np.int64)
        followers = tokens[start + n:stop + n].astype(np.int32)
        with self.lock:
            self.used += int(np.count_nonzero(self.entries[np.unique(where)] == _EMPTY))
            self.entries[where] = followers

    def occupancy(self) -> float:
        return self.used / len(self.entries)

    def reset(self) -> None:
        with self.lock:
            self.entries.fill(_EMPTY)
            self.used = 0


class NgramModDrafter(Drafter):
    """Drafts the chain of the pool's followers of the context's last n_match tokens."""

    name = "ngram-mod"

    def __init__(self, pool: NgramModPool, n_min: int = 48, n_max: int = 64, name: str = "ngram-mod") -> None:
        self.pool, self.n_min, self.n_max, self.name = pool, n_min, n_max, name
        self._learned_to: int | None = None  # context tokens whose n-grams are in the pool (None: a new sequence)
        self._last_len = 0
        self._n_low = 0
        self._chain: tuple[int, tuple[int, ...]] = (-1, ())

    def fresh(self) -> Drafter:
        return NgramModDrafter(self.pool, self.n_min, self.n_max, self.name)  # the pool is shared

    def configure(self, sampling: SamplingParams, draft_p_min: float) -> None:
        self._learned_to, self._last_len, self._chain = None, 0, (-1, ())

    def _learn(self, context: Sequence[int]) -> None:
        n = self.pool.n
        if self._learned_to is None:  # begin(): the prompt, then the pool's occupancy checked
            self.pool.add_all(context, 0, len(context) - n)
            self._learned_to = max(len(context) - n, 0)
            if self.pool.occupancy() > _RESET_OCCUPANCY:
                self.pool.reset()
        elif self._learned_to + _CHUNK < len(context) - 1:
            self.pool.add_all(context, self._learned_to, len(context) - 1 - n)
            self._learned_to = len(context) - 1 - n

    def chain(self, context: Sequence[int]) -> tuple[int, ...]:
        """The pool's chain after the context (at most n_max), learned first; () below n_min."""
        if self._chain[0] == len(context):
            return self._chain[1]
        self._learn(context)
        n = self.pool.n
        window, out = list(context[-n:]), []
        if len(window) == n:
            while len(out) < self.n_max:
                token = self.pool.get(window)
                if token == _EMPTY:
                    break
                out.append(token)
                window = window[1:] + [token]
        found = tuple(out) if len(out) >= max(self.n_min, 1) else ()
        self._chain = (len(context), found)
        return found

    def match(self, context: Sequence[int], max_tokens: int) -> tuple[int, tuple[int, ...]]:
        """(n_match, tokens) for CombinedDrafter: a chain matches all n_match tokens, the longest."""
        tokens = self.chain(context)[:max(max_tokens, 0)]
        self._last_len = len(tokens)
        return (self.pool.n, tokens) if tokens else (0, ())

    def propose(self, context: Sequence[int], max_tokens: int) -> Draft:
        return Draft(self.match(context, max_tokens)[1])

    def confident(self, context: Sequence[int]) -> bool | None:
        """A chain of n_min known tokens is a continuation seen before (a repeated request)."""
        return bool(self.chain(context))

    def accept(self, n_accepted: int) -> None:
        if not self._last_len:
            return
        if n_accepted / self._last_len < _LOW_ACCEPT:
            self._n_low += 1
            if self._n_low >= _LOW_STREAK:  # llama.cpp: a pool that keeps misleading is emptied
                self.pool.reset()
                self._n_low, self._learned_to = 0, None
        else:
            self._n_low = 0
        self._last_len = 0

    def finish(self, context: Sequence[int]) -> None:
        """The reply's last n-grams too (llama.cpp leaves them to its next prompt)."""
        if self._learned_to is not None:
            self.pool.add_all(context, self._learned_to, len(context) - self.pool.n)
