"""Speculative sampling keeps the main model's distribution exactly; a broken rule is caught."""

from __future__ import annotations

import pytest
import numpy as np
import torch

from app.engine.drafting.drafters import ModelDrafter, PromptLookupDrafter
from app.engine.errors import SpeculaError
from app.engine.events import DoneEvent
from app.engine.drafting.ngram_cache import NgramCache
from app.engine.drafting.ngram_drafters import CombinedDrafter, NgramCacheDrafter
from app.engine.loop.sampling import (
    RowProbs,
    SamplingParams,
    check_sampling,
    logits_to_probs,
    make_generator,
    sample,
    softmax,
    speculative_accept,
)
from app.engine.loop.speculative import DecodeSettings, generate


def chi2_pvalue(counts, probs) -> float:
    """Pearson's chi-square goodness of fit, cells with expected count < 5 pooled."""
    counts, probs = torch.as_tensor(np.asarray(counts, dtype=np.float64)), torch.as_tensor(np.asarray(probs, dtype=np.float64))
    n = counts.sum()
    expected = probs * n
    big = expected >= 5
    obs = torch.cat([counts[big], counts[~big].sum().reshape(1)])
    exp = torch.cat([expected[big], expected[~big].sum().reshape(1)])
    keep = exp > 0
    obs, exp = obs[keep], exp[keep]
    stat = float(((obs - exp) ** 2 / exp).sum())
    dof = max(int(keep.sum()) - 1, 1)
    return float(torch.special.gammaincc(torch.tensor(dof / 2.0), torch.tensor(stat / 2.0)))


def always_accept(p, q, draft, generator):
    """A broken rule: trusts the draft blindly."""
    return len(draft), sample(p[len(draft)], generator)


def resample_from_p(p, q, draft, generator):
    """A broken rule: correct acceptance test, but resamples from p instead of the residual."""
    for i, token in enumerate(draft):
        q_x = float(q[i, token]) if q is not None else 1.0
        if generator.random() * q_x < float(p[i, token]):
            continue
        return i, sample(p[i], generator)
    return len(draft), sample(p[len(draft)], generator)


def first_token_counts(rule, p, q, trials=20000, seed=0):
    """Emit the first token of a 2-token draft many times; count what comes out."""
    gen = make_generator(seed)
    counts = np.zeros(p.shape[-1])
    for _ in range(trials):
        if q is None:
            draft = [2, 0]  # a deterministic drafter always proposes the same tokens
        else:
            draft = [sample(q[0], gen), sample(q[1], gen)]
        n_accepted, token = rule(p, q, draft, gen)
        counts[draft[0] if n_accepted > 0 else token] += 1
    return counts


@pytest.fixture(scope="module")
def dists():
    rng = np.random.default_rng(1)
    p = rng.dirichlet(np.ones(6), 3).astype(np.float32)
    q = rng.dirichlet(np.ones(6) * 0.5, 2).astype(np.float32)
    return p, q


@pytest.mark.parametrize("deterministic", [False, True])
def test_acceptance_rule_preserves_p(dists, deterministic):
    p, q = dists
    q = None if deterministic else q
    assert chi2_pvalue(first_token_counts(speculative_accept, p, q), p[0]) > 1e-3


@pytest.mark.parametrize("broken", [always_accept, resample_from_p])
@pytest.mark.parametrize("deterministic", [False, True])
def test_broken_rules_are_detected(dists, broken, deterministic):
    p, q = dists
    q = None if deterministic else q
    assert chi2_pvalue(first_token_counts(broken, p, q), p[0]) < 1e-6


def test_truncation_filters():
    logits = np.array([[4.0, 3.0, 2.0, 1.0, 0.0, -10.0]], dtype=np.float32)
    top2 = logits_to_probs(logits, SamplingParams(temperature=1.0, top_k=2, top_p=1.0, min_p=0.0))
    assert (top2[0, 2:] == 0).all() and np.isclose(top2.sum(), 1.0)
    soft = softmax(logits)[0]
    top_p = logits_to_probs(logits, SamplingParams(temperature=1.0, top_k=0, top_p=0.8, min_p=0.0))
    kept = int((top_p[0] > 0).sum())
    assert soft[: kept - 1].sum() < 0.8 <= soft[:kept].sum()
    min_p = logits_to_probs(logits, SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.3))
    assert ((min_p[0] > 0) == (soft >= 0.3 * soft.max())).all()
    greedy = logits_to_probs(logits, SamplingParams(temperature=0.0))
    assert greedy[0].tolist() == [1.0, 0, 0, 0, 0, 0]
    hot = logits_to_probs(logits, SamplingParams(temperature=2.0, top_k=0, top_p=1.0, min_p=0.0))
    assert np.allclose(hot, softmax(logits / 2.0))


def test_top_p_zero_keeps_the_top_token():
    """top_p = 0 used to drop every token (softmax of all -inf: NaN, a 500 in the server)."""
    logits = np.array([[1.0, 3.0, 2.0], [0.5, 0.5, 0.0]], dtype=np.float32)
    probs = logits_to_probs(logits, SamplingParams(temperature=0.8, top_k=0, top_p=0.0, min_p=0.0))
    assert probs[0].tolist() == [0.0, 1.0, 0.0]
    assert not np.isnan(probs).any() and np.allclose(probs.sum(-1), np.ones(2))
    assert sample(probs[0], make_generator(0)) == 1


@pytest.mark.parametrize("temperature", [1e-40, 1e-300, 3e-39, 1e-30, 1e-8])
def test_tiny_temperature_is_greedy_not_nan(temperature):
    """logits / 1e-40 overflowed to inf and softmax gave NaN ("probability tensor contains inf")."""
    logits = np.array([[4.0, 3.0, 2.0, -1.0], [-50.0, 60.0, 59.9, 0.0]], dtype=np.float32)
    params = SamplingParams(temperature=temperature, top_k=0, top_p=1.0, min_p=0.0)
    probs = logits_to_probs(logits, params)
    assert probs.tolist() == [[1.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0]]
    assert sample(probs[1], make_generator(0)) == 1


@pytest.mark.parametrize("field, value", [
    ("temperature", float("nan")), ("temperature", -0.5), ("temperature", float("inf")),
    ("top_p", float("nan")), ("top_p", 1.5), ("top_p", -0.1), ("min_p", float("nan")), ("min_p", 2.0),
    ("top_k", -1),
])
def test_unusable_sampling_values_are_one_line_errors(field, value):
    with pytest.raises(SpeculaError) as caught:
        check_sampling(SamplingParams(**{field: value}))
    assert "\n" not in str(caught.value) and field.replace("_", "-") in str(caught.value)
    check_sampling(SamplingParams(temperature=0.0, top_p=0.0, min_p=1.0, top_k=0))  # edges are fine


# --- End to end on a tiny real model: the second generated token is the first one that goes
# through a verify step; its distribution must equal the main model's exact marginal.

SAMPLING = SamplingParams(temperature=1.0, top_k=4, top_p=1.0, min_p=0.0)


@torch.inference_mode()
def exact_second_token(model, prompt_ids):
    def dist(ids):
        return logits_to_probs(model(torch.tensor([ids])).logits[0, -1:].float().numpy(), SAMPLING)[0]

    p1 = dist(prompt_ids)
    marginal = np.zeros_like(p1)
    for t1 in np.flatnonzero(p1).tolist():
        marginal += p1[t1] * dist(prompt_ids + [t1])
    return marginal


def second_token_counts(main, prompt_ids, make_drafter, accept_rule=speculative_accept, runs=1200,
                        min_drafted=None):
    counts = np.zeros(main.kv_model().vocab_size)
    kv = main.kv_model(n_ctx=4096)  # the prompt is longer than the tiny model's 512
    drafter = make_drafter()
    drafted = 0
    for seed in range(runs):
        settings = DecodeSettings(max_new_tokens=3, draft_max=2, draft_p_min=0.0,
                                  sampling=SamplingParams(**{**SAMPLING.__dict__, "seed": seed}),
                                  stop_token_ids=())
        events = list(generate(kv, main.tokenizer, prompt_ids, drafter, settings, accept_rule=accept_rule))
        summary = events[-1].summary
        assert isinstance(events[-1], DoneEvent)
        drafted += summary.n_drafted
        counts[summary.tokens[1]] += 1
    assert drafted > (runs // 2 if min_drafted is None else min_drafted)  # the verify step really had drafts to judge
    return counts


def warmed_cache(prompt: list[int], vocab_size: int) -> NgramCache:
    """A cache that has seen the prompt's last two tokens followed by every token t, then by a
    random token of its own: whatever is sampled first, the verify step has a draft to judge."""
    cache = NgramCache()
    followers = torch.randint(0, vocab_size, (vocab_size,), generator=torch.Generator().manual_seed(1)).tolist()
    for t in range(vocab_size):
        cache.learn([*prompt[-2:], t, followers[t]])
    return cache


@pytest.mark.parametrize("drafter_kind", ["model", "lookup", "ngram-cache", "lookup+ngram-cache"])
def test_speculative_sampling_matches_main_distribution(tiny_loaded, drafter_kind):
    main = tiny_loaded("llama-f32")
    draft = tiny_loaded("llama-other")  # a very different model: q far from p
    # Every ordinary token appears once in the prompt, so prompt lookup always finds a 1-gram
    # match for whatever token was sampled first and has a draft for the verify step to judge.
    order = torch.randperm(550, generator=torch.Generator().manual_seed(0)).tolist()
    prompt = order + main.tokenizer.encode(" the model and the")
    exact = exact_second_token(main.model, prompt)
    vocab = main.kv_model().vocab_size
    if drafter_kind == "model":
        make = lambda: ModelDrafter(draft.kv_model(), vocab)  # noqa: E731
    elif drafter_kind == "lookup":
        make = lambda: PromptLookupDrafter(ngram_min=1)  # noqa: E731
    elif drafter_kind == "ngram-cache":
        make = lambda: NgramCacheDrafter(warmed_cache(prompt, vocab))  # noqa: E731
    else:
        # The cache's 3-gram beats lookup's 1-gram: both sources take turns with the model's.
        make = lambda: CombinedDrafter([PromptLookupDrafter(ngram_min=1), NgramCacheDrafter(warmed_cache(prompt, vocab))])  # noqa: E731
    good = second_token_counts(main, prompt, make)
    assert chi2_pvalue(good, exact) > 1e-3
    broken = second_token_counts(main, prompt, make, accept_rule=always_accept)
    assert chi2_pvalue(broken, exact) < 1e-6


def test_row_probs_makes_only_the_rows_a_verify_reads():
    logits = np.array([[5.0, 0.0, -9.0], [0.0, 5.0, -9.0], [0.0, 0.0, 5.0]], dtype=np.float32)
    read: list[int] = []

    def row_logits(i: int) -> np.ndarray:
        read.append(i)
        return logits[i]

    params = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
    lazy = RowProbs(row_logits, 3, params)
    # Token 2 at position 0 has probability ~1e-6: rejected at once, so rows 1 and 2 are never made.
    n, _token = speculative_accept(lazy, None, [2, 1], make_generator(0))
    assert n == 0 and read == [0]
    assert np.allclose(lazy[0], logits_to_probs(logits[:1], params)[0])
    assert float(lazy[0, 0]) == float(lazy[0][0]) and read == [0]  # made once
    with pytest.raises(IndexError):
        lazy[3]


def test_seeded_reply_is_plain_decodings_whatever_is_drafted(tiny_loaded):
    assert_seeded_reply_is_plain_decodings(tiny_loaded("llama-f32"))


def assert_seeded_reply_is_plain_decodings(main, make_drafter=lambda: PromptLookupDrafter(ngram_min=1)) -> None:
    """With a one-hot drafter (`make_drafter` makes a new one: prompt lookup by default), a seed
    gives plain decoding's reply token for token, at any draft length and under the adaptive
    schedule: the schedule's choices follow the machine's timings, so a seed that depended on
    them would not reproduce (the server's seeded requests did not)."""
    prompt = main.tokenizer.encode("def add(a, b):\n    return a + b\n\ndef add(a, b):\n")
    kv = main.kv_model()
    sampling = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=123)

    def reply(drafter, **settings) -> tuple[tuple[int, ...], int]:
        decode = DecodeSettings(**{"max_new_tokens": 40, "draft_p_min": 0.0, "sampling": sampling,
                                   "stop_token_ids": (), **settings})
        summary = list(generate(kv, main.tokenizer, prompt, drafter, decode))[-1].summary
        return tuple(summary.tokens), summary.n_drafted

    plain, _ = reply(None)
    drafted_at_all = 0
    for draft_max in (1, 3, 8):
        tokens, n_drafted = reply(make_drafter(), draft_max=draft_max, adaptive_draft=False)
        assert tokens == plain, draft_max
        drafted_at_all += n_drafted
    assert reply(make_drafter())[0] == plain
    assert drafted_at_all > 0  # the drafts were there to judge
    assert reply(None, sampling=SamplingParams(**{**sampling.__dict__, "seed": 124}))[0] != plain
