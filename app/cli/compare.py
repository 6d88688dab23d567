"""`specula compare`: one main model, several drafters, one prompt set, side by side, headless.

    specula compare -m MAIN --drafts none,lookup+ngram-cache+ngram-mod,lookup,PATH_OR_REPO... [--prompts builtin|CATS|FILE]
                    [--draft-max 4,8,16] [-r RUNS] [--json OUT] [--csv OUT] [--png OUT]

A progress bar goes to stderr; the table, the verdict and the `specula run` command that reproduces
the fastest configuration to stdout. --json is written as results come in, so Ctrl-C (once: stop
after the current step; twice: quit) keeps every finished result;
--csv and --png are written at the end, also after Ctrl-C. The PNG is drawn by the window's chart
code (app.ui, Qt offscreen), reached by name so that this module never imports Qt.
"""

from __future__ import annotations

import argparse
import random
import re
import signal
import sys
import threading
import time
from pathlib import Path

from app.cli.flags import add_model_flags, add_sampling_flags
from app.cli.spec_args import ENGINE_KIND, UsageError, spec_types
from app.cli.request import check_server_url, read_api_key, rpc_endpoints
from app.compare.choices import parse_drafts, parse_lengths, resolve_draft, url_choice
from app.compare.prompts import CATEGORIES, own_prompt, prompts_from_arg
from app.compare.results import COMPLETE, NGRAM_PARTS, NONE, CompareRequest, Progress, RunSettings
from app.engine.drafting.kinds import LEARNING
from app.engine.settings import GenSettings
from app.hub.builtin import resolve_model_arg


def register(sub) -> None:
    parser = sub.add_parser("compare", help="compare drafters side by side on a prompt set (table, JSON, CSV, PNG)")
    add_model_flags(parser, draft=False)
    parser.add_argument("--drafts", default=f"{NONE},{LEARNING}", metavar="LIST",
                        help="comma-separated: none (always run, the baseline), lookup, ngram-cache, ngram-mod, "
                             "ngram-map-k, ngram-map-k4v (n-gram kinds joined by + are one combined drafter: "
                             f"{LEARNING} is the chat's default), GGUF files, built-in models, or "
                             "owner/repo/file.gguf from Hugging Face (default "
                             f"{NONE},{LEARNING}); llama.cpp's own speculation as llama-server:TYPE[+TYPE] (any "
                             "--spec-type of llama-server, started here on the same prompt ids; llama-server:none is "
                             "its plain decoding, run beside any other type to measure drafting against; draft-* "
                             "types use the first -md model). An ngram-cache and an ngram-mod pool start empty in "
                             "each run and learn from each of their replies in turn, as the chat's do")
    parser.add_argument("--spec-type", type=spec_types, default=None, metavar="TYPE[,TYPE...]",
                        help="llama.cpp's name: add the n-gram types (ngram-simple = lookup, ngram-mod, ngram-map-k, "
                             "ngram-map-k4v, ngram-cache), combined into one drafter as llama.cpp combines them, to --drafts; "
                             "draft-simple is the -md model, compared in its own rows")
    parser.add_argument("-md", "--model-draft", "--spec-draft-model", dest="model_draft", action="append", default=[],
                        metavar="FILE", help="add a draft model to --drafts (repeatable)")
    parser.add_argument("--server", metavar="URL", default=None,
                        help="one more row: the server at URL (llama-server or any OpenAI-compatible one) answers "
                             "the same prompts with its own model and speculation")
    parser.add_argument("--api-key-file", metavar="FILE", default=None,
                        help="with --server: a file holding its API key (read, never printed or saved)")
    parser.add_argument("--rpc", metavar="HOST:PORT[,...]", default=None,
                        help="llama-server rows split the main model across these llama.cpp RPC workers (specula "
                             "rpc-worker); Specula's own rows run in this process")
    parser.add_argument("--prompts", default=None, metavar="builtin|CATS|FILE",
                        help=f"the built-in set (default), some of its categories ({','.join(CATEGORIES)}), "
                             "or a file: JSON lines {\"category\",\"prompt\"} or one prompt per paragraph")
    parser.add_argument("-p", "--prompt", action="append", default=[], metavar="TEXT",
                        help="your own prompt (repeatable); replaces the built-in set unless --prompts is given")
    parser.add_argument("--spec-draft-n-max", "--draft-max", dest="draft_max", metavar="K[,K...]",
                        help="run each drafter with each of these fixed draft lengths (default: the adaptive "
                             "length, ceiling 16; unlike llama.cpp, several lengths make a sweep)")
    parser.add_argument("--spec-draft-n-min", "--draft-min", dest="draft_min", type=int, default=0, metavar="N", help="draft nothing when fewer than this would be drafted")
    parser.add_argument("--spec-draft-p-min", "--draft-p-min", dest="draft_p_min", type=float, default=0.75, metavar="P", help="a draft model stops below this confidence (default 0.75; llama.cpp's 0)")
    parser.add_argument("-ngld", "--n-gpu-layers-draft", type=int, default=None, help="draft layers on the GPU")
    add_sampling_flags(parser, temp=0.0, n_predict=64, n_predict_help="tokens per reply (default 64)")
    parser.set_defaults(seed=0)  # one fixed seed for every configuration (-1: a random one, still shared)
    parser.add_argument("--ignore-eos", action="store_true", help="run every reply to -n tokens")
    parser.add_argument("-r", "--repetitions", "--repeat", dest="repetitions", type=int, default=3, metavar="N",
                        help="run the whole prompt set N times (llama-bench's -r; default 3): a drafter is called "
                             "the fastest only when its slowest run beats plain decoding's fastest")
    parser.add_argument("--json", metavar="OUT", help="write the whole run as JSON (updated as results come in)")
    parser.add_argument("--csv", metavar="OUT", help="write the table as CSV")
    parser.add_argument("--png", metavar="OUT", help="write the charts as a PNG image")
    parser.set_defaults(func=cmd_compare)


def build_request(args: argparse.Namespace, notice=None) -> CompareRequest:
    if args.n_predict < 1:
        raise SystemExit("specula: error: -n must be at least 1")
    if args.repetitions < 1:
        raise SystemExit("specula: error: -r must be at least 1")
    prompts = [own_prompt(text) for text in args.prompt]
    if args.prompts is not None or not prompts:
        prompts = prompts_from_arg(args.prompts or "builtin") + prompts
    seed = args.seed if args.seed >= 0 else random.randrange(1 << 31)
    gen = GenSettings(max_tokens=args.n_predict, temperature=args.temp, top_k=args.top_k, top_p=args.top_p,
                      min_p=args.min_p, seed=seed, draft_min=args.draft_min, draft_p_min=args.draft_p_min)
    settings = RunSettings(gen, draft_sweep=parse_lengths(args.draft_max), ignore_eos=args.ignore_eos,
                           repeats=args.repetitions)
    first_draft = args.model_draft[0] if args.model_draft else None
    drafts = tuple(resolve_draft(name, notice, first_draft) for name in parse_drafts(drafts_arg(args)))
    api_key = None
    if args.server:
        drafts += (url_choice(check_server_url(args.server)),)
        api_key = read_api_key(args.api_key_file)
    return CompareRequest(
        main_path=str(resolve_model_arg(args.model)), drafts=drafts, prompts=tuple(prompts), settings=settings,
        device=args.device, dtype=args.dtype, n_gpu_layers=args.n_gpu_layers,
        n_gpu_layers_draft=args.n_gpu_layers_draft, ctx_size=args.ctx_size,
        backend=args.backend, api_key=api_key, rpc=tuple(rpc_endpoints(args.rpc)) if args.rpc else (),
    )


def drafts_arg(args: argparse.Namespace) -> str:
    """--drafts with what --spec-type and -md add: the n-gram types as one combined drafter."""
    types = [t for t in (args.spec_type or ()) if t not in ("none", "draft-simple")]
    if "draft-simple" in (args.spec_type or ()) and not args.model_draft:
        raise UsageError("--spec-type draft-simple needs a draft model (-md/--spec-draft-model FILE)")
    combined = "+".join(kind for kind in NGRAM_PARTS if kind in {ENGINE_KIND[t] for t in types})
    return ",".join([args.drafts, *([combined] if combined else []), *args.model_draft])


def cmd_compare(args: argparse.Namespace) -> int:
    for out in (args.json, args.csv, args.png):
        if out and not Path(out).expanduser().absolute().parent.is_dir():
            raise SystemExit(f"specula: error: {out}: the folder does not exist")
    bar = ProgressBar(sys.stderr)
    request = build_request(args, notice=bar.note)
    from app.compare.export import format_table, save_csv
    from app.compare.fastest import reproduce_line
    from app.compare.runner import Runner
    from app.compare.verdict import verdict
    from app.engine.errors import LoadCancelled

    stop = threading.Event()
    runner = Runner(request, on_progress=bar.update, cancel=stop.is_set, save_to=args.json)
    try:
        with _CtrlCStops(stop, bar):
            run = runner.run()
    except LoadCancelled:
        bar.note("interrupted while loading the main model: nothing was run")
        return 130
    bar.done()
    print(format_table(run))
    print(f"verdict: {verdict(run)}")
    reproduce = reproduce_line(run, request.dtype)
    if reproduce is not None:
        print(reproduce)
    if args.csv:
        save_csv(run, args.csv)
    if args.png:
        from app.ui.compare.png import save_png  # Qt, only here: the one door pyproject.toml allows

        save_png(run, args.png)
    return 0 if run.status == COMPLETE else 130


class _CtrlCStops:
    """Ctrl-C once: stop after the current decoding step (finished results are kept); twice: quit."""

    def __init__(self, stop: threading.Event, bar: ProgressBar) -> None:
        self.stop, self.bar = stop, bar
        self.previous = None

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        if self.stop.is_set():
            raise KeyboardInterrupt
        self.stop.set()
        self.bar.note("stopping after this step (Ctrl-C again to quit)")

    def __exit__(self, *exc_info) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)


class ProgressBar:
    """A bar redrawn in place on a terminal; on a pipe or a log, one line per new stage."""

    WIDTH = 24

    def __init__(self, stream) -> None:
        self.stream = stream
        self.tty = bool(getattr(stream, "isatty", lambda: False)())
        self.last_draw = 0.0
        self.last_stage = ""
        self.drawn = False

    def update(self, progress: Progress) -> None:
        if self.tty:
            now = time.monotonic()
            if now - self.last_draw < 0.1 and progress.done < progress.total:
                return
            self.last_draw = now
            filled = int(self.WIDTH * progress.done / max(progress.total, 1))
            line = f"[{'#' * filled}{'.' * (self.WIDTH - filled)}] {progress.done}/{progress.total} {progress.stage}"
            self.stream.write("\r" + line[:110].ljust(110))
            self.drawn = True
        else:
            stage = re.sub(r" \d+%$", "", progress.stage)
            if stage != self.last_stage:
                self.last_stage = stage
                self.stream.write(f"[{progress.done}/{progress.total}] {stage}\n")
        self.stream.flush()

    def note(self, text: str) -> None:
        self.done()
        self.stream.write(f"specula: {text}\n")
        self.stream.flush()

    def done(self) -> None:
        if self.drawn:
            self.stream.write("\n")
            self.drawn = False
