"""The flags of `specula bench`; the benchmark itself (app.cli.bench) imports torch when run."""

from __future__ import annotations

import argparse

from app.cli import add_model_flags

# The fixed prompt set, by category (plain data: no torch needed to list it).
PROMPTS = {
    "code-rewrite": (
        "Rewrite this function so the variable names are clearer. Keep everything else the same.\n\n"
        "def total_above(values, limit):\n    result = 0\n    for v in values:\n"
        "        if v > limit:\n            result = result + v\n    return result\n\n"
        "def count_above(values, limit):\n    result = 0\n    for v in values:\n"
        "        if v > limit:\n            result = result + 1\n    return result\n"
    ),
    "chat": "What are three good habits for staying healthy? Answer briefly.",
    "summarise": (
        "Summarise the text below in two sentences, quoting its key phrase.\n\n"
        "The city council voted on Tuesday to extend the bicycle lane network by twelve kilometres. "
        "The new lanes will connect the university campus with the central station. Council members "
        "said the project, called 'Green Link', should be finished before the end of next year."
    ),
}


def _run_bench(args: argparse.Namespace) -> int:
    from app.cli.bench import cmd_bench

    return cmd_bench(args)


def register(sub) -> None:
    bench = sub.add_parser("bench", help="speed of each drafter vs no draft and vs transformers' generate()")
    add_model_flags(bench)
    bench.add_argument("-n", "--n-predict", type=int, default=64, help="tokens per reply (default 64)")
    bench.add_argument("--prompts", default=",".join(PROMPTS), help=f"categories to run (default {','.join(PROMPTS)})")
    bench.add_argument("--no-hf", action="store_true", help="skip transformers' generate() rows")
    bench.add_argument("--draft-sweep", metavar="K,K,...", help="also run each drafter with these fixed draft lengths (e.g. 2,4,8,16) beside the adaptive default")
    bench.add_argument("--json", metavar="OUT", help="also write the rows as JSON")
    bench.set_defaults(func=_run_bench)
