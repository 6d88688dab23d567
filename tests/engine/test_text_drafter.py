"""Text-level drafting across vocabularies on tiny real GGUF models with two different generated
tokenizers ("a" and "b", tests/tiny_gguf.py): greedy identity, exact sampling, token boundaries."""

from __future__ import annotations

import random

import pytest
import torch

from app.engine.drafting.compat import TEXT_LEVEL, TOKEN_LEVEL, check_draft
from app.engine.drafting.drafters import ModelDrafter, NoDrafter
from app.engine.drafting.factory import make_drafter
from app.engine.loop.sampling import SamplingParams
from app.engine.drafting.text_drafter import Codec, DraftText, MainText, TextDrafter, main_tokens_for
from tests.engine.test_sampling import always_accept, chi2_pvalue, exact_second_token, second_token_counts
from tests.engine.test_speculative import PROMPTS, run

TEXTS = [
    "The quick brown fox jumps over the lazy dog. The dog was not amused, and the fox ran away.",
    "def greet(name: str) -> str:\n    return f\"Hello, {name}!\"\n\n\nx = [1, 2, 3]  # 12345",
    "héllo wörld ✓ 日本語のテキスト, naïve café — don't stop   now\n\t\tend",
]


def text_drafter(draft, main) -> TextDrafter:
    return TextDrafter(draft.kv_model(), draft.tokenizer, main.tokenizer, main.kv_model(1).vocab_size)


def test_pairs_are_token_or_text_level(tiny_loaded):
    a, a2, b = tiny_loaded("llama-f32"), tiny_loaded("qwen2-f32"), tiny_loaded("llama-b")
    assert check_draft(a.info, a2.info).level == TOKEN_LEVEL
    result = check_draft(a.info, b.info)
    assert result.level == TEXT_LEVEL and not result.token.compatible
    assert isinstance(make_drafter(a, draft=b), TextDrafter)
    assert isinstance(make_drafter(b, draft=a), TextDrafter)
    assert isinstance(make_drafter(a, draft=a2), ModelDrafter)


@pytest.mark.parametrize("main_name,draft_names", [
    ("llama-f32", ("llama-b", "llama-f32")),  # the last: the main itself, through text
    ("qwen2-b", ("llama-q8", "qwen2-b")),
])
@pytest.mark.parametrize("draft_max", [1, 5])
def test_greedy_identity_through_text(tiny_loaded, main_name, draft_names, draft_max):
    main = tiny_loaded(main_name)
    accepted = 0
    for prompt in PROMPTS[1:] + TEXTS[1:]:
        ids = main.tokenizer.encode(prompt)
        _, baseline = run(main, ids, NoDrafter(), max_new_tokens=24)
        for name in draft_names:
            _, summary = run(main, ids, text_drafter(tiny_loaded(name), main),
                             max_new_tokens=24, draft_max=draft_max, draft_p_min=0.0, adaptive_draft=False)
            assert summary.tokens == baseline.tokens, (name, prompt)
            assert summary.text == baseline.text
            accepted += summary.n_accepted if name == main_name else 0
    # The main model drafting for itself through text gets tokens accepted: the re-tokenized
    # proposals are the main model's own tokens, not just harmless noise.
    assert accepted > 0


@pytest.mark.parametrize("vocab_model", ["llama-f32", "llama-b"])
def test_proposals_extend_the_canonical_tokenization(tiny_loaded, vocab_model):
    """Cut texts at random points: the context is the text up to a, the drafted text runs to b
    (mid-word, mid-character, mid-run of spaces). Whatever follows b, the proposed tokens must be
    the ones the main tokenizer gives the whole text there."""
    codec = Codec(tiny_loaded(vocab_model).tokenizer)
    rng = random.Random(0)
    n_checked = n_proposed = 0
    for text in TEXTS:
        full = codec.ids(text)
        for _ in range(300):
            a, b = sorted(rng.sample(range(1, len(text) + 1), 2))
            context = codec.ids(text[:a])
            if full[: len(context)] != context:
                continue  # text[:a] ends where the whole text tokenizes differently
            tail = max(0, len(context) - 4)
            while tail and codec.decode(context[:tail]).endswith("\ufffd"):
                tail -= 1  # as the drafter does: a tail starts where the text is whole
            tail_text = codec.decode(context[tail:])
            proposed = main_tokens_for(codec, context[tail:], tail_text, text[a:b])
            assert proposed is not None
            assert full[len(context): len(context) + len(proposed)] == proposed, (text[:a], text[a:b])
            n_checked += 1
            n_proposed += len(proposed)
    assert n_checked > 300 and n_proposed > n_checked  # most cuts propose something


def test_drafted_text_ending_mid_character_proposes_only_whole_text(tiny_loaded):
    codec = Codec(tiny_loaded("llama-f32").tokenizer)
    context = codec.ids("The model says ")
    broken = codec.decode(codec.ids("日本")[:1] if len(codec.ids("日本")) > 1 else [])
    proposed = main_tokens_for(codec, context, "The model says ", "hello wörld " + broken)
    assert codec.decode(proposed) == "hello wörld"


def test_main_text_follows_the_context_incrementally(tiny_loaded):
    tok = tiny_loaded("llama-f32").tokenizer
    codec = Codec(tok)
    track = MainText(codec)
    rng = random.Random(1)
    ids = codec.ids(TEXTS[2])
    for n in range(1, len(ids) + 1):
        track.update(ids[:n])
        assert track.text == codec.decode(ids[:n]).rstrip("\ufffd")
    # A different context (a new prompt, a rejected tail) rewinds and redecodes from the change;
    # random byte tokens split characters anywhere.
    for _ in range(30):
        keep = rng.randrange(len(ids))
        ids = ids[:keep] + [rng.randrange(256) for _ in range(rng.randrange(1, 6))]
        track.update(ids)
        assert track.text == codec.decode(ids).rstrip("\ufffd")


@pytest.mark.parametrize("vocab_model", ["llama-f32", "llama-b"])
def test_draft_text_retokenizes_only_the_tail_and_matches_a_full_encoding(tiny_loaded, vocab_model):
    codec = Codec(tiny_loaded(vocab_model).tokenizer)
    track = DraftText(codec)
    for text in TEXTS:
        for end in range(1, len(text) + 1, 7):
            ids = track.sync(text[:end])
            assert codec.decode(ids) == text[:end]
        assert track.sync(text) == codec.ids(text)


def test_text_level_sampling_matches_main_distribution(tiny_loaded):
    """The same statistical test as the same-vocabulary path: the second token goes through a
    verify of text-level drafts; its distribution must be the main model's exact marginal."""
    main = tiny_loaded("llama-f32")
    prompt = main.tokenizer.encode(TEXTS[0] + " The fox and the")
    exact = exact_second_token(main.model, prompt)
    # The main model through text: its drafts are often right, so acceptance is exercised too.
    make = lambda: text_drafter(main, main)  # noqa: E731
    # Fewer verify steps have a draft than with a same-vocabulary draft: a drafted text without a
    # stable cut (one run of letters) proposes nothing.
    good = second_token_counts(main, prompt, make, min_drafted=200)
    assert chi2_pvalue(good, exact) > 1e-3
    broken = second_token_counts(main, prompt, make, accept_rule=always_accept, min_drafted=200)
    assert chi2_pvalue(broken, exact) < 1e-6


def test_greedy_drafting_ignores_the_sampling_settings(tiny_loaded):
    main, draft = tiny_loaded("llama-f32"), tiny_loaded("llama-b")
    drafter = text_drafter(draft, main)
    ids = main.tokenizer.encode(TEXTS[0])
    drafter.configure(SamplingParams(temperature=1.0, seed=1), 0.0)
    first = drafter.propose(ids, 6)
    drafter.configure(SamplingParams(temperature=1.0, seed=2), 0.0)
    assert drafter.propose(ids, 6) == first and first.probs is None
    assert all(isinstance(t, int) for t in first.tokens) and torch.is_tensor(torch.tensor(first.tokens))


@pytest.mark.demo
@pytest.mark.parametrize("main_key,draft_key", [("gemma3-270m", "smollm2-135m"), ("smollm2-135m", "gemma3-270m")])
def test_builtin_pair_drafts_through_text_with_greedy_identity(demo_path, main_key, draft_key):
    from app.engine.loader import load_model

    main = load_model(demo_path(main_key), device="cpu", dtype="float32")
    draft = load_model(demo_path(draft_key), device="cpu", dtype="float32")
    drafter = make_drafter(main, draft=draft)
    assert isinstance(drafter, TextDrafter)
    ids = main.tokenizer.encode("def add(a, b):\n    return a + b\n\n# The same function, renamed:\ndef")
    _, baseline = run(main, ids, NoDrafter(), max_new_tokens=32)
    _, summary = run(main, ids, drafter, max_new_tokens=32, draft_max=6, draft_p_min=0.0)
    assert summary.tokens == baseline.tokens and summary.text == baseline.text
    assert summary.n_drafted > 0


def test_the_server_makes_a_fresh_text_drafter_per_request(tiny_loaded):
    """serve -md with another vocabulary: each request gets its own text state over the shared
    draft cache, and every one of them keeps plain decoding's output."""
    from app.engine.local_session import LocalSession

    main, draft = tiny_loaded("llama-f32"), tiny_loaded("llama-b")
    prototype = make_drafter(main, draft=draft)
    new_drafter = LocalSession.around(main, prototype).new_drafter
    first, second = new_drafter(), new_drafter()
    assert isinstance(first, TextDrafter) and first is not second and first.main_text is not second.main_text
    assert first.draft is prototype.draft and first.name == prototype.name
    for prompt in TEXTS[:2]:
        ids = main.tokenizer.encode(prompt)
        _, baseline = run(main, ids, NoDrafter(), max_new_tokens=20)
        for drafter in (first, second):
            _, summary = run(main, ids, drafter, max_new_tokens=20, draft_max=4, draft_p_min=0.0)
            assert summary.tokens == baseline.tokens
