"""The flags of `specula bench`; the benchmark itself (app.cli.bench) imports torch when run."""

from __future__ import annotations

import argparse

from app.cli.flags import add_model_flags
from app.cli.bench.common import PROMPTS


def _run_bench(args: argparse.Namespace) -> int:
    if args.via:
        from app.cli.bench.where import cmd_bench_where

        return cmd_bench_where(args)
    from app.cli.bench.command import cmd_bench

    return cmd_bench(args)


def register(sub) -> None:
    bench = sub.add_parser("bench", help="speed of each drafter vs no draft and vs transformers' generate()")
    add_model_flags(bench)
    bench.add_argument("-n", "--n-predict", type=int, default=64, help="tokens per reply (default 64)")
    bench.add_argument("--prompts", default=",".join(PROMPTS), help=f"categories to run (default {','.join(PROMPTS)})")
    bench.add_argument("-r", "--repeat", type=int, default=1, metavar="N",
                       help="run every row N times, in rounds (each row once, then again), and show each row's run of median time (as llama-bench's -r; default 1)")
    bench.add_argument("--no-hf", action="store_true", help="skip transformers' generate() rows")
    bench.add_argument("--no-llama-cpp", action="store_true", help="skip the llama.cpp rows (shown when llama-cpp-python is installed)")
    bench.add_argument("--no-server", action="store_true", help="skip llama-server's rows (llama.cpp's own speculation, every n-gram type; shown when llama-server is built here)")
    bench.add_argument("--server-arg", action="append", default=[], metavar="ARG", help="an extra flag for every llama-server row (repeat for several, e.g. --server-arg=--spec-draft-n-max --server-arg=16)")
    bench.add_argument("--server-swa-window", action="store_true", help="run llama-server with its default window-sized cache for sliding-window layers instead of --swa-full, which our engine uses (Gemma 3's texts then differ at near-ties)")
    bench.add_argument("--draft-sweep", metavar="K,K,...", help="also run each drafter with these fixed draft lengths (e.g. 2,4,8,16) beside the adaptive default")
    bench.add_argument("--json", metavar="OUT", help="also write the rows as JSON")
    bench.add_argument("--explain", action="store_true",
                       help="after the table, say for each of our rows why drafting pays here or not: what a drafted "
                            "token and a verify cost against a main-model token, and the acceptance a draft needs")
    bench.add_argument("--via", metavar="WAY,...", help="time plain decoding and the window's default drafter where "
                       "users meet them instead, paired round by round: cli (this process), window (the real window "
                       "offscreen), serve, serve-stream (specula serve over HTTP), llama-server (the peer, llama.cpp's names for "
                       "our drafters), llama-server-each (the drafted row on llama-server once per model-free type: "
                       "our drafter against llama.cpp's best here); "
                       "e.g. --via cli,window,serve,llama-server -r 6")
    bench.set_defaults(func=_run_bench)


def _run_bench_ngram(args: argparse.Namespace) -> int:
    from app.cli.bench.ngram import cmd_bench_ngram

    return cmd_bench_ngram(args)


def register_ngram(sub) -> None:
    """`specula bench-ngram`: acceptance of the learned n-gram cache after a short history."""
    ngram = sub.add_parser("bench-ngram", help="acceptance of the n-gram cache after a short chat history, vs lookup and no draft")
    add_model_flags(ngram, draft=False)
    ngram.add_argument("-n", "--n-predict", type=int, default=96, help="tokens per reply (default 96)")
    ngram.add_argument("--history", type=int, default=6, help="warm-up exchanges generated before measuring (default 6)")
    ngram.set_defaults(func=_run_bench_ngram)


def _run_bench_gpu(args: argparse.Namespace) -> int:
    from app.cli.bench.gpu import cmd_bench_gpu

    return cmd_bench_gpu(args)


def register_gpu(sub) -> None:
    """`specula bench-gpu`: the loop's cost on random-weight Llama-shaped models (no files)."""
    gpu = sub.add_parser("bench-gpu", help="cost of the speculative loop on random-weight Llama-8B/1B-shaped models")
    gpu.add_argument("--shapes", default="full", choices=["full", "tiny"], help="full: Llama-3.1-8B main, Llama-3.2-1B draft; tiny: the same structure scaled down (default full)")
    gpu.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"], help="where to run (default auto: cuda when available)")
    gpu.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"], help="weight dtype (default bfloat16)")
    gpu.add_argument("-n", "--n-predict", type=int, default=64, help="tokens per generation (default 64)")
    gpu.add_argument("--prompt-tokens", type=int, default=128, help="random prompt length (default 128)")
    gpu.add_argument("--repeats", type=int, default=5, help="timed repeats per verify length, median kept (default 5)")
    gpu.add_argument("--json", metavar="OUT", help="also write every row as JSON")
    gpu.set_defaults(func=_run_bench_gpu)
