"""`specula calibrate MODEL`: measure again what llama.cpp's steps of 1-17 tokens cost here."""

from __future__ import annotations

import argparse
import sys

from app.cli.flags import add_backend_flags, backend_kwargs
from app.hub.builtin import resolve_model_arg


def register(sub) -> None:
    parser = sub.add_parser("calibrate", help="measure again what llama.cpp's steps of 1-17 tokens cost for a model here (the draft-length schedule's prior; cached)")
    parser.add_argument("model", help="GGUF file or built-in model name")
    add_backend_flags(parser)
    parser.set_defaults(func=cmd_calibrate)


def cmd_calibrate(args: argparse.Namespace) -> int:
    """llama.cpp's step costs (the draft-length schedule's prior) where it runs the model. The
    torch backend has nothing to calibrate: it runs as asked and its schedule measures as it goes."""
    from app.engine.backends.choose import choose_backend
    from app.engine.gguf.info import read_gguf_info

    path = resolve_model_arg(args.model)
    read_gguf_info(path)  # a bad file is one line at once, before any backend is asked
    chosen = choose_backend(args.backend, path, "cpu")
    if not chosen.is_llama_cpp:
        print(f"specula: nothing to calibrate on torch ({chosen.reason}): only llama.cpp's step costs are "
              f"measured ahead; torch's schedule measures its steps as it decodes", file=sys.stderr)
        return 2
    return _calibrate_llama_cpp(path, args)


def _calibrate_llama_cpp(path, args: argparse.Namespace) -> int:
    """Measure llama.cpp's steps of 1-17 tokens again (logits on every row, as a verify reads
    them) and cache them as the schedule's prior when the machine was steady."""
    from app.engine.backends.llamacpp import cost as llamacpp_cost, lib as llamacpp_lib
    from app.engine.backends.llamacpp.kv import LlamaWeights

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
