"""`specula bench-busy`: plain decoding here with and without another program keeping one core
busy, for llama.cpp's default thread count (which steps aside for busy cores) and fixed ones.

The busy program is a child process spinning on the first CPU this process may use, started
before and stopped after its rows; "quiet again" is measured after it stopped, so the default's
return to all threads shows. Greedy, the maths prompt, the best of --rounds replies per cell.
"""

from __future__ import annotations

import argparse

from app.cli.flags import add_backend_flags, backend_kwargs
from app.hub.builtin import resolve_model_arg


def register(sub) -> None:
    parser = sub.add_parser("bench-busy", help="llama.cpp: plain decoding quiet and beside a busy core, per thread count")
    parser.add_argument("-m", "--model", required=True, help="GGUF file or built-in model name")
    parser.add_argument("-n", "--max-tokens", type=int, default=96, help="tokens per reply (default 96)")
    parser.add_argument("-r", "--rounds", type=int, default=4, help="replies per cell, the best kept (default 4)")
    add_backend_flags(parser)
    parser.set_defaults(func=cmd_bench_busy)


def cmd_bench_busy(args: argparse.Namespace) -> int:
    import dataclasses

    from app.cli.bench.common import PROMPTS, prompt_ids, timed_reply
    from app.engine.drafting.drafters import NoDrafter
    from app.engine.loader import load_model
    from app.common.machine import BusyCore
    from app.engine.loop.sampling import SamplingParams
    from app.engine.loop.speculative import DecodeSettings

    path = resolve_model_arg(args.model)
    base = backend_kwargs(args)["llama"]
    settings = DecodeSettings(max_new_tokens=args.max_tokens, sampling=SamplingParams(temperature=0.0))
    cores = base.thread_count() if base.threads <= 0 else dataclasses.replace(base, threads=0).thread_count()
    counts = [0, *sorted({1, cores})]
    print(f"{path.name}: plain decode tok/s, best of {args.rounds}; one core kept busy by a spinning process")
    print(f"{'threads':<28} {'quiet':>8} {'one core busy':>14} {'quiet again':>12}")
    for threads in counts:
        main = load_model(path, backend="llama.cpp", llama=dataclasses.replace(base, threads=threads))
        ids = prompt_ids(main, PROMPTS["maths"])
        kv = main.kv_model()

        def best() -> float:
            return max(timed_reply(main, NoDrafter(), ids, settings, kv=kv)[2].decode_tps
                       for _ in range(max(args.rounds, 1)))

        quiet = best()
        with BusyCore():
            busy = best()
        again = best()
        label = f"default ({cores}, steps aside)" if threads == 0 else f"-t {threads}"
        print(f"{label:<28} {quiet:8.1f} {busy:14.1f} {again:12.1f}", flush=True)
        kv.close()
    return 0
