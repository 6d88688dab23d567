"""The two real demo models from PyPI through the loader users get (slow: real loads)."""

from __future__ import annotations

import pytest

from app.engine.loop.chat import has_chat_template, render_prompt
from app.engine.drafting.drafters import NoDrafter, PromptLookupDrafter
from app.engine.events import DoneEvent
from app.engine.loader import load_model
from app.engine.loop.sampling import SamplingParams
from app.engine.loop.speculative import DecodeSettings, generate

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


@pytest.mark.parametrize("key, n_prompt", [("smollm2-135m", 240), ("gemma3-270m", 500)])
def test_torch_verifies_across_the_sliding_window_match_plain_decoding(demo_path, key, n_prompt):
    """The torch backend (float32, its CPU default) on a reply that crosses, for Gemma 3, its
    sliding window (512), while prompt lookup's verifies are rewound: transformers' cache must
    keep the states a rollback past the window needs and give plain decoding's tokens."""
    loaded = load_model(demo_path(key), device="cpu", backend="torch")
    assert loaded.backend.name == "torch" and loaded.plan.dtype_name == "float32"
    helpers = ""
    while True:  # other code before the request, until the prompt is long enough
        ids = render_prompt(loaded.tokenizer, [{"role": "user", "content": helpers + REWRITE}])
        if len(ids) >= n_prompt:
            break
        helpers += f"def scale_{len(helpers)}(x):\n    return x * {len(helpers) % 7 + 2}\n\n"
    plain = summary_of(loaded, ids, NoDrafter(), n=40)
    lookup = summary_of(loaded, ids, PromptLookupDrafter(), n=40)
    assert plain.n_predicted == 40
    assert lookup.tokens == plain.tokens
    assert lookup.n_drafted > lookup.n_accepted > 0  # verifies were rewound
