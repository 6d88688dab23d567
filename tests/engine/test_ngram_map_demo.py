"""llama.cpp's ngram-map-k and ngram-map-k4v on the demo models, in our loop, on the code-rewrite
prompt (a reply that copies from its prompt): a first request and the same request again (one
drafter kept, begin() with the new prompt, as a llama-server slot keeps its map), drafts of 32
forced at every step, and llama.cpp's defaults. Every reply equals plain decoding's or leaves it
only at a near-tie (as tests/engine/test_fidelity.py).

llama.cpp's map searches only occurrences at least size_n + size_m + 1 tokens back, so its
defaults (12, 48) find little in a 64-token reply to a short prompt: the drafting runs use a
4-token key."""

from __future__ import annotations

import dataclasses

import pytest

from app.cli.bench.common import PROMPTS, prompt_ids
from app.engine.drafting.kinds import MapParams
from app.engine.drafting.factory import make_drafter
from app.engine.events import DoneEvent
from app.engine.loop.fidelity import compare_to_plain
from app.engine.loop.speculative import generate
from tests.engine.test_fidelity import SETTINGS, demos  # noqa: F401  (demos: the module's fixture)

pytestmark = pytest.mark.demo

FORCED_32 = dataclasses.replace(SETTINGS, draft_max=32, adaptive_draft=False)
# What the map proposes is asked about, not whether drafting pays on this machine now: the runs
# that count accepted drafts draft a pinned length (the adaptive schedule prices drafts by the
# step costs measured at load, and a busy machine's measured a verify of 4 at 4.7x a token, declined
# every draft and failed "some drafts were accepted"). The defaults' run keeps the schedule.
PINNED_8 = dataclasses.replace(SETTINGS, draft_max=8, adaptive_draft=False)
SHORT_KEY, LONG_DRAFT = MapParams(size_n=4, size_m=16), MapParams(size_n=4, size_m=48)


def _reply(main, drafter, ids, settings):
    events = generate(main.kv_model(), main.tokenizer, ids, drafter, settings)
    return next(e.summary for e in events if isinstance(e, DoneEvent))


def _map(main, kind, params):
    return make_drafter(main, kind, map_k=params, map_k4v=params)


@pytest.mark.parametrize("key", ["gemma3-270m", "smollm2-135m"])
def test_map_types_keep_plain_decodings_reply_or_part_only_at_a_near_tie(demos, key):
    main = demos[key]
    ids = prompt_ids(main, PROMPTS["code-rewrite"])
    plain = _reply(main, make_drafter(main, "none"), ids, SETTINGS).tokens
    kv = main.kv_model()
    for kind in ("ngram-map-k", "ngram-map-k4v"):
        kept = _map(main, kind, SHORT_KEY)
        runs = {"first": (kept, PINNED_8), "again": (kept, PINNED_8),
                "forced 32": (_map(main, kind, LONG_DRAFT), FORCED_32), "defaults": (make_drafter(main, kind), SETTINGS)}
        summaries = {}
        for name, (drafter, settings) in runs.items():
            summaries[name] = summary = _reply(main, drafter, ids, settings)
            found = compare_to_plain(kv, ids, plain, summary.tokens)
            assert found is None or found.at_near_tie, f"{key} {kind} {name} left plain decoding at {found.index}"
        assert summaries["first"].n_accepted > 0 and summaries["again"].n_accepted > 0, (kind, summaries)
        assert len(summaries["forced 32"].drafted_by_position) == 32, (kind, summaries["forced 32"])  # 32 drafted at once
