"""The `specula` command line, on the engine and hub layers only (no Qt).

Flags follow llama.cpp's names so that a llama.cpp user recognises them at once.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Sequence

from app import __version__
from app.engine.errors import SpeculaError


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a bad flag is one line on stderr (and exit 2), not a usage dump."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def add_model_flags(parser: argparse.ArgumentParser, draft: bool = True, server: bool = False) -> None:
    parser.add_argument("-m", "--model", required=True, help="main model: a GGUF file or a built-in name (smollm2-135m, gemma3-270m)")
    parser.add_argument("-c", "--ctx-size", type=int, default=0, help="context size of the main model (0 = the model's own)")
    parser.add_argument("-ngl", "--n-gpu-layers", type=int, default=None, help="layers of the main model computed on the GPU (99 = all; default: all when there is a GPU)")
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda", "mps"], help="where to run (default auto)")
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"], help="torch backend: weight dtype once loaded (auto: on a GPU bf16 or f16, on the CPU float32; any other value means torch)")
    add_backend_flags(parser)
    if draft:
        from app.cli.spec_args import add_spec_flags

        add_spec_flags(parser, server)


def add_backend_flags(parser: argparse.ArgumentParser) -> None:
    """--backend and llama.cpp's own run-time flags (its names and defaults)."""
    parser.add_argument("--backend", default="auto", choices=["auto", "llama.cpp", "torch"], help="what runs the model (default auto: llama.cpp where it runs here, else torch, saying why)")
    parser.add_argument("-t", "--threads", type=int, default=0, help="llama.cpp: threads (default 0 = the physical cores, as llama.cpp)")
    parser.add_argument("-fa", "--flash-attn", default="auto", choices=["on", "off", "auto"], help="llama.cpp: flash attention (default auto, as llama.cpp)")
    parser.add_argument("--no-repack", action="store_true", help="llama.cpp: keep weights in the file's layout instead of its repacked CPU kernels' (as llama.cpp's --no-repack)")


def backend_kwargs(args: argparse.Namespace) -> dict:
    """load_model's backend and llama.cpp settings from the flags above (imports the engine)."""
    from app.engine.backends.llamacpp.kv import LlamaSettings

    flash = {"on": 1, "off": 0, "auto": -1}[getattr(args, "flash_attn", "auto")]
    return {"backend": getattr(args, "backend", "auto"),
            "llama": LlamaSettings(threads=max(0, getattr(args, "threads", 0)), flash_attn=flash,
                                   repack=not getattr(args, "no_repack", False))}


def add_sampling_flags(parser: argparse.ArgumentParser, temp: float = 0.8, n_predict: int = 256,
                       n_predict_help: str = "most tokens to generate (default 256)") -> None:
    parser.add_argument("-n", "--n-predict", type=int, default=n_predict, help=n_predict_help)
    parser.add_argument("--temp", type=float, default=temp, help=f"temperature; 0 = greedy (default {temp})")
    parser.add_argument("--top-k", type=int, default=40, help="keep the k most likely tokens (0 = off, default 40)")
    parser.add_argument("--top-p", type=float, default=0.95, help="keep the smallest set with this probability mass (1 = off, default 0.95)")
    parser.add_argument("--min-p", type=float, default=0.05, help="drop tokens below this fraction of the top probability (0 = off, default 0.05)")
    parser.add_argument("--seed", type=int, default=-1, help="random seed (-1 = random)")


def build_parser() -> argparse.ArgumentParser:
    from app.cli import (bench_args, bench_busy, bench_pair, bench_rows, calibrate, compare, desktop, doctor, hub, info, make_draft,
                         rpc_worker, run, serve)

    parser = OneLineParser(prog="specula", description="Local GGUF models with speculative decoding.")
    parser.add_argument("--version", action="version", version=f"specula {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log what happens to stderr")
    parser.add_argument("--self-test", metavar="OUT.png", help="open the window offscreen, run one speculative reply on the demo model, save a screenshot, exit 0 if all went well")
    sub = parser.add_subparsers(dest="command", parser_class=OneLineParser)
    run.register(sub)
    info.register(sub)
    calibrate.register(sub)
    bench_args.register(sub)
    bench_args.register_gpu(sub)
    bench_args.register_ngram(sub)
    bench_rows.register(sub)
    bench_busy.register(sub)
    compare.register(sub)
    hub.register(sub)
    sub.add_parser("gui", help="open the window (what `specula` alone does)").set_defaults(func=lambda args: open_window())
    serve.register(sub)
    rpc_worker.register(sub)
    doctor.register(sub)
    desktop.register(sub)
    make_draft.register(sub)
    bench_pair.register(sub)
    return parser


PROBE_FLAG = "--llama-cpp-self-test"


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == [PROBE_FLAG]:
        # llama.cpp's self-test, in the child process app.engine.backends.llamacpp.probe starts
        # (through this entry point, so that a bundled app, which has no `python -m`, runs it too).
        from app.engine.backends.llamacpp.probe import main as probe_main

        return probe_main(argv[1:])
    if not argv:
        argv = ["gui"]  # the window is the main job
    verbose = "-v" in argv or "--verbose" in argv
    if not verbose:
        # transformers' warnings and progress bars are noise on a user's terminal; set before
        # the subcommands import it.
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        os.environ.setdefault("TQDM_DISABLE", "1")
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    if args.self_test:
        return open_window(args.self_test)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except SpeculaError as exc:
        print(f"specula: error: {exc}", file=sys.stderr)
        return getattr(exc, "exit_code", 1)
    except FileNotFoundError as exc:
        detail = exc.args[0] if len(exc.args) == 1 else f"{exc.filename}: {exc.strerror}"
        print(f"specula: error: {detail}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("specula: interrupted", file=sys.stderr)
        return 130


def open_window(self_test: str | None = None) -> int:
    """The window lives in app.ui, which imports Qt: imported only here, the one door from the
    command line that pyproject.toml's import contract declares, so that the CLI starts fast."""
    from app.ui.shell.launch import run_window

    return run_window(self_test)
