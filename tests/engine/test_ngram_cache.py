"""The learned n-gram cache: what it predicts, its bound, its file across restarts, damage."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest

from app.engine.drafting.drafters import PromptLookupDrafter
from app.engine.drafting.ngram_cache import DEFAULT_MAX_KEYS, NgramCache, NgramCacheError, vocab_key
from app.engine.drafting.ngram_drafters import CombinedDrafter, NgramCacheDrafter

ROOT = str(Path(__file__).resolve().parents[2])
TEXT = [5, 6, 7, 8, 9, 10, 11, 12]


def test_predicts_what_followed_and_chains():
    cache = NgramCache("k")
    cache.learn(TEXT)
    assert cache.continuation([5, 6, 7], 3) == (3, (8, 9, 10))
    assert cache.continuation([1, 2, 6, 7], 4) == (0, ())  # only a 2-gram seen once: too weak
    cache.learn(TEXT)
    assert cache.continuation([1, 2, 6, 7], 4) == (2, (8, 9, 10, 11))
    assert cache.continuation([99, 98], 4) == (0, ())
    assert cache.continuation([5, 6, 7], 0) == (0, ())


def test_a_once_seen_bigram_needs_a_second_sighting_and_a_majority():
    cache = NgramCache("k")
    cache.learn([1, 2, 3])
    assert cache.predict([9, 1, 2]) is None  # (1, 2) -> 3 once: too weak to draft on
    cache.learn([1, 2, 3])
    assert cache.predict([9, 1, 2]) == (2, 3)
    cache.learn([1, 2, 4])
    cache.learn([1, 2, 5])
    assert cache.predict([9, 1, 2]) == (2, 3)  # half of what followed: still the best guess
    cache.learn([1, 2, 6])
    assert cache.predict([9, 1, 2]) is None  # 2 of 5: no majority, no draft
    assert cache.predict([1, 2]) is None


def test_bound_evicts_the_least_recently_learned():
    cache = NgramCache("k", max_keys=50)
    for start in range(0, 4000, 7):
        cache.learn(list(range(start, start + 7)))
    assert len(cache) == 50
    assert cache.continuation([3990, 3991, 3992], 2)[1] == (3993, 3994)  # the latest is kept
    assert cache.continuation([0, 1, 2], 2) == (0, ())  # the first is gone
    assert DEFAULT_MAX_KEYS >= 10_000


def test_followers_per_ngram_are_bounded_and_counts_kept_by_frequency():
    cache = NgramCache("k")
    for follower in (1, 1, 1, 2, 3, 4, 5, 6):
        cache.learn([7, 8, 9, follower])
    entry = cache._table[(7, 8, 9)]
    assert entry[0] == 8 and entry[1:3] == [1, 3] and len(entry) == 7  # total, 3 followers
    assert cache.predict([7, 8, 9]) is None  # 1 is 3 of 8: no majority


class _CountingTable(dict):
    """The cache's table, counting its lookups."""

    lookups = 0

    def get(self, key, default=None):
        type(self).lookups += 1
        return super().get(key, default)


def test_a_miss_costs_a_few_lookups_whatever_the_cache_holds():
    """A miss costs N_MAX - N_MIN + 1 dictionary lookups (one per n-gram length), however many
    n-grams the cache holds and however long the context: counted, not timed (a wall-clock bound
    is flaky on a busy 2-core machine)."""
    from app.engine.drafting.ngram_cache import N_MAX, N_MIN

    cache = NgramCache("k")
    for start in range(0, 60_000, 6):
        cache.learn(list(range(start, start + 6)))
    cache._table = _CountingTable(cache._table)
    context = list(range(100_000, 101_000))
    for _ in range(100):
        assert cache.continuation(context, 16) == (0, ())
    assert _CountingTable.lookups == 100 * (N_MAX - N_MIN + 1)


def test_saved_cache_survives_a_restart(tmp_path):
    path = tmp_path / "cache" / "abc.ngc"
    # Another process learns and saves (as the window does after a reply), then exits.
    code = ("from app.engine.drafting.ngram_cache import NgramCache; c = NgramCache('abc');"
            f"c.learn({TEXT}); c.learn({TEXT}); c.save({str(path)!r})")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
    cache = NgramCache.load(path, "abc")
    assert len(cache) > 0 and not cache.dirty
    assert cache.continuation([1, 6, 7], 3) == (2, (8, 9, 10))
    assert cache._table[(5, 6)] == [2, 7, 2]
    assert [p.name for p in path.parent.iterdir()] == ["abc.ngc"]  # no temporary file left


def test_a_new_save_replaces_the_file_whole_and_load_honours_the_bound(tmp_path):
    path = tmp_path / "k.ngc"
    big = NgramCache("k")
    big.learn(list(range(1000)))
    big.save(path)
    small = NgramCache.load(path, "k", max_keys=10)
    assert len(small) == 10 and small.continuation([996, 997, 998], 1)[1] == (999,)
    small.save(path)
    assert len(NgramCache.load(path, "k")) == 10


@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage", "empty", "version"])
def test_a_damaged_file_is_a_warning_and_an_empty_cache(tmp_path, caplog, damage):
    path = tmp_path / "k.ngc"
    cache = NgramCache("k")
    cache.learn(list(range(500)))
    cache.save(path)
    data = bytearray(path.read_bytes())
    if damage == "truncate":
        data = data[: len(data) // 2]
    elif damage == "flip":
        data[-10] ^= 0xFF
    elif damage == "garbage":
        data = bytearray(b"not a cache at all, just some text of enough length for a header" * 2)
    elif damage == "empty":
        data = bytearray()
    else:
        data[4] = 99
    path.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="app.engine.drafting.ngram_cache"):
        loaded = NgramCache.load(path, "k")
    assert len(loaded) == 0
    assert any("damaged" in r.getMessage() and str(path) in r.getMessage() for r in caplog.records)


def test_another_vocabularys_file_is_refused_in_one_line(tmp_path):
    path = tmp_path / "k.ngc"
    NgramCache("aaaa").save(path)
    with pytest.raises(NgramCacheError) as caught:
        NgramCache.load(path, "bbbb")
    assert "another vocabulary" in str(caught.value) and "\n" not in str(caught.value)


def test_vocab_key_names_the_vocabulary(tiny_loaded):
    from app.engine.drafting.factory import main_vocab_key

    a1, a2, b = (main_vocab_key(tiny_loaded(n)) for n in ("llama-f32", "qwen2-q8", "llama-b"))
    assert a1 == a2 != b and len(a1) == 32
    assert vocab_key(["a", "b"]) != vocab_key(["ab"]) != vocab_key(["a", "b"], "llama")


def test_the_drafter_learns_only_what_a_turn_adds():
    cache = NgramCache("k")
    drafter = NgramCacheDrafter(cache)
    drafter.finish([1, 2, 3, 4])
    drafter.finish([1, 2, 3, 4, 5, 6])  # the next turn repeats the first
    assert cache._table[(1, 2)][0] == 1 and cache._table[(4, 5)][0] == 1


def test_combined_takes_the_longest_match_lookup_first_on_a_tie():
    cache = NgramCache("k")
    cache.learn([1, 2, 3, 4, 50, 51])
    cache.learn([1, 2, 3, 4, 50, 51])
    lookup = PromptLookupDrafter()
    combined = CombinedDrafter([lookup, NgramCacheDrafter(cache)])
    assert combined.name == "lookup+ngram-cache"
    # Context: (3, 4) occurs earlier followed by 60; the cache knows (2, 3, 4) -> 50: longer.
    assert combined.propose([3, 4, 60, 1, 2, 3, 4], 2).tokens == (50, 51)
    # Only a 2-gram in both: lookup's (the conversation at hand) wins.
    assert combined.propose([3, 4, 60, 9, 3, 4], 1).tokens == (60,)
    assert combined.propose([70, 71], 4).tokens == ()


def test_the_cache_says_it_sees_nothing_where_it_knows_no_continuation():
    """An empty cache, or a context unlike any learned, is False (so beside prompt lookup the
    step counts as unsure, and drafts little on hope); a known continuation is None: a 2-4 token
    match cannot tell a running copy from a chance one."""
    cache = NgramCache()
    drafter = NgramCacheDrafter(cache)
    assert drafter.confident([5, 6, 7, 8]) is False
    cache.learn([1, 2, 3, 4, 5, 6, 7, 8, 9, 10])
    assert drafter.confident([40, 41, 42]) is False
    assert drafter.confident([40, 2, 3, 4]) is None
    combined = CombinedDrafter([PromptLookupDrafter(), drafter])
    assert combined.confident([40, 41, 42, 43, 41, 42]) is False  # lookup: a 2-token match, no copy
