"""Prompt lookup's choice of where to copy from: the running copy, and past a replaced token."""

from __future__ import annotations

from app.engine.drafting.drafters import PromptLookupDrafter

SOURCE = list(range(10, 30))  # a passage of 20 distinct tokens, copied by the contexts below


def test_latest_occurrence_when_nothing_tells_them_apart():
    assert PromptLookupDrafter().match([1, 2, 3, 40, 7, 2, 3, 50, 9, 2, 3], 1) == (2, (50,))


def test_the_occurrence_the_copy_runs_from_beats_a_later_one():
    # (12, 13, 14) occurs in the passage and later after 99; the context copies the passage from
    # 10 on, so the passage continues it, not the later occurrence (which lookup took before).
    context = SOURCE + [99, 12, 13, 14, 77, 78] + [10, 11, 12, 13, 14]
    assert PromptLookupDrafter().match(context, 3) == (3, (15, 16, 17))


def test_a_copy_goes_on_past_a_replaced_token():
    # The context copies 10..19, then writes 99 where the passage has 20 (a renamed variable).
    copied = SOURCE[: PromptLookupDrafter.COPY_RUN + 2] + [99]
    assert 99 not in SOURCE
    assert PromptLookupDrafter().match(SOURCE + [5] + copied, 4) == (1, (21, 22, 23, 24))


def test_a_short_run_before_an_unknown_token_proposes_nothing():
    copied = SOURCE[: PromptLookupDrafter.COPY_RUN - 2] + [99]  # fewer than COPY_RUN tokens copied
    assert PromptLookupDrafter().match(SOURCE + [5] + copied, 4) == (0, ())


def test_bounds_hold_for_both_kinds_of_match():
    copied = SOURCE[:12] + [99]
    assert PromptLookupDrafter(draft_max=2).match(SOURCE + [5] + copied, 8) == (1, (23, 24))
    # ngram-mod's minimum: a draft shorter than draft_min is no draft (what follows the replaced
    # token runs to the end of the context: 21 tokens here).
    context = SOURCE + [5] + copied
    assert len(PromptLookupDrafter().match(context, 50)[1]) == 21
    assert PromptLookupDrafter(draft_min=22).match(context, 50) == (0, ())
    assert PromptLookupDrafter().match(SOURCE, 0) == (0, ())


def test_ngram_mod_matches_only_its_last_tokens():
    copied = SOURCE[:12] + [99]
    assert PromptLookupDrafter(3, 3, past_replaced=False).match(SOURCE + [5] + copied, 4) == (0, ())
    assert PromptLookupDrafter(3, 3, past_replaced=False).fresh().past_replaced is False


def test_lookup_is_confident_only_while_a_copy_runs():
    lookup = PromptLookupDrafter()
    assert lookup.copy_run(SOURCE + [5] + SOURCE[:10]) == 10
    assert lookup.confident(SOURCE + [5] + SOURCE[:PromptLookupDrafter.COPY_RUN]) is True
    assert lookup.confident(SOURCE + [5] + SOURCE[:3]) is False  # a 3-token match: chance
    assert lookup.confident([1, 2, 3]) is False and lookup.copy_run([]) == 0


def test_combined_confidence_needs_one_confident_matcher_or_every_one_saying_no():
    from app.engine.drafting.drafters import Drafter
    from app.engine.drafting.ngram_cache import NgramCache
    from app.engine.drafting.ngram_drafters import CombinedDrafter, NgramCacheDrafter

    copying, chatting = SOURCE + [5] + SOURCE[:10], SOURCE + [5] + SOURCE[:2]
    assert CombinedDrafter([PromptLookupDrafter(), NgramCacheDrafter(NgramCache("k"))]).confident(copying) is True
    # An empty n-gram cache knows no continuation (False); one that knows a 2-4 token one cannot
    # tell a copy from a chance (None); a draft model behind the matchers drafts where they do not.
    assert CombinedDrafter([PromptLookupDrafter(), NgramCacheDrafter(NgramCache("k"))]).confident(chatting) is False
    learned = NgramCache("k")
    learned.learn(chatting[-3:] + [99])
    assert CombinedDrafter([PromptLookupDrafter(), NgramCacheDrafter(learned)]).confident(chatting) is None
    assert CombinedDrafter([PromptLookupDrafter()], Drafter()).confident(chatting) is None
    assert CombinedDrafter([PromptLookupDrafter(), PromptLookupDrafter(2, 2)]).confident(chatting) is False


def test_the_index_follows_a_growing_context_and_rebuilds_for_another():
    lookup = PromptLookupDrafter()
    context = SOURCE + [5] + SOURCE[:3]
    assert lookup.match(context, 2) == (3, (13, 14))
    context += [13, 14]  # a step appended the accepted draft
    assert lookup.match(context, 2) == (3, (15, 16))
    assert lookup.match([7, 8, 9, 7, 8], 1) == (2, (9,))  # another conversation: not the old index
    assert lookup.match(context, 2) == (3, (15, 16))


def test_a_repeating_pattern_drafts_past_its_latest_period():
    """After a repeating pattern (a 2-token indentation) the latest occurrence of the last n-gram
    lies one period back, and what followed it ends at the context's end: the copy goes on from
    itself (LZ77's overlapping copy) instead of stopping after one period. A Gemma reply of this
    shape was drafted 2 tokens at a time, every one accepted, slower than plain decoding."""
    context = [5, 6, 7] + [1, 2] * 6
    assert PromptLookupDrafter().match(context, 9) == (3, (1, 2, 1, 2, 1, 2, 1, 2, 1))
    period_three = [9, 9] + [1, 2, 3] * 3
    assert PromptLookupDrafter().match(period_three, 7)[1] == (1, 2, 3, 1, 2, 3, 1)
    # A copy with tokens of its own to follow is copied as before.
    assert PromptLookupDrafter().match(SOURCE + [10, 11, 12], 4) == (3, (13, 14, 15, 16))
