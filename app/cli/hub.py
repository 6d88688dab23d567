"""`specula hub ...` (search, files, info, download, drafts, login) and `specula models`.

The hub layer (huggingface_hub) is imported inside each command, so other commands do not pay for
it; none of these commands imports torch.
"""

from __future__ import annotations

import argparse
import getpass
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.engine.gguf.format import format_bytes
from app.hub.fields import shown

if TYPE_CHECKING:
    from app.hub.progress import DownloadProgress


def register(sub) -> None:
    hub = sub.add_parser("hub", help="find and download GGUF models on Hugging Face")
    hub_sub = hub.add_subparsers(dest="hub_command", metavar="COMMAND", parser_class=type(hub), required=True)

    search = hub_sub.add_parser("search", help="search GGUF repositories")
    search.add_argument("query", help="text to search for, e.g. 'qwen2.5 7b'")
    search.add_argument("--sort", default="downloads", choices=["downloads", "likes", "recent"], help="order (default downloads)")
    search.add_argument("--limit", type=int, default=30, help="most results (default 30)")
    search.add_argument("--json", action="store_true", help="print JSON")
    search.set_defaults(func=cmd_search)

    files = hub_sub.add_parser("files", help="a repository's GGUF files by quantization")
    files.add_argument("repo", help="repository, e.g. bartowski/Llama-3.2-1B-Instruct-GGUF")
    files.add_argument("--json", action="store_true", help="print JSON")
    files.set_defaults(func=cmd_files)

    info = hub_sub.add_parser("info", help="header facts of a remote GGUF file (range reads, no download)")
    info.add_argument("repo", help="repository")
    info.add_argument("file", help="GGUF file in the repository")
    info.add_argument("--main", help="also check it as a draft for this main model (GGUF file or built-in name)")
    info.add_argument("-c", "--ctx-size", type=int, default=0, help="context for the memory estimate (default: min(model's, 4096))")
    info.add_argument("--json", action="store_true", help="print JSON")
    info.set_defaults(func=cmd_info)

    download = hub_sub.add_parser("download", help="download a GGUF file (resumes a partial one)")
    download.add_argument("repo", help="repository")
    download.add_argument("file", help="GGUF file (the first part of a split model downloads all parts)")
    download.add_argument("--dir", help="download into this folder instead of the Hugging Face cache")
    download.set_defaults(func=cmd_download)

    drafts = hub_sub.add_parser("drafts", help="compatible draft models for a main model, best first")
    drafts.add_argument("main", help="main model: GGUF file or built-in name")
    drafts.add_argument("--query", help="hub search for candidates (default: the main model's family)")
    drafts.add_argument("--no-hub", action="store_true", help="only look at local models")
    drafts.add_argument("--json", action="store_true", help="print JSON")
    drafts.set_defaults(func=cmd_drafts)

    login = hub_sub.add_parser("login", help="save a Hugging Face token (as `hf auth login` does)")
    login.add_argument("--token", help="the token (default: read it from the terminal or stdin)")
    login.set_defaults(func=cmd_login)

    models = sub.add_parser("models", help="the local library: HF cache, your folders, built-in models")
    models.add_argument("--dir", action="append", default=[], help="also list GGUF files under this folder (repeatable)")
    models.add_argument("--no-builtin", action="store_true", help="leave out the built-in demo models")
    models.add_argument("--json", action="store_true", help="print JSON")
    models.set_defaults(func=cmd_models)


def _print_json(data: Any) -> None:
    print(json.dumps(data, ensure_ascii=False, indent=2, default=str))


def _count(n: int) -> str:
    for div, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= div:
            return f"{n / div:.1f}{unit}"
    return str(n)


def cmd_search(args: argparse.Namespace) -> int:
    from app.hub.search import search_gguf

    results = search_gguf(args.query, sort=args.sort, limit=args.limit)
    if args.json:
        _print_json([r.to_dict() for r in results])
        return 0
    if not results:
        print(f"no GGUF repositories match {args.query!r}", file=sys.stderr)
        return 0
    names = [shown(r.repo_id) for r in results]  # a remote string, escapes escaped
    width = max(len(n) for n in names)
    print(f"{'repository':<{width}}  {'downloads':>9}  {'likes':>6}  updated     ")
    for r, name in zip(results, names):
        when = r.last_modified.date().isoformat() if r.last_modified else "-"
        gated = "  (gated)" if r.gated else ""
        print(f"{name:<{width}}  {_count(r.downloads):>9}  {_count(r.likes):>6}  {when}{gated}")
    return 0


def cmd_files(args: argparse.Namespace) -> int:
    from app.hub.repos import gguf_listing
    from app.hub.search import group_by_quant

    files, left_out = gguf_listing(args.repo)
    if left_out:
        print(f"specula: {left_out} file name(s) left out: a download would refuse them (a path outside the "
              f"repository)", file=sys.stderr)
    if args.json:
        _print_json([f.to_dict() for f in files])
        return 0
    if not files:
        print(f"{shown(args.repo)} has no GGUF model files", file=sys.stderr)
        return 0
    for quant, group in group_by_quant(files).items():
        for f in group:
            parts = f"  ({len(f.parts)} parts{'' if f.complete else ', some missing'})" if f.is_split else ""
            print(f"{shown(quant):<10} {format_bytes(f.size_bytes):>10}  {shown(f.filename)}{parts}")
    return 0


def _local_info(value: str):
    from app.engine.gguf.info import read_gguf_info
    from app.hub.builtin import resolve_model_arg

    return read_gguf_info(resolve_model_arg(value))


def cmd_info(args: argparse.Namespace) -> int:
    from app.engine.drafting.compat import check_draft
    from app.engine.gguf.format import format_info
    from app.hub.names import model_title
    from app.hub.search import fetch_remote_header, fits_this_machine

    header = fetch_remote_header(args.repo, args.file)
    info = header.info
    fit = fits_this_machine(info, n_ctx=args.ctx_size or None)
    compat = check_draft(_local_info(args.main), info) if args.main else None
    read = (f"read {format_bytes(header.bytes_transferred)} of {format_bytes(header.file.size)} "
            f"in {header.requests} range request{'s' if header.requests > 1 else ''}")
    if args.json:
        data = {"model": model_title(args.repo, args.file, info.file_type), "repo_id": args.repo, "filename": args.file, "file_size": header.file.size,
                "sha256": header.file.sha256, "bytes_transferred": header.bytes_transferred,
                "requests": header.requests, "info": info.to_dict(fit.dtype), "fit": fit.to_dict()}
        if compat is not None:
            data["draft_for_main"] = {"compatible": compat.compatible, "level": compat.level,
                                      "rule": compat.token.rule, "reason": compat.reason or compat.token.reason}
        _print_json(data)
        return 0
    facts = format_info(info, fit.dtype, model_title(args.repo, args.file, info.file_type))
    first = facts.splitlines()[0]
    width = len(first) - len(first.split(":", 1)[1].lstrip()) - 1  # format_info's label column
    print("\n".join(shown(line) for line in facts.splitlines()))  # header strings are remote text
    print(f"{'this machine:':<{width}} {fit.reason}")
    if compat is not None:
        verdict = (f"can draft for it, {compat.describe()}" if compat.compatible
                   else f"cannot draft for it: {compat.reason}")
        print(f"{'main model:':<{width}} {Path(args.main).name}: {verdict}")
    print(f"{'transfer:':<{width}} {read}")
    return 0


class _ProgressBar:
    """One line on stderr, redrawn in place: bar, percent, bytes, speed, time left."""

    def __init__(self) -> None:
        self.last: DownloadProgress | None = None
        self.tty = sys.stderr.isatty()
        self._printed = 0.0

    def __call__(self, p: DownloadProgress) -> None:
        self.last = p
        now = time.monotonic()
        if not self.tty and p.phase == "downloading" and now - self._printed < 2.0:
            return  # a log file gets a line every 2 s, not ten a second
        self._printed = now
        width = 24
        filled = int(width * p.fraction)
        eta = "--:--" if p.eta is None else time.strftime("%H:%M:%S" if p.eta >= 3600 else "%M:%S", time.gmtime(p.eta))
        part = f" part {p.part}/{p.n_parts}" if p.n_parts > 1 else ""
        line = (f"[{'#' * filled}{'.' * (width - filled)}] {100 * p.fraction:5.1f}% "
                f"{format_bytes(p.done)} / {format_bytes(p.total)}  {format_bytes(p.speed)}/s  "
                f"ETA {eta}  {p.phase}{part}")
        print(("\r" if self.tty else "") + line + ("" if self.tty else "\n"), end="", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.tty and self.last is not None:
            print(file=sys.stderr)


def cmd_download(args: argparse.Namespace) -> int:
    from app.hub.download import download_gguf

    bar = _ProgressBar()
    dest = Path(args.dir) if args.dir else None
    try:
        path = download_gguf(args.repo, args.file, dest, progress=bar)
    except KeyboardInterrupt:
        bar.close()
        kept = f"{format_bytes(bar.last.done)} of {format_bytes(bar.last.total)} kept; " if bar.last else ""
        again = f"specula hub download {args.repo} {args.file}" + (f" --dir {args.dir}" if args.dir else "")
        print(f"specula: download interrupted; {kept}run `{again}` to resume", file=sys.stderr)
        return 130
    except BaseException:
        bar.close()
        raise
    bar.close()
    print(path)
    return 0


def cmd_drafts(args: argparse.Namespace) -> int:
    from app.hub.search import suggest_drafts

    main = _local_info(args.main)
    found = suggest_drafts(main, search_hub=not args.no_hub, query=args.query)
    if args.json:
        _print_json([s.to_dict() for s in found])
        return 0
    if not found:
        print(f"no compatible draft found for {main.path.name}", file=sys.stderr)
        return 0
    for s in found:
        where = str(s.path) if s.path else f"specula hub download {s.repo_id} {s.filename}"
        level = "" if s.level == "token" else "  [text-level: other vocabulary, re-tokenized]"
        print(f"{s.ratio:6.1%} of the main's size  {format_bytes(s.size_bytes):>10}  {shown(s.name)}{level}\n"
              f"        {shown(where)}")
    return 0


def cmd_login(args: argparse.Namespace) -> int:
    from app.hub.token import save_token

    token = args.token
    if token is None:
        token = getpass.getpass("Hugging Face token: ") if sys.stdin.isatty() else sys.stdin.readline()
    verified = save_token(token)
    print("token saved" + ("" if verified else " (not verified: the hub could not be reached)"))
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    from app.hub.builtin import unassembled
    from app.hub.download import pending_downloads
    from app.hub.library import list_local_models

    folders = [Path(d) for d in args.dir]
    models = list_local_models(folders, include_builtin=not args.no_builtin)
    pending = pending_downloads(folders)
    unjoined = [] if args.no_builtin else unassembled()  # the 1.6 GB pair: joined when first used
    if args.json:
        _print_json({"models": [m.to_dict() for m in models],
                     "pending": [{"repo_id": p.repo_id, "filename": p.filename, "done": p.done,
                                  "total": p.total, "partial": str(p.partial)} for p in pending],
                     "unassembled": [m.key for m in unjoined]})
        return 0
    for m in models:
        facts = (f"{m.info.architecture}, {_count(m.info.n_params)} params, {m.info.file_type or '?'}"
                 if m.info else "")
        state = f"UNUSABLE: {m.error}" if m.error else facts
        print(f"{m.source:<8} {format_bytes(m.size_bytes):>10}  {shown(m.name)}  [{state}]")
        for copy in m.copies:  # the same file elsewhere: listed once, its place said
            print(f"{'':<8} {'':>10}  also here: {shown(str(copy.path))} (the same file)")
    for p in pending:
        print(f"partial  {format_bytes(p.done):>10}  {p.repo_id}/{p.filename} "
              f"({100 * p.done / max(p.total, 1):.0f}%): `specula hub download {p.repo_id} {p.filename}` resumes it")
    for m in unjoined:
        print(f"builtin  {format_bytes(m.joined.size):>10}  {m.title}  [installed in parts: "
              f"`specula run -m {m.key}` joins them once]")
    if not models and not pending and not unjoined:
        print("no local models", file=sys.stderr)
    return 0
