"""The two real demo models from PyPI through the loader users get (slow: real loads)."""

from __future__ import annotations

import pytest

from app.engine.chat import has_chat_template, render_prompt
from app.engine.drafters import NoDrafter, PromptLookupDrafter
from app.engine.events import DoneEvent
from app.engine.loader import load_model
from app.engine.sampling import SamplingParams
from app.engine.speculative import DecodeSettings, generate

pytestmark = pytest.mark.demo

REWRITE = (
    "Rewrite this code with clearer variable names, keeping the logic the same.\n\n"
    "def f(a, b):\n    c = 0\n    for d in a:\n        if d > b:\n            c = c + d\n    return c\n"
)


def summary_of(loaded, ids, drafter, n=48):
    settings = DecodeSettings(max_new_tokens=n, sampling=SamplingParams(temperature=0.0))
    events = list(generate(loaded.kv_model(), loaded.tokenizer, ids, drafter, settings))
    assert isinstance(events[-1], DoneEvent)
    return events[-1].summary


@pytest.mark.parametrize("key", ["smollm2-135m", "gemma3-270m"])
def test_demo_model_greedy_identity_and_lookup_acceptance(demo_path, key):
    loaded = load_model(demo_path(key), device="cpu", dtype="float32")
    assert loaded.info.architecture == ("llama" if key.startswith("smol") else "gemma3")
    if has_chat_template(loaded.tokenizer):
        ids = render_prompt(loaded.tokenizer, [{"role": "user", "content": REWRITE}])
    else:
        ids = loaded.tokenizer.encode(REWRITE + "\nRewritten:\n")
    plain = summary_of(loaded, ids, NoDrafter())
    lookup = summary_of(loaded, ids, PromptLookupDrafter())
    assert plain.n_predicted > 10
    assert lookup.tokens == plain.tokens and lookup.text == plain.text
    assert lookup.n_accepted > 0, "prompt lookup accepted nothing on a rewrite prompt"
