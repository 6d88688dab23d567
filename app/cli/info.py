"""`specula inspect FILE` and `specula check-pair MAIN DRAFT`: header facts, no weights loaded."""

from __future__ import annotations

import argparse
import json
import sys

from app.engine.drafting.compat import check_draft
from app.engine.gguf.format import format_info
from app.engine.gguf.info import read_gguf_info
from app.hub.builtin import resolve_model_arg
from app.hub.display import display_name


def register(sub) -> None:
    inspect = sub.add_parser("inspect", help="show a GGUF file's header facts and memory needs")
    inspect.add_argument("file", help="GGUF file or built-in model name")
    inspect.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"], help="dtype for the memory estimate (default bfloat16)")
    inspect.add_argument("--json", action="store_true", help="print JSON")
    inspect.set_defaults(func=cmd_inspect)

    pair = sub.add_parser("check-pair", help="can DRAFT draft for MAIN, token-level (same vocabulary) or text-level (re-tokenized)? exit 0 yes, 3 no (reason on stderr)")
    pair.add_argument("main", help="main model GGUF")
    pair.add_argument("draft", help="draft model GGUF")
    pair.set_defaults(func=cmd_check_pair)


def cmd_inspect(args: argparse.Namespace) -> int:
    """Header facts and memory needs: a header read, nothing loaded or measured (llama.cpp runs
    the file's own types)."""
    info = read_gguf_info(resolve_model_arg(args.file))
    title = display_name(info.path, info.file_type)  # the window's name for it
    if args.json:
        print(json.dumps({"model": title, **info.to_dict(args.dtype)}, ensure_ascii=False, indent=2))
    else:
        print(format_info(info, args.dtype, title))
    return 0


def cmd_check_pair(args: argparse.Namespace) -> int:
    main = read_gguf_info(resolve_model_arg(args.main))
    draft = read_gguf_info(resolve_model_arg(args.draft))
    result = check_draft(main, draft)
    if result:
        why_not_token = f"; token-level fails: {result.token.reason}" if result.text_level else ""
        print(f"compatible: {draft.path.name} can draft for {main.path.name} ({result.describe()}{why_not_token})")
        return 0
    print(f"specula: incompatible ({result.token.rule}): {result.reason}", file=sys.stderr)
    return 3
