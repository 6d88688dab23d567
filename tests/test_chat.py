"""Chat: the file's template, a fallback, KV reuse across turns, and a full context."""

from __future__ import annotations

import pytest

from app.engine.chat import ChatSession, render_prompt
from app.engine.drafters import PromptLookupDrafter
from app.engine.errors import ContextFullError
from app.engine.events import DoneEvent
from app.engine.sampling import SamplingParams
from app.engine.speculative import DecodeSettings

SETTINGS = DecodeSettings(max_new_tokens=16, sampling=SamplingParams(temperature=0.0))


def reply(session: ChatSession, text: str):
    events = list(session.reply(text, PromptLookupDrafter(), SETTINGS))
    assert isinstance(events[-1], DoneEvent)
    return events[-1].summary


def test_template_from_the_file_is_used(tiny_loaded):
    main = tiny_loaded("llama-f32")
    ids = render_prompt(main.tokenizer, [{"role": "system", "content": "Be brief."},
                                         {"role": "user", "content": "hello"}])
    text = main.tokenizer.decode(ids)
    assert text.startswith("<|im_start|>system\nBe brief.<|im_end|>")
    assert text.endswith("<|im_start|>assistant\n")
    assert ids.count(main.tokenizer.convert_tokens_to_ids("<|im_start|>")) == 3


def test_fallback_template_without_one_in_the_file(tiny_loaded):
    main = tiny_loaded("llama-notemplate")
    ids = render_prompt(main.tokenizer, [{"role": "user", "content": "hello"}])
    assert main.tokenizer.decode(ids) == "User: hello\nAssistant:"
    session = ChatSession(main.kv_model(), main.tokenizer)
    summary = reply(session, "hello")
    assert "\nUser:" not in summary.text  # the fallback's turn marker is a stop string
    assert session.messages[-1] == {"role": "assistant", "content": summary.text}


def test_second_turn_reuses_the_kv_cache_and_matches_a_fresh_session(tiny_loaded):
    main = tiny_loaded("qwen2-f32")
    session = ChatSession(main.kv_model(), main.tokenizer, system_prompt="You are terse.")
    first = reply(session, "What is a model?")
    second = reply(session, "And a file?")
    assert first.n_prompt_evaluated == first.n_prompt
    assert second.n_prompt_evaluated < second.n_prompt - first.n_prompt // 2
    fresh = ChatSession(main.kv_model(), main.tokenizer, system_prompt="You are terse.",
                        messages=list(session.messages[:-2]))
    again = reply(fresh, "And a file?")
    assert again.tokens == second.tokens
    assert again.n_prompt_evaluated == again.n_prompt


def test_full_context_drops_oldest_turns_then_refuses(tiny_loaded):
    main = tiny_loaded("llama-f32")
    session = ChatSession(main.kv_model(n_ctx=160), main.tokenizer, system_prompt="sys",
                          min_reply_tokens=16)
    for turn in range(6):
        reply(session, f"turn {turn}: the model reads the file and writes the file")
    prompt = main.tokenizer.decode(session.prompt_ids())
    assert prompt.startswith("<|im_start|>system\nsys")
    assert "turn 0" not in prompt and "turn 5" in prompt
    with pytest.raises(ContextFullError, match="raise -c"):
        reply(session, "the model " * 200)
