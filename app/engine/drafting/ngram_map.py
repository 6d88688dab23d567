"""llama.cpp's `ngram-map-k` and `ngram-map-k4v` (common/ngram-map.cpp, common_ngram_map_*), ported
step for step: the same search order, hash index, key and value statistics, acceptance bookkeeping
and thresholds, so that the same history drafts the same tokens.

The context's last size_n tokens are the key. Its latest earlier occurrence (found through a hash
index of positions, else by a backwards scan of what the index does not hold yet) drafts the
size_m tokens that followed it. Each key remembers how many tokens its last draft had accepted and
drafts no more than that next time (a key whose draft was rejected whole never drafts again).
k4v besides drafts only a key seen at least min_hits times, counts up to 4 different m-grams seen
after it, and drafts only when the most frequent one was seen at least twice as often as the others
together. llama.cpp's quirks are kept: k4v drafts what followed the key's occurrence it found even
where another m-gram is the most frequent, the occurrence found is counted again at each draft, and
the size_n + size_m + 1 positions up to the prompt's end are never searched.

Per-sequence state (llama.cpp keeps one map per server slot): fresh() starts an empty one; a drafter
kept across generations runs llama.cpp's begin() with each new prompt (the first step's context
without its sampled token). Drafts are cut to the loop's draft length, and the key remembers what
was accepted of the cut draft, as llama.cpp's server cuts a draft to its slot's n_max.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from app.engine.drafting.drafters import Draft, Drafter
from app.engine.drafting.kinds import NGRAM_MAP_K, NGRAM_MAP_K4V, MapParams
from app.engine.loop.sampling import SamplingParams

MAX_VALUES = 4  # COMMON_NGRAM_MAX_VALUES: m-grams counted per key
HASH_SLOTS = 262144  # COMMON_NGRAM_HASH_MAP_SIZE: entries of the hash -> position index
MAX_COUNT = 16380  # COMMON_NGRAM_MAX_VALUE_COUNT
_LCG = 2654435761  # the index's 32-bit hash: h = h * LCG + token, mod 2^32
_MASK32 = (1 << 32) - 1


def ngram_hash(tokens: Sequence[int]) -> int:
    """common_ngram_map_hash, modulo the index size."""
    h = 0
    for token in tokens:
        h = (h * _LCG + int(token)) & _MASK32
    return h % HASH_SLOTS


@dataclass
class Key:
    """common_ngram_map_key; values are [position of the m-gram, times seen, accepted at its last draft]."""

    key_idx: int
    stat_idx: int = 0
    key_num: int = 0
    values: list[list[int]] = field(default_factory=list)


class NgramMap:
    """common_ngram_map over one sequence's history `inp` (the context without its last token)."""

    def __init__(self, params: MapParams, key_only: bool) -> None:
        self.n, self.m, self.min_hits, self.key_only = params.size_n, params.size_m, params.min_hits, key_only
        self.keys: list[Key] = []
        self.size_last_begin = 0  # the prompt's length at the last begin()
        self.idx_last_check = 0
        self.last_draft: tuple[int, int] | None = None  # (key offset, value slot) of the last draft
        self.key_map = np.zeros(HASH_SLOTS, dtype=np.int64)  # hash -> n-gram position (0: none)
        self.key_map_last_idx = 0  # positions up to here are in key_map

    def begin(self, prompt: Sequence[int]) -> None:
        """common_ngram_map_begin: a new prompt; what was learned past its shared part goes."""
        size = len(prompt)
        cleanup = self.size_last_begin
        if cleanup > size:
            cleanup = size - self.n - self.m if size > self.n + self.m else 0
        if size < self.idx_last_check:
            self.key_map[self.key_map >= max(cleanup, 1)] = 0
            self.key_map_last_idx = cleanup - 1 if cleanup > 0 else 0
            self._forget_from(cleanup)
        self.idx_last_check = self.size_last_begin = size

    def _forget_from(self, cleanup: int) -> None:
        for i in range(len(self.keys) - 1, -1, -1):
            key = self.keys[i]
            if key.key_idx >= cleanup:
                del self.keys[i]
                continue
            if self.key_only:
                continue
            for j in range(MAX_VALUES - 1, -1, -1):
                if key.values[j][0] != 0 and key.values[j][0] >= cleanup:
                    key.values[j:] = [list(v) for v in key.values[j + 1 :]] + [[0, 0, key.values[-1][2]]]
            if key.values[0][0] == 0:
                del self.keys[i]

    def draft(self, inp: Sequence[int], sampled: int) -> list[int]:
        """common_ngram_map_draft: the draft after history `inp` and the token just sampled."""
        self.last_draft = None
        cur_len, n, m = len(inp), self.n, self.m
        if cur_len < 2 * n + m:
            return []
        self.idx_last_check = cur_len
        key = [*inp[cur_len - n + 1 :], sampled]
        match_pos = self.find(inp, key)
        self._index(inp)
        if match_pos == 0:
            return []
        offset = next((i for i, k in enumerate(self.keys) if list(inp[k.key_idx : k.key_idx + n]) == key), None)
        if offset is None:
            offset = len(self.keys)
            self.keys.append(Key(match_pos, values=[[0, 0, m] for _ in range(MAX_VALUES)]))
        entry = self.keys[offset]
        entry.key_num = min(entry.key_num + 1, MAX_COUNT)
        if self.key_only:
            slot = 0
        else:
            if entry.key_num < self.min_hits:
                return []
            slot = self._count_values(inp, key, entry, match_pos)
            if slot is None:
                return []
        self.last_draft = (offset, slot)
        return list(inp[match_pos + n : match_pos + n + min(m, entry.values[slot][2])])

    def accept(self, n_accepted: int) -> None:
        """common_ngram_map_accept: the value drafted last remembers how many were accepted."""
        if self.last_draft is not None:
            offset, slot = self.last_draft
            self.keys[offset].values[slot][2] = n_accepted
            self.last_draft = None  # llama.cpp accepts once per draft

    def find(self, inp: Sequence[int], key: list[int]) -> int:
        """The key's position: through the hash index, else the latest in what it lacks; 0: none."""
        cur_len, n, m = len(inp), self.n, self.m
        at = int(self.key_map[ngram_hash(key)])
        if at != 0 and at < cur_len - n - m - 1 and list(inp[at : at + n]) == key:
            return at
        for lo, hi in self._unindexed(cur_len):
            for j in range(hi, lo, -1):
                if inp[j] == key[0] and list(inp[j : j + n]) == key:
                    return j
        return 0

    def _unindexed(self, cur_len: int) -> list[tuple[int, int]]:
        """The positions (lo, hi] searched and indexed, latest first: the prompt's, then the reply's."""
        n, m, begin, last = self.n, self.m, self.size_last_begin, self.key_map_last_idx
        ranges = [(last, begin - n - m - 1)] if begin > n + m + 1 else []
        return ranges + [(max(begin, last), cur_len - n - m - 1)]

    def _index(self, inp: Sequence[int]) -> None:
        """Put the unindexed positions in the hash index: at an empty entry, the latest position."""
        for lo, hi in self._unindexed(len(inp)):
            if hi <= lo:
                continue
            positions = np.arange(hi, lo, -1)
            ids = np.asarray(inp[lo + 1 : hi + self.n], dtype=np.int64).astype(np.uint32)
            h = np.zeros(len(positions), dtype=np.uint32)
            for k in range(self.n):  # uint32 arrays wrap around: the C++ uint32_t arithmetic
                h = h * np.uint32(_LCG) + ids[positions - lo - 1 + k]
            slots, first = np.unique(h % np.uint32(HASH_SLOTS), return_index=True)
            free = self.key_map[slots] == 0
            self.key_map[slots[free]] = positions[first[free]]
        self.key_map_last_idx = max(len(inp) - self.n - self.m - 1, self.key_map_last_idx)

    def _count_values(self, inp: Sequence[int], key: list[int], entry: Key, match_pos: int) -> int | None:
        """k4v: count the m-grams after each occurrence of the key since the last count; the slot
        of the most frequent, or None where it is not twice as frequent as the others together."""
        n, m = self.n, self.m
        for i in range(entry.stat_idx, match_pos + 1):
            if inp[i] != key[0] or list(inp[i : i + n]) != key:
                continue
            start = i + n
            for value in entry.values:
                if value[0] == 0:  # an empty slot: a new m-gram
                    value[:] = [start, 0, m]
                elif list(inp[start : start + m]) != list(inp[value[0] : value[0] + m]):
                    continue
                value[1] = min(value[1] + 1, MAX_COUNT)
                break
        entry.stat_idx = match_pos
        counts = [value[1] for value in entry.values]
        best = max(range(MAX_VALUES), key=lambda v: (counts[v], -v)) if max(counts) > 0 else 0
        others = sum(counts) - counts[best]
        if others > 0 and counts[best] < 2 * others:
            return None
        return best


class NgramMapDrafter(Drafter):
    """`ngram-map-k` (key_only) or `ngram-map-k4v` behind the Drafter interface."""

    def __init__(self, params: MapParams = MapParams(), key_only: bool = True) -> None:
        self.params, self.key_only = params, key_only
        self.name = NGRAM_MAP_K if key_only else NGRAM_MAP_K4V
        self.map = NgramMap(params, key_only)
        self._begun = False

    def fresh(self) -> Drafter:
        return NgramMapDrafter(self.params, self.key_only)

    def configure(self, sampling: SamplingParams, draft_p_min: float) -> None:
        self._begun = False  # a new generation: begin() with its prompt at the first step

    def _history(self, context: Sequence[int]) -> list[int]:
        """llama.cpp's `inp` (the context without the token just sampled), begin() run first
        where a new generation starts (its prompt, or a shorter context than last checked)."""
        inp = list(context[:-1])
        if not self._begun or len(inp) < self.map.idx_last_check:
            self.map.begin(inp)
            self._begun = True
        return inp

    def match(self, context: Sequence[int], max_tokens: int) -> tuple[int, tuple[int, ...]]:
        """(size_n, the draft) or (0, ()): the context's last token is llama.cpp's `sampled`."""
        self.map.last_draft = None
        if max_tokens <= 0 or not context:
            return 0, ()
        drafted = self.map.draft(self._history(context), context[-1])[:max_tokens]
        if not drafted:
            self.map.last_draft = None  # llama.cpp's server accepts only after a draft
        return (self.params.size_n if drafted else 0), tuple(drafted)

    def propose(self, context: Sequence[int], max_tokens: int) -> Draft:
        return Draft(self.match(context, max_tokens)[1])

    def confident(self, context: Sequence[int]) -> bool | None:
        """Whether the context's last size_n tokens occurred before (a copy is running), found
        as the draft finds them but changing nothing: the schedule asks before it drafts."""
        if not context:
            return False
        inp, n, m = self._history(context), self.params.size_n, self.params.size_m
        if len(inp) < 2 * n + m:
            return False
        return self.map.find(inp, [*inp[len(inp) - n + 1:], context[-1]]) != 0

    def accept(self, n_accepted: int) -> None:
        self.map.accept(n_accepted)

    def finish(self, context: Sequence[int]) -> None:
        self._begun = False  # the next generation begins with its prompt (llama.cpp's begin)
