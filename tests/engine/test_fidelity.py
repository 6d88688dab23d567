"""The drafter never changes the answer, with the defaults a user gets: on both demo models, plain
greedy decoding against every drafter, on the bench's prompts and the list-copying prompt that
once parted at token 12. Every reply equals plain decoding's, or leaves it only where the main
model's two best tokens were within fidelity.NEAR_TIE (a tie that llama.cpp's batch rows and
one-token rows may round apart); the count of such ties is printed."""

from __future__ import annotations

import inspect

import pytest

from app.cli.bench.common import PROMPTS
from app.engine.events import DoneEvent
from app.engine.loop.fidelity import compare_to_plain
from app.engine.loader import load_model
from app.engine.drafting.factory import make_drafter
from app.engine.loop.sampling import SamplingParams
from app.engine.loop.speculative import DecodeSettings, generate
from tests.llama_support import pin_step_curve

pytestmark = pytest.mark.demo

TABLE = ("Copy this table, then add one more row in the same style:\n| city | river |\n| Paris | Seine |\n"
         "| London | Thames |\n| Vienna | Danube |")
SETTINGS = DecodeSettings(max_new_tokens=64, sampling=SamplingParams(temperature=0.0))


@pytest.fixture(scope="module")
def demos(demo_path):
    """Both demo models, their drafts priced on a pinned curve (whether drafting pays on this
    machine now is the bench's question, not these tests')."""
    models = {key: load_model(demo_path(key)) for key in ("gemma3-270m", "smollm2-135m")}
    for model in models.values():
        pin_step_curve(model)
    return models


def reply(main, drafter, ids):
    events = generate(main.kv_model(), main.tokenizer, ids, drafter, SETTINGS)
    return next(e.summary for e in events if isinstance(e, DoneEvent))


@pytest.mark.parametrize("key", ["gemma3-270m", "smollm2-135m"])
def test_every_drafter_keeps_plain_decodings_reply_or_parts_only_at_a_near_tie(demos, key, capsys):
    main = demos[key]
    other = demos["smollm2-135m" if key == "gemma3-270m" else "gemma3-270m"]
    drafters = {kind: (lambda kind=kind: make_drafter(main, kind)) for kind in ("lookup", "ngram-cache", "lookup+ngram-cache")}
    drafters["text-level draft"] = lambda: make_drafter(main, draft=other)
    prompts = [main.tokenizer.encode(TABLE)] + [main.tokenizer.encode(text) for text in PROMPTS.values()]
    checked = ties = drafted = 0
    kv = main.kv_model()
    for ids in prompts:
        plain = reply(main, make_drafter(main, "none"), ids).tokens
        for name, make in drafters.items():
            summary = reply(main, make(), ids)
            drafted += summary.n_drafted
            checked += 1
            found = compare_to_plain(kv, ids, plain, summary.tokens)
            if found is None:
                continue
            assert found.at_near_tie, f"{key} with {name} left plain decoding at token {found.index}, gap {found.gap:.3f}"
            ties += 1
    assert drafted > 0
    with capsys.disabled():
        print(f"\n{key} on {main.plan.describe()}: {checked - ties} of {checked} replies identical to plain "
              f"decoding, {ties} parted at a near-tie")


def test_the_backends_settings_do_not_depend_on_the_drafter(demo_path):
    """The loader takes no drafter at all, and the window's load of a pair runs the main model
    the same with and without drafting."""
    from app.worker.engine_calls import open_pair
    from app.worker.requests import LOOKUP, NONE, PairChoice

    assert "drafter" not in inspect.signature(load_model).parameters
    path = str(demo_path("gemma3-270m"))
    plain = open_pair(PairChoice(path, NONE), lambda *_: None, lambda: False).pair.main
    drafted = open_pair(PairChoice(path, LOOKUP), lambda *_: None, lambda: False).pair.main
    assert plain.backend.name == drafted.backend.name and plain.plan == drafted.plan


def test_a_reply_that_starts_with_another_word_is_judged_by_the_prompts_own_logits(demos):
    """Issue 57 item 6: a server's plain reply that starts with another token than ours is judged
    at token 0 by the gap between the main model's two best tokens after the prompt (tie@0 where
    they are within NEAR_TIE), not counted as the same text or blamed on a later token."""
    import numpy as np

    from app.engine.loop.fidelity import top2_gap

    main = demos["smollm2-135m"]
    ids = main.tokenizer.encode(TABLE)
    plain = list(reply(main, make_drafter(main, "none"), ids).tokens)
    assert len(plain) > 4
    logits = np.asarray(main.kv_model().sync(ids))
    second = int(np.argsort(logits)[-2])
    assert int(np.argmax(logits)) == plain[0] != second

    found = compare_to_plain(main.kv_model(), ids, plain, [second, *plain[1:]])
    assert found is not None and found.index == 0
    assert found.gap == pytest.approx(top2_gap(logits), abs=1e-4)
    assert compare_to_plain(main.kv_model(), ids, plain, plain) is None
