"""The speculative loop on tiny real GGUF models: greedy identity, counters, stops, cancel."""

from __future__ import annotations

import pytest
import torch

from app.engine.drafting.drafters import ModelDrafter, NoDrafter, PromptLookupDrafter
from app.engine.events import DoneEvent, Origin, StepEvent, StopReason
from app.engine.drafting.ngram_cache import NgramCache
from app.engine.drafting.ngram_drafters import CombinedDrafter, NgramCacheDrafter
from app.engine.loop.sampling import SamplingParams
from app.engine.loop.speculative import DecodeSettings, generate

PROMPTS = [
    "def add(a, b):\n    return a + b\n\ndef add(a, b):\n",
    "The model reads the file and the model writes the file.",
    "héllo wörld ✓ 日本",
    "x",
]
GREEDY = SamplingParams(temperature=0.0)


def run(loaded, prompt_ids, drafter=None, **settings):
    settings.setdefault("sampling", GREEDY)
    kv = loaded.kv_model()
    events = list(generate(kv, loaded.tokenizer, prompt_ids, drafter, DecodeSettings(**settings)))
    assert isinstance(events[-1], DoneEvent)
    return events[:-1], events[-1].summary


@torch.inference_mode()
def reference_greedy(model, prompt_ids, n, eos):
    """Plain greedy decoding without any cache: the definition we must match."""
    ids = list(prompt_ids)
    out = []
    for _ in range(n):
        token = int(model(torch.tensor([ids])).logits[0, -1].argmax())
        if token == eos:
            break
        out.append(token)
        ids.append(token)
    return out


def drafter_for(kind, tiny_loaded, main):
    if kind == "none":
        return NoDrafter()
    if kind == "lookup":
        return PromptLookupDrafter()
    draft = tiny_loaded(kind)
    return ModelDrafter(draft.kv_model(), main.kv_model().vocab_size, name=kind)


@pytest.mark.parametrize("main_name", ["llama-f32", "llama-q8", "qwen2-f32", "qwen2-q8"])
def test_plain_decoding_matches_reference(tiny_loaded, main_name):
    main = tiny_loaded(main_name)
    for prompt in PROMPTS[:2]:
        ids = main.tokenizer.encode(prompt)
        _, summary = run(main, ids, NoDrafter(), max_new_tokens=24)
        assert list(summary.tokens) == reference_greedy(main.model, ids, 24, main.tokenizer.eos_token_id)


@pytest.mark.parametrize("main_name,same,other", [
    ("llama-f32", "llama-f32", "llama-other"),
    ("llama-q8", "llama-q8", "llama-f32"),
    ("qwen2-f32", "qwen2-f32", "llama-other"),
    ("qwen2-q8", "qwen2-q8", "qwen2-f32"),
])
@pytest.mark.parametrize("draft_max", [1, 3, 8])
def test_greedy_identity_for_every_drafter(tiny_loaded, main_name, same, other, draft_max):
    main = tiny_loaded(main_name)
    for prompt in PROMPTS:
        ids = main.tokenizer.encode(prompt)
        _, baseline = run(main, ids, NoDrafter(), max_new_tokens=32)
        for kind in ("lookup", same, other):
            _, summary = run(main, ids, drafter_for(kind, tiny_loaded, main),
                             max_new_tokens=32, draft_max=draft_max, draft_p_min=0.0)
            assert summary.tokens == baseline.tokens, (kind, prompt)
            assert summary.text == baseline.text


@pytest.mark.parametrize("main_name", ["llama-f32", "qwen2-q8"])
@pytest.mark.parametrize("draft_max", [1, 3, 8])
def test_greedy_identity_with_the_ngram_cache(tiny_loaded, main_name, draft_max):
    main, other = tiny_loaded(main_name), tiny_loaded("llama-other")
    cache = NgramCache()
    # Warm-up: what another model says to the same prompts, right in places and wrong in others.
    for prompt in PROMPTS:
        ids = main.tokenizer.encode(prompt)
        cache.learn(ids + list(run(other, ids, NoDrafter(), max_new_tokens=32)[1].tokens))
    drafted = accepted = 0
    for prompt in PROMPTS:
        ids = main.tokenizer.encode(prompt)
        _, baseline = run(main, ids, NoDrafter(), max_new_tokens=32)
        model = ModelDrafter(other.kv_model(), main.kv_model().vocab_size, name="other")
        # The cache alone learns this reply when it ends: the combined drafters then find it.
        for drafter in (NgramCacheDrafter(cache), CombinedDrafter([PromptLookupDrafter(), NgramCacheDrafter(cache)]),
                        CombinedDrafter([PromptLookupDrafter(), NgramCacheDrafter(cache)], model)):
            _, summary = run(main, ids, drafter, max_new_tokens=32, draft_max=draft_max, draft_p_min=0.0)
            assert summary.tokens == baseline.tokens, (drafter.name, prompt)
            assert summary.text == baseline.text
            drafted, accepted = drafted + summary.n_drafted, accepted + summary.n_accepted
    assert accepted > 0 and drafted > accepted  # drafts both right and wrong were verified


def test_draft_equal_to_main_is_always_accepted(tiny_loaded):
    main = tiny_loaded("llama-f32")
    ids = main.tokenizer.encode(PROMPTS[1])
    # Drafts of the full length at every step: the adaptive length between a draft model as dear
    # as the main one and its verify depends on the steps' timings (3 or 4 on a busy machine),
    # which tests/engine/test_schedule.py covers with given costs.
    events, summary = run(main, ids, drafter_for("llama-f32", tiny_loaded, main),
                          max_new_tokens=40, draft_max=4, draft_p_min=0.0, adaptive_draft=False)
    assert summary.n_drafted > 0 and summary.n_accepted == summary.n_drafted
    assert summary.accept_rate == 1.0
    assert summary.mean_accepted_length > 3.0
    assert all(rate == 1.0 for rate in summary.acceptance_by_position)
    # Every step but the first emits its accepted drafts then one main-model token.
    for event in events[1:-1]:  # the last step may be cut at the token budget
        assert event.origins[-1] is Origin.MAIN
        assert all(o is Origin.DRAFT for o in event.origins[:-1])


def test_useless_draft_is_rarely_accepted(tiny_loaded):
    main = tiny_loaded("llama-f32")
    ids = main.tokenizer.encode(PROMPTS[1])
    fixed = dict(max_new_tokens=40, draft_max=4, draft_p_min=0.0, adaptive_draft=False)
    _, summary = run(main, ids, drafter_for("llama-other", tiny_loaded, main), **fixed)
    assert summary.n_drafted > 20
    assert summary.accept_rate < 0.2
    # The adaptive schedule notices and mostly stops drafting; the output does not change.
    _, adaptive = run(main, ids, drafter_for("llama-other", tiny_loaded, main), **{**fixed, "adaptive_draft": True})
    assert adaptive.n_drafted < summary.n_drafted / 2
    assert adaptive.tokens == summary.tokens


def test_adaptive_schedule_keeps_drafting_what_is_accepted(tiny_loaded):
    main = tiny_loaded("llama-f32")
    ids = main.tokenizer.encode(PROMPTS[0])
    _, same = run(main, ids, drafter_for("llama-f32", tiny_loaded, main), max_new_tokens=40, draft_max=8,
                  draft_p_min=0.0)
    assert same.accept_rate == 1.0
    assert same.n_drafted >= 8  # the draft length itself follows measured times: see test_schedule
    _, fixed = run(main, ids, drafter_for("llama-f32", tiny_loaded, main), max_new_tokens=40, draft_max=8,
                   draft_p_min=0.0, adaptive_draft=False)
    assert same.tokens == fixed.tokens


def test_draft_p_min_stops_unsure_drafts(tiny_loaded):
    main = tiny_loaded("llama-f32")
    ids = main.tokenizer.encode(PROMPTS[1])
    _, loose = run(main, ids, drafter_for("llama-other", tiny_loaded, main), max_new_tokens=30, draft_p_min=0.0)
    _, strict = run(main, ids, drafter_for("llama-other", tiny_loaded, main), max_new_tokens=30, draft_p_min=0.999999)
    assert strict.n_drafted < loose.n_drafted
    assert strict.tokens == loose.tokens


def test_draft_min_skips_short_drafts(tiny_loaded):
    main = tiny_loaded("llama-f32")
    ids = main.tokenizer.encode(PROMPTS[0])
    events, summary = run(main, ids, PromptLookupDrafter(), max_new_tokens=30, draft_max=8, draft_min=5)
    assert all(e.n_drafted == 0 or e.n_drafted >= 5 for e in events)


def test_lookup_accepts_on_repetitive_text(tiny_loaded):
    main = tiny_loaded("llama-f32")
    ids = main.tokenizer.encode(PROMPTS[1])
    _, summary = run(main, ids, PromptLookupDrafter(), max_new_tokens=48)
    assert summary.n_drafted > 0
    # Random tiny models fall into loops; lookup then predicts them.
    assert summary.n_accepted > 0


def test_event_texts_add_up_and_multibyte_text_is_whole(tiny_loaded):
    main = tiny_loaded("qwen2-f32")
    ids = main.tokenizer.encode(PROMPTS[2])
    events, summary = run(main, ids, PromptLookupDrafter(), max_new_tokens=40)
    joined = "".join(e.text for e in events)
    assert joined == summary.text == main.tokenizer.decode(list(summary.tokens), skip_special_tokens=True)
    assert sum(len(e.tokens) for e in events) == summary.n_predicted


def test_stop_at_max_tokens_and_cancel(tiny_loaded):
    main = tiny_loaded("llama-f32")
    ids = main.tokenizer.encode(PROMPTS[1])
    _, summary = run(main, ids, PromptLookupDrafter(), max_new_tokens=7)
    assert summary.n_predicted <= 7 and summary.stop_reason in (StopReason.MAX_TOKENS, StopReason.EOS)

    steps = []
    kv = main.kv_model()
    gen = generate(kv, main.tokenizer, ids, NoDrafter(), DecodeSettings(max_new_tokens=100, sampling=GREEDY),
                   cancel=lambda: len(steps) >= 3)
    events = []
    for event in gen:
        events.append(event)
        if isinstance(event, StepEvent):
            steps.append(event)
    assert events[-1].summary.stop_reason is StopReason.CANCELLED
    assert events[-1].summary.n_predicted == 3


def test_stop_string_cuts_text(tiny_loaded):
    main = tiny_loaded("llama-f32")
    ids = main.tokenizer.encode(PROMPTS[1])
    _, free = run(main, ids, NoDrafter(), max_new_tokens=40)
    stop = free.text[10:14]
    assert stop
    events, summary = run(main, ids, PromptLookupDrafter(), max_new_tokens=40, stop_strings=(stop,))
    assert summary.stop_reason is StopReason.STOP_STRING
    assert summary.text == free.text[: free.text.find(stop)]
    assert "".join(e.text for e in events) == summary.text


def test_eos_stops_and_is_not_shown(tiny_loaded):
    main = tiny_loaded("llama-f32")
    ids = main.tokenizer.encode(PROMPTS[1])
    _, free = run(main, ids, NoDrafter(), max_new_tokens=12)
    # Declare the 5th generated token an end-of-sequence token: generation stops right before it.
    stop_token = free.tokens[4]
    _, summary = run(main, ids, PromptLookupDrafter(), max_new_tokens=12, stop_token_ids=(stop_token,))
    assert summary.stop_reason is StopReason.EOS
    assert list(summary.tokens) == list(free.tokens[: free.tokens.index(stop_token)])


def test_context_full_stops_generation(tiny_loaded):
    main = tiny_loaded("llama-f32")
    ids = main.tokenizer.encode(PROMPTS[1])
    kv = main.kv_model(n_ctx=len(ids) + 5)
    events = list(generate(kv, main.tokenizer, ids, PromptLookupDrafter(),
                           DecodeSettings(max_new_tokens=50, sampling=GREEDY)))
    summary = events[-1].summary
    assert summary.stop_reason is StopReason.CONTEXT_FULL
    assert len(ids) + summary.n_predicted <= len(ids) + 5


def test_stop_string_inside_a_multi_token_step_keeps_plain_decodings_tokens(tiny_loaded):
    """A stop string that ends mid-step: the accepted drafts after it are not part of the reply,
    so tokens and text equal plain decoding's with the same stop string."""
    main = tiny_loaded("llama-f32")
    ids = main.tokenizer.encode(PROMPTS[0])
    _, free = run(main, ids, NoDrafter(), max_new_tokens=40)
    stop = free.text[len(free.text) // 2 : len(free.text) // 2 + 3]
    assert stop and len(free.tokens) > 10
    _, plain = run(main, ids, NoDrafter(), max_new_tokens=40, stop_strings=(stop,))
    _, spec = run(main, ids, drafter_for("llama-f32", tiny_loaded, main), max_new_tokens=40,
                  draft_max=8, draft_p_min=0.0, adaptive_draft=False, stop_strings=(stop,))
    assert plain.stop_reason is StopReason.STOP_STRING and spec.stop_reason is StopReason.STOP_STRING
    assert spec.mean_accepted_length > 1  # the stop did fall inside multi-token steps
    assert spec.tokens == plain.tokens and spec.text == plain.text
    assert spec.n_predicted == plain.n_predicted
