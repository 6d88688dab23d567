"""`specula make-draft MODEL`: a self-speculative draft, the model with some of its layers left
out (app.engine.gguf.layer_draft), for `-md`; `specula bench-pair` (app.cli.bench.pair) measures
such a pair.

The draft goes to Specula's cache folder (~/.cache/specula/drafts, XDG_CACHE_HOME honoured)
unless -o says otherwise: the main model often sits where writing is wrong or impossible (a
Hugging Face cache snapshot, whose files are links into its blob store; a Python package's
folder; a read-only share), and a draft is derived data that make-draft writes again in seconds.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from app.hub.builtin import BUILTIN_NAMES, cache_dir, resolve_model_arg


def register(sub) -> None:
    make = sub.add_parser("make-draft", help="write a draft model made of some of a model's own layers (self-speculative decoding)")
    make.add_argument("model", help=f"main model: a GGUF file or a built-in name ({BUILTIN_NAMES})")
    make.add_argument("--keep", metavar="SPEC", help="layers to keep, e.g. 0-5,10,28-29 (default: 5 in 6 of them: the first three, the last, any global-attention layers, the rest spread evenly; measured: with fewer, drafts of these small models were rarely accepted)")
    make.add_argument("-o", "--output", metavar="OUT.gguf", help=f"where to write it (default: {drafts_dir()}/<model>.layers-<kept>.gguf)")
    make.set_defaults(func=cmd_make_draft)


def drafts_dir() -> Path:
    return cache_dir() / "drafts"


def cmd_make_draft(args: argparse.Namespace) -> int:
    from app.common.atomic import private_dir
    from app.engine.gguf.info import read_gguf_info
    from app.engine.gguf.layer_draft import (default_layers, default_output, full_attention_layers, parse_layers,
                                        write_layer_draft)

    main_path = resolve_model_arg(args.model)
    info = read_gguf_info(main_path)
    if args.keep is not None:
        kept = parse_layers(args.keep, info.n_layers)
    else:
        kept = default_layers(info.n_layers, always=full_attention_layers(info))
    if args.output:
        out = Path(args.output).expanduser()
    else:
        out = default_output(main_path, kept, private_dir(drafts_dir()))
    draft = write_layer_draft(main_path, kept, out)
    print(f"wrote {draft.path}: {draft.describe()} of {main_path.name}")
    print(f"use it: specula run -m {args.model} -md {draft.path} -p ...  (or specula bench-pair -m {args.model} -md {draft.path})")
    return 0
