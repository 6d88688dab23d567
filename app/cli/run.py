"""`specula run` (llama-speculative's job) and `specula demo` (the same on a built-in model).

`run` opens the reply engine its flags name once (app.engine.session) and never asks which it
holds: Specula's own loop here, llama-server started here with llama.cpp's --spec-type, or a
server at --server's URL; each prints the same text, summary and --json fields."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from app.cli.flags import add_model_flags, add_sampling_flags
from app.cli.request import (add_engine_flag, add_rpc_flag, add_server_flags, engine_spec, local_options, pair_spec,
                             settings_from_args)
from app.cli.terminal import terminal_json, terminal_text
from app.hub.builtin import DEFAULT_DEMO, resolve_model_arg
from app.hub.display import display_name

# The engine (torch, transformers) is imported inside the commands that run a model, so that
# `specula --help`, `inspect` and `check-pair` start in a fraction of a second.
if TYPE_CHECKING:
    from app.engine.events import RunSummary, StepEvent
    from app.engine.loader import LoadedModel

DRAFT_COLOUR = "\033[32m"  # accepted draft tokens in green, as llama-speculative shows them
RESET = "\033[0m"
DEMO_PROMPT = (
    "Rewrite this Python function with clearer variable names, keeping the logic:\n\n"
    "def f(a, b):\n    c = 0\n    for d in a:\n        if d > b:\n            c = c + d\n    return c\n"
)


def register(sub) -> None:
    run = sub.add_parser("run", help="generate from a prompt with speculative decoding")
    add_model_flags(run, server=True)
    add_engine_flag(run)
    add_rpc_flag(run)
    add_server_flags(run)
    add_sampling_flags(run)
    prompt = run.add_mutually_exclusive_group(required=True)
    prompt.add_argument("-p", "--prompt", help="the prompt")
    prompt.add_argument("-f", "--file", help="read the prompt from a file")
    add_output_flags(run)
    run.set_defaults(func=cmd_run)

    demo = sub.add_parser("demo", help="a speculative chat reply on a built-in demo model (prompt lookup)")
    demo.add_argument("-m", "--model", default=DEFAULT_DEMO, help=f"built-in model or GGUF file (default {DEFAULT_DEMO})")
    demo.add_argument("-p", "--prompt", default=DEMO_PROMPT, help="the user message")
    demo.add_argument("-n", "--n-predict", type=int, default=160, help="most tokens to generate")
    demo.set_defaults(func=cmd_demo)


def add_output_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    parser.add_argument("-sys", "--system-prompt", default=None, help="system prompt (with --chat)")
    parser.add_argument("--color", action="store_true", help="show accepted draft tokens in colour")
    parser.add_argument("--json", action="store_true", help="end with one JSON object of the results")
    parser.add_argument("--explain", action="store_true", help="say why drafting pays here or not: what a drafted "
                        "token and a verify cost against a main-model token, and the acceptance a draft needs")


def load_main(args: argparse.Namespace) -> LoadedModel:
    """The main model alone (bench loads its drafters itself), after the drafting flags are
    checked together and its header and the -md draft's agree (exit 3 before the load)."""
    from app.engine.pair_loader import check_spec, load_main as load_spec_main

    spec = pair_spec(args)
    return load_spec_main(spec, info=check_spec(spec).main)


def prompt_of(args: argparse.Namespace):
    """-p or -f's text, in the model's chat template with --chat (-sys its system prompt)."""
    from app.engine.session import Prompt

    text = args.prompt if args.prompt is not None else Path(args.file).read_text(encoding="utf-8")
    if args.chat:
        return Prompt.chat([{"role": "user", "content": text}], args.system_prompt)
    return Prompt(text=text)


def stream(events, color: bool, out=None, remote: bool = False) -> RunSummary:
    """Print the reply's text as it comes; `remote`: a server's text, its control characters
    escaped (a local model's is printed as it is, the same as its --json text)."""
    from app.engine.events import DoneEvent, StepEvent

    out = out or sys.stdout  # looked up at call time: tests swap sys.stdout
    shown = terminal_text if remote else str

    summary = None
    for event in events:
        if isinstance(event, StepEvent):
            out.write(colour_text(event, shown) if color else shown(event.text))
            out.flush()
        elif isinstance(event, DoneEvent):
            summary = event.summary
    out.write("\n")
    return summary


def colour_text(event: StepEvent, shown: Callable[[str], str] = str) -> str:
    n_draft_chars = min(event.draft_chars, len(event.text))
    if not n_draft_chars:
        return shown(event.text)
    # the text shown (escaped) apart from our own colour codes
    drafted, rest = shown(event.text[:n_draft_chars]), shown(event.text[n_draft_chars:])
    return f"{DRAFT_COLOUR}{drafted}{RESET}{rest}"


def print_summary(summary: RunSummary, draft_max: int, out=None) -> None:
    out = out or sys.stderr

    def known(name: str, text: str) -> str:  # what the engine could not report says so
        return "unknown" if name in summary.unknown else text

    out.write(
        f"\nencoded {known('n_prompt_evaluated', f'{summary.n_prompt_evaluated:4d}')} tokens in "
        f"{summary.prompt_s:8.3f} seconds, speed: {known('encode_tps', f'{summary.encode_tps:8.3f}')} t/s\n"
        f"decoded {summary.n_predicted:4d} tokens in {summary.decode_s:8.3f} seconds, "
        f"speed: {summary.decode_tps:8.3f} t/s\n\n"
        f"drafter   = {summary.drafter}\n"
        f"n_draft   = {draft_max}\n"
        f"n_predict = {summary.n_predicted}\n"
        f"n_drafted = {known('n_drafted', str(summary.n_drafted))}\n"
        f"n_accept  = {known('n_accepted', str(summary.n_accepted))}\n"
        f"accept    = {known('accept_rate', f'{100 * summary.accept_rate:.3f}%')}\n"
        f"mean accepted per step = {known('mean_accepted_length', f'{summary.mean_accepted_length:.2f}')}\n"
        f"ttft      = {summary.ttft_s * 1000:.1f} ms, stop: {summary.stop_reason.value}\n"
        + (f"note: {summary.schedule_note}\n" if summary.schedule_note else "")
    )


def json_result(summary: RunSummary) -> str:
    return terminal_json(json.dumps(summary.to_dict(), ensure_ascii=False))


def cmd_run(args: argparse.Namespace) -> int:
    """The reply on the engine the flags name (this process, llama-server started here, or the
    server at --server: an incompatible draft is exit 3 before anything loads), printed as it
    streams, then llama.cpp's summary, the plan and with --json one object."""
    from app.engine.reply_engine import open_session
    from app.engine.session import AT_URL, HERE

    settings = settings_from_args(args).decode_settings()
    prompt = prompt_of(args)
    session = open_session(engine_spec(args), options=local_options(args))
    try:
        where = session.describe().where
        remote = where == AT_URL  # a server someone else runs: its text is not ours
        summary = stream(session.reply(prompt, settings), args.color, remote=remote)
        session.save_learned()  # -lcd's file learns what this reply taught the n-gram cache
        plan = session.plan_line()
    finally:
        session.close()  # stops a llama-server started here
    print_summary(summary, settings.draft_max)
    if args.explain:
        unpriced = "plain decoding prices no drafts" if where == HERE else "the server prices its own drafts"
        print(f"why: {summary.break_even or unpriced}", file=sys.stderr)
    print(f"plan: {terminal_text(plan)}", file=sys.stderr)
    if args.json:
        print(json_result(summary))
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from app.engine.loop.chat import render_prompt
    from app.engine.loader import load_model
    from app.engine.drafting.factory import LOOKUP, make_drafter
    from app.engine.loop.speculative import generate
    from app.engine.settings import GenSettings

    main = load_model(resolve_model_arg(args.model))
    print(f"# {display_name(main.path, main.info.file_type)} on {main.plan.describe()}, prompt lookup drafting, greedy", file=sys.stderr)
    print(f"> {args.prompt}\n", file=sys.stderr)
    settings = GenSettings(max_tokens=args.n_predict, temperature=0.0).decode_settings()
    ids = render_prompt(main.tokenizer, [{"role": "user", "content": args.prompt}])
    summary = stream(generate(main.kv_model(), main.tokenizer, ids, make_drafter(main, LOOKUP), settings), color=True)
    print_summary(summary, settings.draft_max)
    return 0
