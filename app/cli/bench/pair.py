"""`specula bench-pair`: one main model and one same-vocabulary draft (e.g. a layer draft from
`specula make-draft`) on llama.cpp, our loop beside llama-cpp-python's own.

Rows per prompt, greedy, the same file, prompt ids, thread count and clock (generated tokens
over wall time, prompt included, each run from a cold cache):
  (a) the binding's plain Llama.generate: the baseline of every ratio;
  (b) our loop without a draft;
  (c) our loop with the draft: the adaptive schedule (run's defaults), then fixed draft lengths;
  (d) the binding's own draft-model speculation, Llama(draft_model=...), with GreedyDraftModel
      drafting greedily from a second Llama of the draft file, as llama.cpp's speculative
      example drafts. llama.cpp's `llama-speculative` binary itself is not in the binding.
Acceptance is accepted over drafted tokens; "same" counts replies equal to (b) token for token,
and names where any other first left it: tie@i at a near-tie of the main model's logits (batch
and one-token rows round such ties apart in llama.cpp), NO@i elsewhere.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from app.cli.bench.common import PROMPTS, timed_reply
from app.hub.builtin import resolve_model_arg

PLAIN = "(b) ours, no draft"
BINDING_NOTE = ("(d) is llama-cpp-python's Llama(draft_model=...) with a greedy draft-model adapter; "
                "llama.cpp's own llama-speculative example is not exposed by the binding")


def register(sub) -> None:
    pair = sub.add_parser("bench-pair", help="a main model and its same-vocabulary draft: our loop vs llama-cpp-python's, tok/s and acceptance")
    pair.add_argument("-m", "--model", required=True, help="main model: a GGUF file or a built-in name")
    pair.add_argument("-md", "--model-draft", required=True, help="draft model of the same vocabulary (e.g. from `specula make-draft`)")
    pair.add_argument("-n", "--n-predict", type=int, default=96, help="tokens per reply (default 96)")
    pair.add_argument("-r", "--repeat", type=int, default=3, metavar="N", help="rounds; each row shows its median (default 3)")
    pair.add_argument("--prompts", default=",".join(PROMPTS), help=f"categories to run (default {','.join(PROMPTS)})")
    pair.add_argument("--draft-n", default="4", metavar="K,K", help="fixed draft lengths for rows (c) and (d) (default 4)")
    pair.add_argument("-t", "--threads", type=int, default=0, help="llama.cpp threads (default 0 = the physical cores, as our loader)")
    pair.add_argument("--no-binding", action="store_true", help="leave out rows (a) and (d) (ratios are then to (b))")
    pair.set_defaults(func=cmd_bench_pair)


@dataclass
class Row:
    name: str
    run: Callable[[list[int], int], tuple[list[int], float, int, int]]  # -> tokens, s, drafted, accepted
    tps: dict[str, list[float]] = field(default_factory=dict)  # per prompt, per round
    drafted: dict[str, int] = field(default_factory=dict)
    accepted: dict[str, int] = field(default_factory=dict)
    same: dict[str, int] = field(default_factory=dict)
    notes: dict[str, set[str]] = field(default_factory=dict)  # where a reply left (b)'s: "tie@17"


def cmd_bench_pair(args: argparse.Namespace) -> int:
    from app.engine.backends.llamacpp.kv import LlamaSettings
    from app.engine.pair_loader import PairSpec, load_draft_for
    from app.engine.loader import load_model
    from app.engine.loop.chat import render_prompt

    from app.compare.choices import parse_lengths

    lengths = list(parse_lengths(args.draft_n, "--draft-n", most=64)) or [4]
    names = [p.strip() for p in args.prompts.split(",") if p.strip()]
    unknown = [p for p in names if p not in PROMPTS]
    if unknown or not names:
        raise SystemExit(f"specula: error: unknown prompt category {unknown[0] if unknown else '(none)'!r} "
                         f"(known: {', '.join(PROMPTS)})")
    if args.n_predict < 1 or args.repeat < 1:
        raise SystemExit("specula: error: -n and -r must be at least 1")
    settings = LlamaSettings(threads=max(0, args.threads))
    main = load_model(resolve_model_arg(args.model), backend="llama.cpp", llama=settings)
    draft, check = load_draft_for(main, PairSpec(main.path, resolve_model_arg(args.model_draft), backend="llama.cpp",
                                             llama=settings))
    threads = settings.thread_count()
    ids = {p: render_prompt(main.tokenizer, [{"role": "user", "content": PROMPTS[p]}]) for p in names}
    n_ctx = max(len(v) for v in ids.values()) + args.n_predict + max(lengths + [16]) + 8
    rows = _rows(args, main, draft, check, lengths, threads, n_ctx)
    judge = _judge(main, n_ctx)
    for row in rows:  # warm-up: weights paged in, the kernels' first-call costs paid
        row.run(ids[names[0]], 8)
    for _ in range(args.repeat):
        for p in names:
            replies = {}
            for row in rows:
                tokens, seconds, drafted, accepted = row.run(ids[p], args.n_predict)
                replies[row.name] = tokens
                row.tps.setdefault(p, []).append(len(tokens) / seconds if seconds > 0 else 0.0)
                row.drafted[p] = row.drafted.get(p, 0) + drafted
                row.accepted[p] = row.accepted.get(p, 0) + accepted
            plain = replies[PLAIN]
            for row in rows:
                row.same[p] = row.same.get(p, 0) + int(replies[row.name] == plain)
                if replies[row.name] != plain:
                    row.notes.setdefault(p, set()).add(judge(ids[p], plain, replies[row.name]))
    _print(args, main, draft, rows, names, threads)
    return 0


def _judge(main: Any, n_ctx: int) -> Callable[[list[int], list[int], list[int]], str]:
    """Where a reply first left (b)'s, as "tie@i" when the main model's two best tokens there were
    within app.engine.loop.fidelity.NEAR_TIE (a batch row and a one-token row may round such a tie
    apart: see facts.md), "NO@i" anywhere else."""
    from app.engine.loop.fidelity import compare_to_plain

    kv = main.kv_model(n_ctx)

    def judge(ids: list[int], plain: list[int], other: list[int]) -> str:
        found = compare_to_plain(kv, ids, plain, other)
        return f"{'tie' if found.at_near_tie else 'NO'}@{found.index}"

    return judge


def _rows(args: argparse.Namespace, main: Any, draft: Any, check: Any, lengths: list[int], threads: int,
          n_ctx: int) -> list[Row]:
    from app.engine.drafting.drafters import NoDrafter
    from app.engine.drafting.factory import make_drafter
    from app.engine.loop.sampling import SamplingParams
    from app.engine.loop.speculative import DecodeSettings

    greedy = SamplingParams(temperature=0.0)
    drafter = make_drafter(main, draft=draft, draft_ctx=n_ctx, check=check)  # the pair checked once, above
    rows = []
    binding = None if args.no_binding else _Binding(main, draft, threads, n_ctx)
    if binding is not None:
        rows.append(Row("(a) llama.cpp generate", binding.plain))
    rows.append(Row(PLAIN, _ours(main, NoDrafter(), n_ctx, DecodeSettings(sampling=greedy))))
    rows.append(Row("(c) ours + draft, adaptive", _ours(main, drafter, n_ctx, DecodeSettings(sampling=greedy))))
    for k in lengths:
        fixed = DecodeSettings(sampling=greedy, draft_max=k, draft_p_min=0.0, adaptive_draft=False)
        rows.append(Row(f"(c) ours + draft, fixed {k}", _ours(main, drafter, n_ctx, fixed)))
    if binding is not None:
        for k in lengths:
            rows.append(Row(f"(d) llama.cpp + draft, {k}", binding.speculative(k)))
    return rows


def _ours(main: Any, drafter: Any, n_ctx: int, base: Any) -> Callable:
    from dataclasses import replace

    def run(ids: list[int], n: int) -> tuple[list[int], float, int, int]:
        cache = getattr(drafter, "draft", None)
        if cache is not None:
            cache.reset()  # cold, as every other row: the draft re-reads the prompt too
        tokens, elapsed, summary = timed_reply(main, drafter, ids, replace(base, max_new_tokens=n), n_ctx)
        return tokens, elapsed, summary.n_drafted, summary.n_accepted

    return run


class _Binding:
    """llama-cpp-python's Llama on the main file, plain and with draft_model= (GreedyDraftModel)."""

    def __init__(self, main: Any, draft: Any, threads: int, n_ctx: int) -> None:
        from llama_cpp import Llama

        self.common = dict(n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads, flash_attn=True, verbose=False)
        self.Llama = Llama
        self.main_path, self.draft_path = str(main.path), str(draft.path)
        eos = main.tokenizer.eos_token_id
        self.stop = {eos} if isinstance(eos, int) else set(eos or ())
        self.models: dict[int, Any] = {0: Llama(model_path=self.main_path, **self.common)}

    def plain(self, ids: list[int], n: int) -> tuple[list[int], float, int, int]:
        return self._generate(self.models[0], None, ids, n)

    def speculative(self, k: int) -> Callable:
        from app.cli.bench.pair_draft import GreedyDraftModel

        adapter = GreedyDraftModel(self.Llama(model_path=self.draft_path, **self.common), k)
        llm = self.Llama(model_path=self.main_path, draft_model=adapter, **self.common)
        self.models[k] = llm
        return lambda ids, n: self._generate(llm, adapter, ids, n)

    def _generate(self, llm: Any, adapter: Any, ids: list[int], n: int) -> tuple[list[int], float, int, int]:
        stop = self.stop | {llm.token_eos()}
        tokens: list[int] = []
        llm.reset()  # cold: the binding reuses whatever prefix its last call left in the cache
        if adapter is not None:
            adapter.start()
        started = time.monotonic()
        for token in llm.generate(ids, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0, reset=True):
            if token in stop:
                break
            tokens.append(int(token))
            if len(tokens) >= n:
                break
        elapsed = time.monotonic() - started
        drafted, accepted = adapter.counts() if adapter is not None else (0, 0)
        return tokens, elapsed, drafted, accepted


def _print(args: argparse.Namespace, main: Any, draft: Any, rows: list[Row], names: list[str], threads: int) -> None:
    kept = draft.info.metadata.get("specula.layer_draft.kept_layers")
    layers = f"{draft.info.n_layers} of {main.info.n_layers} layers" if kept is not None else f"{draft.info.n_layers} layers"
    base = rows[0]
    print(f"# main {main.path.name} ({main.info.n_layers} layers), draft {draft.path.name} ({layers}); "
          f"llama.cpp on CPU, {threads} threads; greedy, n={args.n_predict}, median of {args.repeat} round(s); "
          f"tok/s = generated tokens over wall time, prompt included; x = median of the rounds' ratios to {base.name[:3]}")
    print("# (c) adaptive: `specula run`'s defaults (draft max 16, p-min 0.75, the measured schedule); "
          "(c) fixed k and (d) k: k draft tokens every step (p-min 0)")
    if not args.no_binding:
        print(f"# {BINDING_NOTE}")
    print(f"{'prompt':<13} {'row':<30} {'tok/s':>7} {'x':>6} {'accept':>16} {'same as (b)':>11}")
    for p in names:
        for row in rows:
            print(f"{p:<13} {row.name:<30} {statistics.median(row.tps[p]):7.1f} "
                  f"{_ratio(row.tps[p], base.tps[p]):5.2f}x {_accept(row, row.drafted[p], row.accepted[p]):>16} "
                  f"{row.same[p]:>5}/{len(row.tps[p])} {' '.join(sorted(row.notes.get(p, ())))}".rstrip())
    print(f"{'all':<13} {'row':<30} {'':>7} {'x gm':>6} {'accept':>16} {'same as (b)':>11}")
    for row in rows:
        ratios = [_ratio(row.tps[p], base.tps[p]) for p in names]
        drafted, accepted = sum(row.drafted.values()), sum(row.accepted.values())
        same, total = sum(row.same.values()), sum(len(row.tps[p]) for p in names)
        print(f"{'':<13} {row.name:<30} {'':>7} {statistics.geometric_mean(ratios):5.2f}x "
              f"{_accept(row, drafted, accepted):>16} {same:>5}/{total}"
              + (" (others left it at a near-tie)" if same < total and all(
                  n.startswith("tie") for notes in row.notes.values() for n in notes) else ""))
    sys.stdout.flush()


def _ratio(values: list[float], baseline: list[float]) -> float:
    pairs = [v / b for v, b in zip(values, baseline) if b > 0]
    return statistics.median(pairs) if pairs else 0.0


def _accept(row: Row, drafted: int, accepted: int) -> str:
    if drafted:
        return f"{accepted}/{drafted} {100 * accepted / drafted:3.0f}%"
    return "none drafted" if row.name[:3] in ("(c)", "(d)") else "-"
