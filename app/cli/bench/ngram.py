"""`specula bench-ngram`: what the learned n-gram cache drafts after a short chat history.

The cache is warmed with a few exchanges the model itself generates (built-in prompts other than
the measured ones, plus a few everyday questions near them: "earlier chats"), then the built-in
chat and summarise prompts run greedily with no draft, prompt lookup, the n-gram cache and both
combined. Every row starts from the same warm cache (a copy), so rows never learn from each other.
Prints n_drafted, n_accept, the acceptance rate, tokens/s and the speedup over no draft.
"""

from __future__ import annotations

import argparse
import time

from app.cli.bench.common import engine_facts, prompt_ids, timed_reply
from app.cli.run import load_main
from app.compare.prompts import BUILTIN_PROMPTS
from app.engine.drafting.factory import LOOKUP, LOOKUP_CACHE, NGRAM_CACHE, NONE, make_drafter, open_cache
from app.engine.loop.sampling import SamplingParams
from app.engine.loop.speculative import DecodeSettings
from app.hub.display import display_name

MEASURED = ("chat", "summarise")
WARM_QUESTIONS = (
    "What are three good habits for sleeping well? Answer briefly.",
    "Summarise in two sentences why regular exercise is good for you.",
    "What are three simple ways to eat more healthily? Answer briefly.",
)
CONFIGS = (NONE, LOOKUP, NGRAM_CACHE, LOOKUP_CACHE)


def cmd_bench_ngram(args: argparse.Namespace) -> int:
    main = load_main(args)
    settings = DecodeSettings(max_new_tokens=args.n_predict, sampling=SamplingParams(temperature=0.0))
    cache = open_cache(main, None)
    warm = [p.text for p in BUILTIN_PROMPTS if p.category not in MEASURED] + list(WARM_QUESTIONS)
    started = time.monotonic()
    for text in warm[: args.history]:
        _run(main, make_drafter(main, NGRAM_CACHE, cache=cache), text, settings)  # learns at the end
    print(f"# {display_name(main.path, main.info.file_type)} on {main.plan.describe()}; greedy, n={args.n_predict}; {engine_facts(main)}; history: "
          f"{min(args.history, len(warm))} exchanges, {len(cache):,} n-grams, {time.monotonic() - started:.0f} s")
    print(f"{'prompt':<10} {'config':<20} {'tokens':>6} {'drafted':>7} {'accept':>6} {'rate':>7} "
          f"{'tok/s':>7} {'speedup':>8}  identical")
    for category in MEASURED:
        text = next(p.text for p in BUILTIN_PROMPTS if p.category == category)
        base = None
        for kind in CONFIGS:
            summary, seconds = _run(main, make_drafter(main, kind, cache=cache.copy()), text, settings)
            tps = summary.n_predicted / seconds
            base = base or (summary.tokens, tps)
            rate = f"{100 * summary.accept_rate:6.1f}%" if summary.n_drafted else f"{'-':>7}"
            print(f"{category:<10} {kind:<20} {summary.n_predicted:>6} {summary.n_drafted:>7} "
                  f"{summary.n_accepted:>6} {rate} {tps:>7.2f} {tps / base[1]:>7.2f}x  "
                  f"{'yes' if summary.tokens == base[0] else 'NO'}")
    return 0


def _run(main, drafter, text: str, settings: DecodeSettings):
    """(summary, seconds) of one greedy reply, timed as `bench` times its rows."""
    _, seconds, summary = timed_reply(main, drafter, prompt_ids(main, text), settings)
    return summary, seconds
