"""llama.cpp's speculative flags (`--spec-type` and friends) beside the older names the seeds and
many guides use (`--draft-max`, `--draft-min`, `--draft-p-min`, `--lookup`), which stay aliases.

Plain argparse and data only: `specula --help` must not import torch.
"""

from __future__ import annotations

import argparse
from dataclasses import astuple, dataclass

from app.engine.drafting.kinds import (DEFAULT_DRAFT_MAX, KIND_OF_SPEC_TYPE, NGRAM_KINDS, NGRAM_REGISTRY, MapParams,
                                      ModParams)
from app.engine.errors import SpeculaError
from app.engine.drafting.ngram_cache import not_a_cache_file
from app.hub.builtin import QWEN_DRAFT

MAP_TYPES = ("ngram-map-k", "ngram-map-k4v")
IMPLEMENTED = ("none", "draft-simple", *(k.spec_type for k in NGRAM_REGISTRY))
# llama.cpp's other types: named, so that asking for one is "not implemented", not "unknown".
NOT_IMPLEMENTED = ("draft-eagle3", "draft-mtp", "draft-dflash", "draft-dspark")
ENGINE_KIND = KIND_OF_SPEC_TYPE  # --spec-type name -> the engine's drafter kind (app.engine.drafting.kinds)
MOD_DEFAULTS = astuple(ModParams())  # the engine's own (n-match, n-min, n-max)
MAP_DEFAULTS = astuple(MapParams())  # llama.cpp's (size-n, size-m, min-hits) of both map types

SPEC_TYPE_HELP = (
    "comma-separated, combined as in llama.cpp: none, draft-simple (the -md model), ngram-simple "
    "(prompt lookup, as --lookup), ngram-mod (llama.cpp's: one hashed table of the "
    "--spec-ngram-mod-n-match-token n-grams of every prompt and reply, shared by all requests, "
    "drafting a chain of at least -n-min known tokens), ngram-map-k (llama.cpp's: what followed "
    "the last --spec-ngram-map-k-size-n tokens earlier in this context, no longer than that key's "
    "last draft had accepted), ngram-map-k4v (as ngram-map-k, only where one of up to 4 "
    "continuations seen is twice as frequent as the others together), ngram-cache (counts of what "
    "followed 2-4 tokens in earlier conversations, kept in --lookup-cache-dynamic FILE; llama.cpp's "
    "also reads a static cache). Combined, the longest n-gram match drafts (on a tie in the order "
    "ngram-mod, ngram-map-k4v, ngram-map-k, ngram-simple, ngram-cache) and the draft model only "
    "where no n-gram matches. Default: draft-simple with -md, else none"
)


class UsageError(SpeculaError):
    """Flags that do not go together: one line, exit 2, as argparse's own errors."""

    exit_code = 2


def spec_types(value: str, server: bool = False) -> tuple[str, ...]:
    """argparse type of --spec-type: known, implemented names, none alone; with `server` (run,
    which can run llama-server) every llama.cpp type."""
    names = tuple(dict.fromkeys(v.strip() for v in value.split(",") if v.strip()))
    if not names:
        raise argparse.ArgumentTypeError("needs a type, e.g. ngram-simple")
    for name in names:
        if name in NOT_IMPLEMENTED and not server:
            raise argparse.ArgumentTypeError(
                f"{name} is not implemented in specula's own loop (implemented: {', '.join(IMPLEMENTED)}); "
                f"`specula run --engine llama-server --spec-type {name}` runs it on llama.cpp's own server")
        if name not in IMPLEMENTED + NOT_IMPLEMENTED:
            raise argparse.ArgumentTypeError(f"unknown type {name!r} (known: {', '.join(IMPLEMENTED + NOT_IMPLEMENTED)})")
    if "none" in names and len(names) > 1:
        raise argparse.ArgumentTypeError("none cannot be combined with other types")
    return names


def spec_types_any(value: str) -> tuple[str, ...]:
    """argparse type of run's --spec-type: llama.cpp's types our loop lacks run on llama-server."""
    return spec_types(value, server=True)


def add_spec_flags(parser: argparse.ArgumentParser, server: bool = False) -> None:
    """The drafting flags of run, bench and serve; `server`: every llama.cpp type (run)."""
    parser.add_argument("-md", "--model-draft", "--spec-draft-model", dest="model_draft", metavar="FILE", help=f"draft model: a GGUF file or a built-in name (e.g. {QWEN_DRAFT}); the main model's vocabulary drafts token by token, another vocabulary through text (re-tokenized, each step costs more)")
    parser.add_argument("--spec-type", type=spec_types_any if server else spec_types, default=None, metavar="TYPE[,TYPE...]", help=SPEC_TYPE_HELP)
    parser.add_argument("--lookup", action="store_true", help="draft by prompt lookup (n-gram), no draft model: the older name of --spec-type ngram-simple")
    parser.add_argument("-cd", "--ctx-size-draft", type=int, default=0, help="context size of the draft model (0 = as the main)")
    parser.add_argument("-ngld", "--n-gpu-layers-draft", type=int, default=None, help="layers of the draft model on the GPU")
    parser.add_argument("--spec-draft-n-max", "--draft-max", "--draft", dest="draft_max", type=int, default=DEFAULT_DRAFT_MAX, metavar="N", help=f"most tokens drafted per step (default {DEFAULT_DRAFT_MAX}; llama.cpp's default is 3, drafted at every step; ours is the ceiling of a measured length, see --draft-fixed)")
    parser.add_argument("--spec-draft-n-min", "--draft-min", dest="draft_min", type=int, default=0, metavar="N", help="draft nothing when fewer than this would be drafted (default 0)")
    parser.add_argument("--spec-draft-p-min", "--draft-p-min", dest="draft_p_min", type=float, default=0.75, metavar="P", help="a draft model stops drafting when its top probability is below this (default 0.75; llama.cpp's default is 0)")
    parser.add_argument("--draft-fixed", action="store_true", help="always draft up to --spec-draft-n-max, as llama.cpp does (default: adapt the length to the measured acceptance and cost, the maximum as the ceiling)")
    add_ngram_flags(parser)


def add_ngram_flags(parser: argparse.ArgumentParser) -> None:
    n_match, n_min, n_max = MOD_DEFAULTS
    parser.add_argument("--spec-ngram-mod-n-match", type=int, default=n_match, metavar="N", help=f"ngram-mod: tokens an n-gram of its table matches (default {n_match}, as llama.cpp)")
    parser.add_argument("--spec-ngram-mod-n-min", type=int, default=n_min, metavar="N", help=f"ngram-mod: draft only where the table knows a chain of at least this many tokens (default {n_min}; llama.cpp's 48: it drafts the whole chain, ours the measured length)")
    parser.add_argument("--spec-ngram-mod-n-max", type=int, default=n_max, metavar="N", help=f"ngram-mod: the longest chain drafted, inside --spec-draft-n-max (default {n_max}, as llama.cpp)")
    size_n, size_m, min_hits = MAP_DEFAULTS
    for kind in MAP_TYPES:
        parser.add_argument(f"--spec-{kind}-size-n", type=int, default=size_n, metavar="N", help=f"{kind}: tokens of the key looked up (default {size_n}, as llama.cpp)")
        parser.add_argument(f"--spec-{kind}-size-m", type=int, default=size_m, metavar="N", help=f"{kind}: most tokens drafted after the key, inside --spec-draft-n-max (default {size_m}, as llama.cpp)")
        unused = " (unused by ngram-map-k, as in llama.cpp)" if kind == "ngram-map-k" else ""
        parser.add_argument(f"--spec-{kind}-min-hits", type=int, default=min_hits, metavar="N", help=f"{kind}: times the key must have been found before it drafts{unused} (default {min_hits})")
    parser.add_argument("-lcd", "--lookup-cache-dynamic", metavar="FILE", help="ngram-cache: the cache file to read and to update with what this run generates (default: a cache in memory, learning only within this process, e.g. across a server's requests; the window keeps one per vocabulary beside its chat history)")


@dataclass(frozen=True)
class SpecChoice:
    """What drafts, from the flags: the engine's n-gram kind and/or a draft model."""

    ngram: str = "none"  # app.engine.drafting.factory kind: "none", "lookup", "lookup+ngram-cache", ...
    draft_model: str | None = None
    cache_file: str | None = None
    mod: tuple[int, int, int] = MOD_DEFAULTS
    map_k: tuple[int, int, int] = MAP_DEFAULTS
    map_k4v: tuple[int, int, int] = MAP_DEFAULTS


def spec_choice(args: argparse.Namespace) -> SpecChoice:
    """The flags checked together; UsageError names the conflict."""
    types = tuple(getattr(args, "spec_type", None) or ()) + (("ngram-simple",) if getattr(args, "lookup", False) else ())
    draft_model = getattr(args, "model_draft", None)
    cache_file = getattr(args, "lookup_cache_dynamic", None)
    if "none" in types:
        if draft_model or len(types) > 1:
            raise UsageError("--spec-type none cannot be combined with -md or --lookup")
        types = ()
    if "draft-simple" in types and not draft_model:
        raise UsageError("--spec-type draft-simple needs a draft model (-md/--spec-draft-model FILE)")
    if cache_file and "ngram-cache" not in types:
        raise UsageError("--lookup-cache-dynamic is the file of --spec-type ngram-cache; add that type")
    why = not_a_cache_file(cache_file) if cache_file else None
    if why:  # a folder, /dev/zero, a FIFO: never read from nor replaced
        raise UsageError(f"--lookup-cache-dynamic: {why}")
    mod = tuple(getattr(args, f"spec_ngram_mod_{k}", d) for k, d in zip(("n_match", "n_min", "n_max"), MOD_DEFAULTS))
    if "ngram-mod" in types and (mod[0] < 1 or mod[1] < 0 or mod[2] < 1):
        raise UsageError("--spec-ngram-mod-n-match and -n-max must be at least 1, -n-min at least 0")
    maps = [_map_params(args, kind, kind in types) for kind in MAP_TYPES]
    kinds = {ENGINE_KIND[t] for t in types if t in ENGINE_KIND}
    # In the engine's tie order, whatever order they were given in.
    ngram = "+".join(k for k in NGRAM_KINDS if k in kinds) or "none"
    return SpecChoice(ngram, draft_model, cache_file, mod, *maps)  # type: ignore[arg-type]


def _map_params(args: argparse.Namespace, kind: str, used: bool) -> tuple[int, int, int]:
    """(size-n, size-m, min-hits) of an ngram-map type, checked to llama.cpp's bounds where used."""
    flag = kind.replace("-", "_")
    params = tuple(getattr(args, f"spec_{flag}_{k}", d) for k, d in zip(("size_n", "size_m", "min_hits"), MAP_DEFAULTS))
    if used and not (1 <= params[0] <= 1024 and 1 <= params[1] <= 1024 and params[2] >= 1):
        raise UsageError(f"--spec-{kind}-size-n and -size-m must be between 1 and 1024, -min-hits at least 1")
    return params  # type: ignore[return-value]
