"""`specula bench`: a fixed prompt set, each drafter, and as peers transformers' generate(),
llama.cpp's binding on the same file and llama.cpp's own speculation (llama-server, every n-gram
type, app.cli.bench.server).

Each prompt is asked twice of drafters that learn (the n-gram cache, ngram-mod's pool): the first
request with nothing learned, and the same request again, as a regenerate ("again" rows); each
round starts them afresh. The verdict table puts our best row beside llama-server's best, per
prompt, for the first request and for the repeat.

Prints a table of tokens/s (generated tokens over wall time, prompt included, the same clock for
every row), the decode rate alone (tokens after the first over the time after the first, where
the peer can report it), the speedup of both over no draft (with -r, paired by round), acceptance
rate, and whether the output equals the baseline.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch

from app.cli.bench import server as bench_server
from app.cli.bench.common import PROMPTS, engine_facts, prompt_ids, timed_reply
from app.cli.bench.verdict import AGAIN, format_verdict, verdicts
from app.cli.run import load_main
from app.cli.request import pair_spec
from app.engine.loop.fidelity import NEAR_TIE, compare_to_plain
from app.engine.loader import LoadedModel
from app.engine.drafting.factory import LOOKUP, NONE, make_drafter
from app.engine.loop.speculative import DecodeSettings, eos_ids
from app.engine.settings import GenSettings
from app.hub.display import display_name
from app.engine.errors import first_line

# Our drafters that learn across requests, each benched first and again beside llama-server's.
_LEARNING_KINDS = ("lookup+ngram-cache", "ngram-mod", "lookup+ngram-cache+ngram-mod")
_USERS = "flags"  # the factory of the drafter the flags ask for (-md, --spec-type)
DEFAULT_NGRAM = _LEARNING_KINDS[-1]  # the window's default drafter (app.worker.requests.LEARNING)
_DRAFT_MODEL = "draft model"
_WITH_NGRAM = f"{_DRAFT_MODEL} + n-gram"
_PAIR_FIXED = 3  # a draft model's fixed row: llama.cpp's draft-simple default (common.h: n_max = 3)

_Run = tuple  # (tokens, wall seconds, ...): what each kind of row's run returns


@dataclass
class BenchRow:
    prompt: str
    config: str
    n_predicted: int
    seconds: float
    tokens_per_s: float
    decode_tps: float | None  # after the first token: the prompt pass excluded
    speedup: float  # tokens_per_s over plain decoding's, the median of the rounds' ratios
    decode_speedup: float | None  # decode_tps over plain decoding's, likewise
    accept_rate: float | None
    mean_accepted: float | None
    identical: bool
    # Where a row of ours left plain decoding: "tie@12" at a near-tie (app.engine.loop.fidelity), else None.
    divergence: str | None = None
    why: str | None = None  # our rows: why drafting pays here or not (RunSummary.break_even), where priced


@torch.inference_mode()
def _transformers(main: LoadedModel, ids: list[int], n: int, draft_max: int, p_min: float, **kwargs):
    input_ids = torch.tensor([ids], device=main.plan.input_device)
    started = time.monotonic()
    out = main.model.generate(
        input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=n, do_sample=False,
        num_assistant_tokens=draft_max, num_assistant_tokens_schedule="constant",
        assistant_confidence_threshold=p_min, **kwargs,
    )
    elapsed = time.monotonic() - started
    tokens = out[0, len(ids):].tolist()
    eos = main.tokenizer.eos_token_id
    if eos in tokens:
        tokens = tokens[: tokens.index(eos)]
    return tokens, elapsed


def cmd_bench(args: argparse.Namespace) -> int:
    main = load_main(args)
    settings = GenSettings(max_tokens=args.n_predict, temperature=0.0, draft_max=args.draft_max,
                           draft_min=args.draft_min, draft_p_min=args.draft_p_min,
                           adaptive_draft=not args.draft_fixed).decode_settings()
    factories = _drafter_factories(main, args)
    drafters = {name: make() for name, make in factories.items()}
    users = drafters.get(_USERS)
    fixed_too: set[str] = set()
    if users is not None:  # the flags' drafter goes by its own name
        name = users.name if users.name not in drafters else f"{users.name} (flags)"
        if _WITH_NGRAM in drafters:  # a pair: named as its n-gram row is, the file in the header
            name = _DRAFT_MODEL
            if not args.draft_fixed:
                fixed_too.add(name)  # the draft model as scheduled and at a fixed length
        drafters[name], factories[name] = drafters.pop(_USERS), factories.pop(_USERS)
    model_part = getattr(users, "fallback", None) or users
    draft_model = getattr(getattr(model_part, "draft", None), "model", None)  # torch: for hf assisted
    print(f"# {display_name(main.path, main.info.file_type)} on {main.plan.describe()} ({main.plan_reason}); greedy, n={args.n_predict}, "
          f"draft-max={args.draft_max} ({'fixed' if args.draft_fixed else 'adaptive'}), {engine_facts(main)}"
          + (f"; draft model: {Path(pair_spec(args).draft_path).name}" if _DRAFT_MODEL in drafters else "")
          + (f"; each row the median of {args.repeat} runs, its speedups the median of the rounds' ratios"
             if args.repeat > 1 else ""))
    # Warm-up: the first step of each batch shape is slow (kernel selection, first touches), so
    # run every drafter once on a short reply before timing anything.
    warm = DecodeSettings(**{**settings.__dict__, "max_new_tokens": 24})
    for drafter in drafters.values():
        timed_reply(main, drafter, prompt_ids(main, PROMPTS["code-rewrite"]), warm)
    llama = _llama_cpp_peer(main, args)
    server = _server_peer(main, args)
    # One context for all our rows, emptied before each reply, as llama-server keeps its slot's
    # (a context made per reply paid its first steps' set-up in every row).
    kv = main.kv_model()
    rows: list[BenchRow] = []
    for category in [c.strip() for c in args.prompts.split(",") if c.strip()]:
        if category not in PROMPTS:
            raise SystemExit(f"specula: error: unknown prompt category {category!r} (known: {', '.join(PROMPTS)})")
        ids = prompt_ids(main, PROMPTS[category])
        runs: dict[tuple[str, str], Callable[[], _Run]] = {}
        for name, drafter, run_settings in _configs(drafters, settings, args.draft_sweep, fixed_too):
            base = name.split(" fixed ")[0]
            if base in (NONE, LOOKUP):  # nothing to learn: the same drafter every time
                runs[("ours", name)] = functools.partial(timed_reply, main, drafter, ids, run_settings, kv=kv)
                continue
            # A drafter that may learn: a fresh one for the first request, the same one again.
            kept: list = []
            runs[("ours", name)] = functools.partial(_first_reply, main, factories[base], kept, ids, run_settings, kv)
            runs[("ours", name + AGAIN)] = functools.partial(_again_reply, main, kept, ids, run_settings, kv)
        # transformers' own generate() runs the torch backend's model: no such rows on llama.cpp.
        peers = {} if args.no_hf or main.backend.transformers_model() is None else {
            "hf generate": {}, "hf lookup": {"prompt_lookup_num_tokens": args.draft_max}}
        if peers and draft_model is not None:
            peers["hf assisted"] = {"assistant_model": draft_model}
        for name, kwargs in peers.items():
            runs[("hf", name)] = functools.partial(_transformers, main, ids, args.n_predict, args.draft_max,
                                                   args.draft_p_min, **kwargs)
        for name in llama.models if llama is not None else ():
            runs[("llama.cpp", name)] = functools.partial(llama.run, name, ids, args.n_predict)
        for spec_type in server.types if server is not None else ():
            runs[("llama-server", f"server {spec_type}")] = functools.partial(server.first, spec_type, ids, args.n_predict)
            runs[("llama-server", f"server {spec_type}{AGAIN}")] = functools.partial(server.again, spec_type, ids,
                                                                                   args.n_predict)
        try:
            results = _interleaved_runs(args.repeat, runs)
        finally:
            if server is not None:
                server.close()
        rows.extend(_prompt_rows(category, results, ids, _judge(main)))
    limit = ceiling(kv.step_cost, min(args.n_predict, 65))  # no step can feed more than the reply
    print(format_table(rows, limit[0] if limit else None))
    if limit:
        print(f"limit: a reply known in advance would decode at {limit[0]:.2f}x plain decoding here ({limit[1]} "
              "tokens a step, on the measured batch curve); the limit column is each row's decode rate over that")
    if server is not None:
        print()
        print(format_verdict(verdicts(rows)))
    note = _identity_note(rows, main)
    if note:
        print(note)
    if args.explain:
        print()
        print(format_why(rows))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump([asdict(r) for r in rows], handle, indent=2)
    return 0


def _judge(main: LoadedModel):
    """How a reply of ours that left plain decoding's is marked: "tie@i" where the main model's
    two best tokens were within fidelity.NEAR_TIE at the first difference (a batch row and a
    one-token row may round such a tie apart), None (NO) anywhere else."""
    kv = main.kv_model()

    def judge(ids: list[int], plain: list[int], other: list[int]) -> str | None:
        found = compare_to_plain(kv, ids, plain, other)
        return f"tie@{found.index}" if found is not None and found.at_near_tie else None

    return judge


def _llama_cpp_peer(main: LoadedModel, args: argparse.Namespace):
    """llama.cpp on the same file when llama-cpp-python is installed (packaging/bootstrap.py installs it)."""
    from app.cli.bench import llamacpp as bench_llamacpp

    if args.no_llama_cpp or not bench_llamacpp.available():
        return None
    stop_ids = set(eos_ids(main.tokenizer))
    threads = main.backend.threads()
    try:
        peer = bench_llamacpp.LlamaCppPeer(main.path, n_ctx=4096, n_threads=threads,
                                           lookup_tokens=args.draft_max, stop_ids=stop_ids)
        peer.warm_up(prompt_ids(main, PROMPTS["code-rewrite"]))
    except bench_llamacpp.LOAD_ERRORS as exc:
        return _left_out("llama.cpp", main, exc)
    return peer


def _server_peer(main: LoadedModel, args: argparse.Namespace):
    """llama-server on the same file, threads and draft model, where it is built here (one line
    and no such rows where it is not, or where it cannot run the file)."""
    if args.no_server or not main.backend.llama_cpp_kernels:
        return None
    why = bench_server.available()
    if why is not None:
        print(f"specula: {why}: llama-server's rows are left out", file=sys.stderr, flush=True)
        return None
    draft = pair_spec(args).draft_path
    peer = bench_server.LlamaServerPeer(main.path, main.plan.threads, 4096, draft=draft, extra_args=args.server_arg,
                                        stop_ids=set(eos_ids(main.tokenizer)), swa_full=not args.server_swa_window)
    try:
        peer.check(prompt_ids(main, PROMPTS["code-rewrite"]))
    except bench_server.ERRORS as exc:
        return _left_out("llama-server", main, exc)
    return peer


def _left_out(peer: str, main: LoadedModel, exc: BaseException) -> None:
    """A peer that cannot run the file: our rows are still worth having, so one line, and the
    table without the peer's rows."""
    print(f"specula: {peer} could not run {main.path.name} ({first_line(exc) or type(exc).__name__}): its rows are left out",
          file=sys.stderr, flush=True)


def _drafter_factories(main: LoadedModel, args: argparse.Namespace) -> dict[str, Callable[[], object]]:
    """Each benched drafter by name, as a function making it with nothing learned (a new
    in-memory n-gram cache or pool): none, prompt lookup, the learning kinds, and the flags' own
    (-md's model loaded once, --spec-type's combination) under _USERS."""
    from app.engine.pair_loader import load_draft_for, ngram_params

    factories: dict[str, Callable[[], object]] = {NONE: lambda: make_drafter(main, NONE),
                                                  LOOKUP: lambda: make_drafter(main, LOOKUP)}
    for kind in _LEARNING_KINDS:
        factories[kind] = functools.partial(make_drafter, main, kind)
    spec = pair_spec(args)  # the flags parsed once, as run parses them
    if spec.ngram in (NONE, LOOKUP) and not spec.draft_path:
        return factories
    draft = check = None
    if spec.draft_path:
        draft, check = load_draft_for(main, spec)
    draft_ctx = args.ctx_size_draft or args.ctx_size or None
    factories[_USERS] = functools.partial(make_drafter, main, spec.ngram, draft=draft, draft_ctx=draft_ctx,
                                          check=check, **ngram_params(spec))
    if draft is not None and spec.ngram == NONE:
        # A pair's bench: plain, the default n-gram drafter, the draft model alone, and the two
        # together (n-gram drafts first, the model where they have none), as a user picks them.
        factories = {NONE: factories[NONE], DEFAULT_NGRAM: factories[DEFAULT_NGRAM], _USERS: factories[_USERS],
                     _WITH_NGRAM: functools.partial(make_drafter, main, DEFAULT_NGRAM, draft=draft,
                                                    draft_ctx=draft_ctx, check=check)}
    return factories


def _first_reply(main: LoadedModel, make: Callable[[], object], kept: list, ids: list[int],
                 settings: DecodeSettings, kv=None) -> _Run:
    """The first request with a drafter made now (nothing learned), kept for _again_reply."""
    kept[:] = [make()]
    return timed_reply(main, kept[0], ids, settings, kv=kv)


def _again_reply(main: LoadedModel, kept: list, ids: list[int], settings: DecodeSettings, kv=None) -> _Run:
    """The same request again with the drafter that answered it first (what it learned kept)."""
    return timed_reply(main, kept[0], ids, settings, kv=kv)




def _configs(drafters: dict, settings: DecodeSettings, sweep: str | None, fixed_too: set[str] = frozenset()):
    """(row name, drafter, settings): each drafter with the adaptive length, and with a fixed
    length for every value of --draft-sweep (llama.cpp's fixed --draft-max); those in
    `fixed_too` also at llama-server's draft-simple length (_PAIR_FIXED)."""
    lengths = [int(v) for v in sweep.split(",") if v.strip()] if sweep else []
    for name, drafter in drafters.items():
        yield name, drafter, settings
        if name == NONE:
            continue
        for k in lengths or ([_PAIR_FIXED] if name in fixed_too else []):
            fixed = DecodeSettings(**{**settings.__dict__, "draft_max": k, "adaptive_draft": False})
            yield f"{name} fixed {k}", drafter, fixed


def _interleaved_runs(repeats: int, runs: dict[tuple[str, str], Callable[[], _Run]]) -> dict[tuple[str, str], list[_Run]]:
    """Every run `repeats` times, round by round (A B C, A B C, ...); each row's runs in round
    order. Rounds, not each row's repeats in a row: on a shared VM the machine's speed drifts over
    seconds, and SmolLM2's chat reply with five plain runs before five lookup runs measured
    lookup at 0.78x-1.15x of plain in six runs of the same code, 0.95x-1.02x in rounds."""
    results: dict[tuple[str, str], list[_Run]] = {key: [] for key in runs}
    for _ in range(max(repeats, 1)):
        for key, run in runs.items():
            results[key].append(run())
    return results


def _median_run(done: list[_Run]) -> _Run:
    """The run of median wall time (its seconds are the result's second item), as llama-bench's -r."""
    return sorted(done, key=lambda result: result[1])[len(done) // 2]


def _rates(kind: str, result: _Run) -> tuple[float, float | None]:
    """(tokens/s of the whole run, decode tokens/s where the row's program reports it)."""
    tokens, seconds = result[0], result[1]
    decode = result[2].decode_tps if kind == "ours" else result[2] if kind in ("llama.cpp", "llama-server") else None
    return (len(tokens) / seconds if seconds > 0 else 0.0), decode


def _paired_speedups(kind: str, done: list[_Run], baseline: list[_Run]) -> tuple[float, float | None]:
    """The row's rates over plain decoding's, each the median of the rounds' ratios: runs a
    second apart share the machine's speed where runs of different rounds may not (SmolLM2's chat
    reply with 0% accepted: lookup/plain of the median runs 0.93x-1.06x across runs of the bench)."""
    totals, decodes = [], []
    for run, base in zip(done, baseline):
        (tps, decode), (base_tps, base_decode) = _rates(kind, run), _rates("ours", base)
        if base_tps:
            totals.append(tps / base_tps)
        if decode and base_decode:
            decodes.append(decode / base_decode)
    return (statistics.median(totals) if totals else 0.0), (statistics.median(decodes) if decodes else None)


def _prompt_rows(category: str, results: dict[tuple[str, str], list[_Run]], ids: list[int],
                 judge=None) -> list[BenchRow]:
    """The table's rows for one prompt: our drafters, then the peers, each against our plain
    decoding (the first of our rows)."""
    rows: list[BenchRow] = []
    ours = {name: done for (kind, name), done in results.items() if kind == "ours"}
    baseline = ours[NONE]
    plain = _median_run(baseline)[0]
    for name, done in ours.items():
        run = _median_run(done)
        tokens, summary = run[0], run[2]
        row = _row(category, name, run, "ours", plain, _paired_speedups("ours", done, baseline),
                   summary.accept_rate if name != NONE else None,
                   summary.mean_accepted_length if name != NONE else None)
        row = dataclasses.replace(row, why=summary.break_even)
        if not row.identical and judge is not None:
            row = dataclasses.replace(row, divergence=judge(ids, plain, tokens))
        rows.append(row)
    for (kind, name), done in results.items():
        if kind in ("hf", "llama.cpp", "llama-server"):
            run = _median_run(done)
            row = _row(category, name, run, kind, plain, _paired_speedups(kind, done, baseline), None, None)
            if not row.identical and judge is not None and kind != "hf":  # llama.cpp's own rows: the same model
                row = dataclasses.replace(row, divergence=judge(ids, plain, list(run[0])))
            rows.append(row)
    return rows


def _row(prompt: str, config: str, run: _Run, kind: str, baseline_tokens: list[int],
         speedups: tuple[float, float | None], accept: float | None, mean_acc: float | None) -> BenchRow:
    tokens, seconds = run[0], run[1]
    tps, decode_tps = _rates(kind, run)
    return BenchRow(prompt, config, len(tokens), seconds, tps, decode_tps, speedups[0], speedups[1],
                    accept, mean_acc, tokens == baseline_tokens)


def _identity_note(rows: list[BenchRow], main: LoadedModel) -> str | None:
    """Why a row of ours can differ from plain decoding: a verify and a one-token step may round
    differently, so a near-tie can flip a greedy token. Peers (transformers, llama.cpp, llama-server)
    are other programs altogether."""
    ours = [r for r in rows if not r.config.startswith(("hf ", "llama.cpp", "server "))]
    if all(r.identical for r in ours) or main.plan.dtype_name == "float32":
        return None
    ties = sum(1 for r in ours if r.divergence)
    wrong = sum(1 for r in ours if not r.identical and not r.divergence)
    return (f"note: {ties} row(s) left plain decoding at a near-tie (top-2 logits within {NEAR_TIE}: "
            f"{main.backend.tie_cause()}){'' if not wrong else f'; {wrong} elsewhere (NO)'}")


def ceiling(step_cost: Callable[[int], float] | None, max_tokens: int = 65) -> tuple[float, int] | None:
    """The fastest a reply could decode here against plain decoding if every token were known in
    advance (each step feeding n of them for the curve's price of n), and that n; None without
    a measured curve. No drafter can beat it: it is the machine's limit."""
    if step_cost is None:
        return None
    one = step_cost(1)
    return max(((n / (step_cost(n) / one), n) for n in range(1, max_tokens + 1)), key=lambda rn: rn[0])


def format_table(rows: list[BenchRow], limit: float | None = None) -> str:
    """The rows; with `limit` (ceiling's ratio) each row's decode rate as a share of it."""
    header = (f"{'prompt':<14} {'config':<40} {'tokens':>6} {'tok/s':>8} {'decode':>8} {'speedup':>8} "
              f"{'dec. x':>7} {'accept':>7} {'acc/step':>8}" + (f" {'limit':>6}" if limit else "") + "  identical")
    lines = [header, "-" * len(header)]
    for r in rows:
        accept = f"{100 * r.accept_rate:6.1f}%" if r.accept_rate is not None else f"{'-':>7}"
        mean = f"{r.mean_accepted:8.2f}" if r.mean_accepted is not None else f"{'-':>8}"
        decode = f"{r.decode_tps:8.2f}" if r.decode_tps else f"{'-':>8}"
        decode_x = f"{r.decode_speedup:6.2f}x" if r.decode_speedup else f"{'-':>7}"
        share = "" if not limit else f" {r.decode_speedup / limit:6.0%}" if r.decode_speedup else f" {'-':>6}"
        lines.append(f"{r.prompt:<14} {r.config[:40]:<40} {r.n_predicted:>6} {r.tokens_per_s:>8.2f} {decode} "
                     f"{r.speedup:>7.2f}x {decode_x} {accept} {mean}{share}  "
                     f"{'yes' if r.identical else r.divergence or 'NO'}")
    return "\n".join(lines)


def format_why(rows: list[BenchRow]) -> str:
    """`--explain`: each of our priced rows' sentence, under the prompt it ran on."""
    lines = ["why, row by row (the schedule's prices in the row's median run):"]
    for r in rows:
        if r.why:
            lines.append(f"  {r.prompt} / {r.config}: {r.why}")
    return "\n".join(lines) if len(lines) > 1 else "why: no row of ours priced its drafts (fixed lengths or none)"
