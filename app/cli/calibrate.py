"""`specula calibrate MODEL`: measure the CPU plans for a model's shape again and show the choice."""

from __future__ import annotations

import argparse
import sys

from app.hub.builtin import resolve_model_arg


def register(sub) -> None:
    parser = sub.add_parser("calibrate", help="measure which CPU plan (float32, bf16, bf16 + int4 weights) runs a model fastest here; cached, used by --dtype auto")
    parser.add_argument("model", help="GGUF file or built-in model name")
    parser.add_argument("--no-int4", action="store_true", help="leave the int4-weights plan out")
    parser.set_defaults(func=cmd_calibrate)


def cmd_calibrate(args: argparse.Namespace) -> int:
    from app.engine.cpu import plan as cpu_plan
    from app.engine.cpu import probe
    from app.engine.fastload import can_fast_load
    from app.engine.gguf_info import read_gguf_info
    from app.engine.loader import check_supported, choose_cpu_plan

    info = read_gguf_info(resolve_model_arg(args.model))
    check_supported(info)
    if not can_fast_load(info):
        print(f"specula: {info.architecture} models run in float32 on the CPU: no plan to measure", file=sys.stderr)
        return 0
    probe.forget()  # the kernel probes too (which matrices load as bf16 rows is part of the plan's key)
    choice = choose_cpu_plan(info, "none", int4=not args.no_int4, recalibrate=True)
    print(format_curves(choice.curves))
    for drafter in cpu_plan.EXPECTED_ACCEPTANCE:
        picked = cpu_plan.choose(choice.curves, drafter)
        print(f"with drafter {drafter:6s}: {picked.option.name:16s} ({picked.reason})")
    from app.engine.loader import cpu_plan_options

    if cpu_plan.cached_curves(info, cpu_plan_options(info, not args.no_int4)) == choice.curves:
        print(f"cached in {cpu_plan.cache_file()} for {cpu_plan.machine_key()}")
    else:
        print("not kept: repeated runs disagreed (another program was busy on the CPU); run it again when the machine is idle")
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
