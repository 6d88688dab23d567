"""`specula calibrate MODEL`: measure the CPU plans for a model's shape again and show the choice."""

from __future__ import annotations

import argparse
import sys

from app.cli import add_backend_flags, backend_kwargs, bench_llamacpp
from app.hub.builtin import resolve_model_arg


def register(sub) -> None:
    parser = sub.add_parser("calibrate", help="measure which CPU plan (float32, bf16, bf16 + int4 weights) runs a model fastest here; cached, used by --dtype auto")
    parser.add_argument("model", help="GGUF file or built-in model name")
    parser.add_argument("--no-int4", action="store_true", help="leave the int4-weights plan out")
    parser.add_argument("--llama-cpp", action="store_true",
                        help="also time llama.cpp's steps on the same file and threads, as a last row (needs llama-cpp-python, which packaging/bootstrap.py installs)")
    add_backend_flags(parser)
    parser.set_defaults(func=cmd_calibrate)


def cmd_calibrate(args: argparse.Namespace) -> int:
    """llama.cpp's step costs (the draft-length schedule's prior) where it runs the model, else
    the torch backend's CPU plans."""
    from app.engine.backends.choose import choose_backend

    path = resolve_model_arg(args.model)
    if choose_backend(args.backend, path, "cpu").is_llama_cpp and not args.llama_cpp:
        return _calibrate_llama_cpp(path, args)
    return _calibrate_torch(args)


def _calibrate_llama_cpp(path, args: argparse.Namespace) -> int:
    """Measure llama.cpp's steps of 1-17 tokens again (logits on every row, as a verify reads
    them) and cache them as the schedule's prior when the machine was steady."""
    from app.engine.backends import llamacpp_cost, llamacpp_lib
    from app.engine.backends.llamacpp import LlamaWeights
    from app.engine.gguf_info import read_gguf_info

    read_gguf_info(path)  # our header checks before llama.cpp reads the file
    settings = backend_kwargs(args)["llama"]
    weights = LlamaWeights(path, 0, settings)
    curve, steady = llamacpp_cost.measure(weights)
    print(f"llama.cpp on CPU, {settings.thread_count()} threads: a step feeding n tokens (logits for all n)")
    print(f"{'tokens':>6} {'ms':>9} {'x one':>7}")
    for n, seconds in curve.points.items():
        print(f"{n:>6} {seconds * 1000:>9.2f} {curve.ratio(n):>6.2f}x")
    if steady:
        llamacpp_cost.store(weights, llamacpp_lib.build_key(), curve)
        print(f"cached in {llamacpp_cost.cache_file()}: the draft-length schedule starts from it")
        return 0
    print("not kept: repeated runs disagreed (another program was busy on the CPU); run it again when the machine is idle")
    return 0


def _calibrate_torch(args: argparse.Namespace) -> int:
    from app.engine.cpu import plan as cpu_plan
    from app.engine.cpu import probe
    from app.engine.fastload import can_fast_load
    from app.engine.gguf_info import read_gguf_info
    from app.engine.loader import check_supported, choose_cpu_plan

    if args.llama_cpp and not bench_llamacpp.available():
        print(f"specula: {bench_llamacpp.INSTALL_HINT}", file=sys.stderr)
        return 2
    info = read_gguf_info(resolve_model_arg(args.model))
    check_supported(info)
    if not can_fast_load(info):
        print(f"specula: {info.architecture} models run in float32 on the CPU: no plan to measure", file=sys.stderr)
        return 0
    probe.forget()  # the kernel probes too (which matrices load as bf16 rows is part of the plan's key)
    choice = choose_cpu_plan(info, "none", int4=not args.no_int4, recalibrate=True)
    curves, failed = dict(choice.curves), None
    if args.llama_cpp:
        try:
            curves["llama.cpp"] = _llama_cpp_curve(info.path)
        except bench_llamacpp.LOAD_ERRORS as exc:
            failed = f"specula: llama.cpp could not run {info.path.name}: {exc}"
    print(format_curves(curves))
    for drafter in cpu_plan.EXPECTED_ACCEPTANCE:
        picked = cpu_plan.choose(choice.curves, drafter)
        print(f"with drafter {drafter:6s}: {picked.option.name:16s} ({picked.reason})")
    if "llama.cpp" in curves:
        print(steepness(curves))
    from app.engine.loader import cpu_plan_options

    if cpu_plan.cached_curves(info, cpu_plan_options(info, not args.no_int4)) == choice.curves:
        print(f"cached in {cpu_plan.cache_file()} for {cpu_plan.machine_key()}")
    else:
        print("not kept: repeated runs disagreed (another program was busy on the CPU); run it again when the machine is idle")
    if failed:
        print(failed, file=sys.stderr)
        return 1
    return 0


def format_curves(curves: dict) -> str:
    """One row per plan: a step's milliseconds feeding each of plan.MEASURED_TOKENS, and plain tok/s."""
    from app.engine.cpu.plan import MEASURED_TOKENS

    labels = ["1 token" if n == 1 else f"{n - 1} draft{'s' if n > 2 else ''}" for n in MEASURED_TOKENS]
    head = "plan             " + "".join(f"{label:>11s}" for label in labels) + "   plain tok/s"
    rows = [head]
    for name, curve in curves.items():
        cells = "".join(f"{s * 1000:9.1f}ms" for s in curve.seconds)
        rows.append(f"{name:17s}{cells}   {1 / curve.cost(1):11.1f}")
    return "\n".join(rows)


def _llama_cpp_curve(path):
    """llama.cpp's steps at MEASURED_TOKENS, timed as our plans' are (bench_llamacpp.step_curve)."""
    import torch

    from app.engine.cpu import calibrate
    from app.engine.cpu.plan import MEASURED_TOKENS, CostCurve

    return CostCurve(bench_llamacpp.step_curve(path, torch.get_num_threads(), MEASURED_TOKENS,
                                               calibrate.CONTEXT, calibrate.STEP_REPEATS))


def steepness(curves: dict) -> str:
    """What a step feeding the longest draft one block of the int4 kernel's rows holds costs
    against a one-token step, in each plan whose verifies were timed and in llama.cpp: drafting's
    speed-up over plain decoding shrinks as that grows, whatever the one-token step costs."""
    from app.engine.cpu.plan import MEASURED_TOKENS

    n = MEASURED_TOKENS[-2]
    timed = {name: c for name, c in curves.items() if len(c.seconds) == len(MEASURED_TOKENS)}
    ratios = ", ".join(f"{name} {c.cost(n) / c.cost(1):.2f}x" for name, c in timed.items())
    return f"a step feeding {n} tokens against a one-token step: {ratios}"
