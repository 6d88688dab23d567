"""`specula bench-rows`: how often llama.cpp's batch rows equal its one-token rows here, with the
settings given (-t, -fa, --no-repack), and what plain decoding costs with them.

A verify feeds several positions as one batch; plain decoding feeds them one by one. Where the two
give bit-identical rows, greedy drafting is exactly plain decoding; where they differ only in the
last bits, replies can part at near-ties (app.engine.loop.fidelity). The prefixes are random positions
of a fixed text, so the counts compare settings and machines, not models' quality.
"""

from __future__ import annotations

import argparse
import random
import time

from app.cli.flags import add_backend_flags, backend_kwargs
from app.hub.builtin import resolve_model_arg

CASES = 40
TEXT_TOKENS = 1400


def register(sub) -> None:
    parser = sub.add_parser("bench-rows", help="llama.cpp: how many batch rows equal one-token rows with these settings, and the plain speed")
    parser.add_argument("-m", "--model", required=True, help="GGUF file or built-in model name")
    parser.add_argument("--cases", type=int, default=CASES, help=f"random prefixes, blocks of 2-9 positions each (default {CASES})")
    add_backend_flags(parser)
    parser.set_defaults(func=cmd_bench_rows)


def _text() -> str:
    from app.compare.prompts import BUILTIN_PROMPTS

    return "\n\n".join(p.text for p in BUILTIN_PROMPTS) * 8


def cmd_bench_rows(args: argparse.Namespace) -> int:
    import numpy as np

    from app.engine.backends.llamacpp.kv import LlamaWeights
    from app.engine.backends.llamacpp.tokenizer import LlamaTokenizer
    from app.engine.gguf.info import read_gguf_info

    path = resolve_model_arg(args.model)
    info = read_gguf_info(path)  # our header checks before llama.cpp reads the file
    settings = backend_kwargs(args)["llama"]
    weights = LlamaWeights(path, 0, settings)
    kv = weights.context(2048)
    ids = LlamaTokenizer(weights, info).encode(_text())[:TEXT_TOKENS]
    rng = random.Random(0)
    same = argmax = total = 0
    worst = 0.0
    kv.feed_rows(ids[:TEXT_TOKENS - 20], 1)
    for _ in range(max(args.cases, 1)):
        p, b = rng.randrange(50, len(ids) - 20), rng.randrange(2, 10)
        kv.rewind(p)
        if len(kv.ids) < p:
            kv.feed_rows(ids[len(kv.ids):p], 1)
        singles = [kv.feed_rows([ids[p + i]], 1).all()[0] for i in range(b)]  # all(): a copy
        kv.rewind(p)
        batch = kv.feed_rows(ids[p:p + b], b).all()
        for row, single in zip(batch, singles):
            total += 1
            same += int(np.array_equal(row, single))
            argmax += int(row.argmax() == single.argmax())
            worst = max(worst, float(np.abs(row - single).max()))
    kv.rewind(100)
    started = time.perf_counter()
    for token in ids[100:164]:
        kv.feed_rows([token], 1).argmax(0)
    plain = 64 / (time.perf_counter() - started)
    flash = {1: "on", 0: "off", -1: "auto"}[settings.flash_attn]
    print(f"{path.name}: -t {settings.thread_count()} -fa {flash}{' --no-repack' if not settings.repack else ''}: "
          f"{same}/{total} batch rows bit-identical to one-token rows, {argmax}/{total} with the same argmax, "
          f"max |diff| {worst:.3f}; plain decoding {plain:.1f} tok/s")
    return 0
