"""`specula replay`: would a draft model pay on another machine? Record a real pair's greedy
acceptance once, then replay the draft-length schedule over cost curves (this CPU's, and a
memory-bound machine's: a GPU, many cores) against every fixed draft length.

    specula replay -m qwen2.5-coder-1.5b -md qwen2.5-coder-0.5b --record pair.json
    specula replay --from pair.json

Recording runs the pair (greedy, `-n` tokens a prompt): at each position of the main model's
reply, the draft model's greedy draft of up to --draft-max tokens and prompt lookup's draft,
each with how many of its tokens agree with the reply (app.engine.loop.replay). The replay
needs no model: its table is the schedule's speed (plain decoding = 1.00) beside the best fixed
length found by trying each, per prompt and curve.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from app.cli.bench.common import PROMPTS

FORMAT = 1
DRAFT_MAX = 16


def register(sub) -> None:
    replay = sub.add_parser("replay", help="record a pair's greedy acceptance, and replay the draft schedule "
                            "over cost curves (this CPU's, a GPU's) against every fixed length")
    replay.add_argument("-m", "--model", help="main model (a GGUF file or a built-in name), to record")
    replay.add_argument("-md", "--model-draft", help="its same-vocabulary draft model, to record")
    replay.add_argument("--record", metavar="FILE", help="write the recorded acceptance here (JSON)")
    replay.add_argument("--from", dest="source", metavar="FILE", help="replay a recording instead of recording")
    replay.add_argument("-n", "--n-predict", type=int, default=128, help="tokens per reply when recording (default 128)")
    replay.add_argument("--prompts", default=",".join(PROMPTS), help=f"categories to record (default {','.join(PROMPTS)})")
    replay.add_argument("--draft-max", type=int, default=DRAFT_MAX, help=f"longest draft (default {DRAFT_MAX})")
    replay.set_defaults(func=cmd_replay)


def cmd_replay(args: argparse.Namespace) -> int:
    from app.cli.spec_args import UsageError

    if args.source:
        recording = load_recording(args.source)
    elif args.model and args.model_draft and args.record:
        recording = record_pair(args)
        Path(args.record).write_text(json.dumps(recording, indent=1) + "\n")
        print(f"specula: recorded to {args.record}", file=sys.stderr)
    else:
        raise UsageError("give --from FILE, or -m MAIN -md DRAFT --record FILE")
    print(format_table(recording))
    return 0


def load_recording(path: str | Path) -> dict[str, Any]:
    """A recording, checked: one line (SpeculaError) for a file that is not one."""
    from app.engine.errors import SpeculaError

    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        prompts = data["prompts"]
        for reply in prompts.values():
            if len(reply["model"]) != len(reply["free"]) or not all(int(m) >= 0 for m in reply["model"]):
                raise ValueError("model and free differ in length")
        if data.get("format") != FORMAT:
            raise ValueError(f"format {data.get('format')!r}, this Specula reads {FORMAT}")
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
        raise SpeculaError(f"{path} is not a replay recording: {str(exc)[:160]}") from None
    return data


def record_pair(args: argparse.Namespace) -> dict[str, Any]:
    """The pair's acceptance on each prompt: per position, the draft model's agreeing tokens and
    prompt lookup's (offered, agreeing)."""
    from app.cli.bench.common import prompt_ids
    from app.engine.pair_loader import PairSpec, load_pair
    from app.hub.builtin import resolve_model_arg

    spec = PairSpec(resolve_model_arg(args.model), resolve_model_arg(args.model_draft))
    pair = load_pair(spec)
    prompts = {}
    for name in [p.strip() for p in args.prompts.split(",") if p.strip()]:
        ids = prompt_ids(pair.main, PROMPTS[name])
        prompts[name] = record_reply(pair, ids, args.n_predict, args.draft_max)
        print(f"specula: recorded {name}: {len(prompts[name]['model'])} positions", file=sys.stderr)
    return {"format": FORMAT, "main": Path(spec.main_path).name, "draft": Path(spec.draft_path).name,
            "draft_max": args.draft_max, "prompts": prompts}


def record_reply(pair: Any, ids: list[int], n: int, draft_max: int) -> dict[str, list]:
    """One prompt's recording: the main model's greedy reply, then each position's drafts."""
    from app.cli.bench.common import timed_reply
    from app.engine.drafting.drafters import PromptLookupDrafter
    from app.engine.loop.sampling import SamplingParams
    from app.engine.loop.speculative import DecodeSettings
    from app.engine.seam import NoDrafter, common_prefix_length

    greedy = SamplingParams(temperature=0.0)
    reply, _, _ = timed_reply(pair.main, NoDrafter(), ids, DecodeSettings(max_new_tokens=n, sampling=greedy))
    model, lookup = pair.drafter, PromptLookupDrafter()
    for drafter in (model, lookup):
        drafter.configure(greedy, 0.0)
    agree, free = [], []
    for i in range(1, len(reply)):  # the first token comes from the prompt's pass, not a step
        context, ahead = ids + reply[:i], reply[i:]
        agree.append(common_prefix_length(model.propose(context, draft_max).tokens, ahead))
        offered = lookup.propose(context, draft_max).tokens
        free.append([len(offered), common_prefix_length(offered, ahead), lookup.confident(context)])
    return {"model": agree, "free": free}


def curves(recording: dict[str, Any]) -> list:
    """The curves a recording is replayed over: the CPU one it names, and memory-bound ones."""
    from app.engine.loop.replay import linear_curve, measured_curve

    found = [linear_curve("memory-bound: verify of 8 1.3x, draft token 0.1x", 1.3, 0.1),
             linear_curve("GPU-like: verify of 8 1.1x, draft token 0.05x", 1.1, 0.05)]
    cpu = recording.get("cpu_curve")
    if cpu:
        points = {int(k): float(v) for k, v in cpu["verify"].items()}
        found.insert(0, measured_curve(cpu["name"], points, float(cpu["draft_token"])))
    return found


def format_table(recording: dict[str, Any]) -> str:
    from app.engine.loop.replay import adaptive, best_fixed, replay, replay_combined

    k_max = int(recording.get("draft_max", DRAFT_MAX))
    lines = [f"{recording.get('main')} + draft {recording.get('draft')}, greedy; speed against plain decoding (1.00)"]
    for curve in curves(recording):
        lines += ["", curve.name,
                  f"{'prompt':<14}{'schedule':>9}{'best fixed':>12}{'k':>4}{'ratio':>7}{'+lookup':>9}{'drafted':>9}"]
        for name, reply in recording["prompts"].items():
            matches, free = reply["model"], reply["free"]
            ours = replay(matches, curve, adaptive(curve, k_max))
            k, fixed = best_fixed(matches, curve, k_max)
            both = replay_combined(matches, free, curve, adaptive(curve, k_max), adaptive(curve, k_max, 0.0))
            drafted = f"{ours.drafted}/{ours.steps}"
            lines.append(f"{name:<14}{ours.speedup:>9.2f}{fixed.speedup:>12.2f}{k:>4}"
                         f"{ours.speedup / fixed.speedup:>7.2f}{both.speedup:>9.2f}{drafted:>9}")
    return "\n".join(lines)
