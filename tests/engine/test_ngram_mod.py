"""llama.cpp's ngram-mod in our loop (app.engine.drafting.ngram_mod): one pool shared by every
request, learning prompts and replies, drafting a chain of known followers."""

from __future__ import annotations

import pytest

from app.engine.drafting.ngram_mod import NgramModDrafter, NgramModPool
from app.engine.loop.sampling import SamplingParams

GREEDY = SamplingParams(temperature=0.0)
STORY = list(range(1000, 1100))  # 100 distinct tokens


def _drafter(pool=None, n=4, n_min=3, n_max=64) -> NgramModDrafter:
    drafter = NgramModDrafter(pool or NgramModPool(n, size=1 << 16), n_min, n_max)
    drafter.configure(GREEDY, 0.0)
    return drafter


def test_a_prompt_is_learned_and_its_continuation_drafted_as_a_chain():
    drafter = _drafter()
    context = STORY + [7, 8] + STORY[:10]  # the prompt holds the story; the reply has begun to repeat it
    assert drafter.propose(context, 64).tokens == tuple(STORY[10:74])  # n_max 64 of the chain
    assert drafter.propose(context, 5).tokens == tuple(STORY[10:15])  # the schedule's length cuts it
    assert drafter.confident(context) is True


def test_a_chain_shorter_than_n_min_is_no_draft():
    pool = NgramModPool(4, size=1 << 16)
    pool.add_all(STORY[:40] + [99], 0, 41)  # an earlier reply: 31 known followers after STORY[:10]
    context = [5, 6] + STORY[:10]
    drafter = _drafter(pool, n_min=48)
    assert drafter.propose(context, 64).tokens == ()
    assert drafter.confident(context) is False
    assert _drafter(pool, n_min=30).propose(context, 64).tokens == tuple(STORY[10:40] + [99])


def test_the_pool_is_shared_by_fresh_copies_and_learns_the_whole_reply():
    """A second request with the same prompt drafts the first one's reply at once."""
    pool = NgramModPool(4, size=1 << 16)
    first = _drafter(pool)
    prompt = [5, 6, 7, 8, 9]
    reply = STORY[:60]
    first.propose(prompt + reply[:1], 8)  # begin: the prompt
    first.finish(prompt + reply)  # the reply learned at its end
    second = first.fresh()
    second.configure(GREEDY, 0.0)
    assert second.pool is pool
    assert second.propose(prompt + reply[:4], 64).tokens == tuple(reply[4:60])


def test_five_drafts_in_a_row_mostly_rejected_empty_the_pool():
    drafter = _drafter()
    context = STORY + [7, 8] + STORY[:10]
    for _ in range(4):
        assert drafter.propose(context, 8).tokens
        drafter.accept(1)  # 1 of 8: under a quarter
    assert drafter.pool.used > 0
    drafter.propose(context, 8)
    drafter.accept(0)
    assert drafter.pool.used == 0


def test_a_quarter_full_pool_is_emptied_when_a_sequence_begins():
    pool = NgramModPool(2, size=64)
    drafter = _drafter(pool, n=2, n_min=1)
    drafter.propose(list(range(100)), 4)  # 98 n-grams into 64 entries: over a quarter
    assert pool.used == 0


def test_flags_reach_the_drafter():
    import argparse

    from app.cli.spec_args import add_spec_flags, spec_choice

    parser = argparse.ArgumentParser()
    add_spec_flags(parser)
    args = parser.parse_args(["--spec-type", "ngram-mod", "--spec-ngram-mod-n-match", "8",
                              "--spec-ngram-mod-n-min", "2", "--spec-ngram-mod-n-max", "32"])
    assert spec_choice(args).mod == (8, 2, 32)
    assert spec_choice(parser.parse_args(["--spec-type", "ngram-mod"])).mod == (24, 1, 64)


@pytest.mark.demo
def _smollm2_chat_replies(demo_path, kinds: list[str]) -> list:
    """SmolLM2's greedy replies to the bench's chat prompt (64 tokens at most): plain decoding's,
    then for each kind a first request and the same request again (the drafter's fresh copy,
    what it learned kept)."""
    from app.cli.bench.common import PROMPTS, prompt_ids
    from app.engine.drafting.factory import make_drafter
    from app.engine.loader import load_model
    from app.engine.events import DoneEvent
    from app.engine.loop.speculative import DecodeSettings, generate
    from tests.llama_support import pin_step_curve

    main = load_model(demo_path("smollm2-135m"), backend="llama.cpp")
    pin_step_curve(main)
    ids = prompt_ids(main, PROMPTS["chat"])
    settings = DecodeSettings(max_new_tokens=64, sampling=GREEDY)

    def reply(drafter):
        return next(e.summary for e in generate(main.kv_model(), main.tokenizer, ids, drafter, settings)
                    if isinstance(e, DoneEvent))

    replies = [reply(make_drafter(main, "none"))]
    for kind in kinds:
        drafter = make_drafter(main, kind)
        replies += [reply(drafter), reply(drafter.fresh())]
    return replies


def test_a_repeated_request_drafts_its_reply_and_both_equal_plain_decoding(demo_path):
    plain, first, again = _smollm2_chat_replies(demo_path, ["ngram-mod"])
    assert first.tokens == plain.tokens == again.tokens
    assert again.n_accepted >= 0.8 * (again.n_predicted - 1), again


def test_the_default_drafter_learns_where_a_reply_ended_and_drafts_no_copy_it_cannot_see(demo_path):
    """The window's default drafter (prompt lookup + n-gram cache + ngram-mod) on SmolLM2's chat
    reply, which copies nothing: the first request drafted a 4-token guess on hope (the empty
    cache said it could not tell, so the step did not count as unsure) and ran at 0.92x of plain
    decoding. Asked again, the learned reply drafted past its own end (17 drafts, all rejected,
    in its last step), since the end-of-generation token was never learned."""
    from app.engine.events import StopReason
    from app.worker.requests import DEFAULT_DRAFTER

    plain, first, again = _smollm2_chat_replies(demo_path, [DEFAULT_DRAFTER])
    assert plain.stop_reason is StopReason.EOS
    assert first.tokens == plain.tokens == again.tokens
    # No guess on hope: what the first request drafts is one-token probes at most (how many
    # depends on the steps' times: probes take a share of the time).
    assert len(first.drafted_by_position) <= 1, first.drafted_by_position
    assert again.n_accepted == again.n_drafted >= 0.8 * (again.n_predicted - 1), again.drafted_by_position
