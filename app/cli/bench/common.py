"""What `specula bench` and `specula bench-ngram` share: the fixed prompt set, and one greedy
reply of ours timed. Plain data at import (the CLI lists the prompts without loading the engine),
so `bench_args` can register the commands and `bench`/`bench_ngram` import this, not each other."""

from __future__ import annotations

import time
from typing import Any

from app.compare.prompts import BUILTIN_PROMPTS

# The fixed prompt set, by category: the built-in prompts of `specula compare`, under bench's own
# name "code-rewrite" for the code prompt.
PROMPTS = {("code-rewrite" if p.category == "code" else p.category): p.text for p in BUILTIN_PROMPTS}


def prompt_ids(main: Any, text: str) -> list[int]:
    """A prompt as the window's chat renders it; a base model without a template gets the
    fallback "User: ... Assistant:" framing, as in chat. main: a LoadedModel."""
    from app.engine.loop.chat import render_prompt

    return render_prompt(main.tokenizer, [{"role": "user", "content": text}])


def timed_reply(main: Any, drafter: Any, ids: list[int], settings: Any,
                n_ctx: int | None = None, kv: Any = None) -> tuple[list[int], float, Any]:
    """(tokens, wall seconds, RunSummary) of one reply on a fresh KV cache of `main` (of n_ctx
    tokens; default: the model's own), or on `kv` emptied first (a context kept warm between
    replies, as a server keeps its slot's: nothing of the prompt is reused)."""
    from app.engine.events import DoneEvent
    from app.engine.loop.speculative import generate

    if kv is None:
        kv = main.kv_model(n_ctx)
    else:
        kv.reset()
    started = time.monotonic()
    summary = next(e.summary for e in generate(kv, main.tokenizer, ids, drafter, settings) if isinstance(e, DoneEvent))
    return list(summary.tokens), time.monotonic() - started, summary


def engine_facts(main: Any) -> str:
    """What the rows run on, from the model's backend: llama.cpp's threads and the price of a
    5-token verify over one token as measured here (it caps what any drafter can gain), or torch's
    threads and kernels."""
    return main.backend.engine_facts()
