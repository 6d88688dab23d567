"""The `specula` command line, on the engine and hub layers only (no Qt).

Flags follow llama.cpp's names so that a llama.cpp user recognises them at once.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
import threading
from typing import Iterator, Sequence

from app import __version__
from app.engine.errors import SpeculaError


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a bad flag is one line on stderr (and exit 2), not a usage dump."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def build_parser() -> argparse.ArgumentParser:
    from app.cli import calibrate, compare, desktop, doctor, hub, info, make_draft, replay, rpc_worker, run, serve
    from app.cli.bench import args as bench_args, busy as bench_busy, pair as bench_pair, rows as bench_rows

    parser = OneLineParser(prog="specula", description="Local GGUF models with speculative decoding.")
    parser.add_argument("--version", action="version", version=f"specula {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log what happens to stderr")
    parser.add_argument("--self-test", metavar="OUT.png", help="open the window offscreen, run one speculative reply on the demo model, save a screenshot, exit 0 if all went well")
    # The window offscreen, driven by JSON lines on stdin: `specula bench --via window` starts it.
    parser.add_argument("--drive-window", action="store_true", help=argparse.SUPPRESS)
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
    replay.register(sub)
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
    if args.self_test or args.drive_window:
        return open_window(args.self_test, drive=args.drive_window)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        if args.command == "gui":
            return int(args.func(args) or 0)
        with term_signals_interrupt():
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
    except BrokenPipeError:
        return _reader_gone()


def _reader_gone() -> int:
    """stdout's reader went away (`specula ... | head`): stop quietly, as other tools do. Python
    would flush stdout again at exit and print a traceback: point it at devnull first."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # no file descriptor behind stdout
        pass
    return 141  # 128 + SIGPIPE, as a shell reports a writer killed by the signal


@contextlib.contextmanager
def term_signals_interrupt() -> Iterator[None]:
    """SIGTERM and SIGHUP (kill, systemd, a closed terminal) stop a command as Ctrl-C does, with
    KeyboardInterrupt: its `finally`s stop the llama-server or rpc-server it started and save the
    -lcd cache, where by default Python would die at once and leave them. A signal ignored here
    (nohup) stays ignored; the window keeps Qt's handling, off the main thread nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {}
    for name in ("SIGTERM", "SIGHUP"):
        sig = getattr(signal, name, None)  # Windows has no SIGHUP
        if sig is not None and signal.getsignal(sig) not in (signal.SIG_IGN, None):  # None: a C handler's
            previous[sig] = signal.signal(sig, signal.default_int_handler)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def open_window(self_test: str | None = None, drive: bool = False) -> int:
    """The window lives in app.ui, which imports Qt: imported only here, the one door from the
    command line that pyproject.toml's import contract declares, so that the CLI starts fast."""
    from app.ui.shell.launch import run_window

    return run_window(self_test, drive)
