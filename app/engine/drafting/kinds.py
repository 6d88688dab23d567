"""The drafter kinds a user picks (the window's list, `--spec-type`, `--drafts`) and the parameters
of llama.cpp's n-gram types (ngram-mod, ngram-map-k, ngram-map-k4v): plain names and numbers, importable without torch (the CLI parses with them before
anything heavy loads; app.engine.drafting.factory builds the drafters)."""

from __future__ import annotations

from dataclasses import dataclass

LOOKUP = "lookup"
NONE = "none"
NGRAM_CACHE = "ngram-cache"
NGRAM_MOD = "ngram-mod"
NGRAM_MAP_K = "ngram-map-k"
NGRAM_MAP_K4V = "ngram-map-k4v"
LOOKUP_CACHE = f"{LOOKUP}+{NGRAM_CACHE}"  # the window's "prompt lookup + n-gram cache"
# The chat's default drafter (app.worker.requests.DEFAULT_DRAFTER says why), and Compare's first choice.
LEARNING = f"{LOOKUP}+{NGRAM_CACHE}+{NGRAM_MOD}"


@dataclass(frozen=True)
class NgramKind:
    """One model-free drafter kind, registered once: the engine's name, llama.cpp's --spec-type
    for it, what tables and the window call it, and whether it learns across requests."""

    name: str
    spec_type: str
    title: str
    learns: bool = False


# The registry, in the order a tie between matches goes (combined, the longest match drafts).
# A new kind is a line here and its drafter in app.engine.drafting.factory.
NGRAM_REGISTRY = (
    NgramKind(NGRAM_MOD, "ngram-mod", "ngram-mod (learns from every reply)", learns=True),
    NgramKind(NGRAM_MAP_K4V, "ngram-map-k4v", "ngram-map-k4v"),
    NgramKind(NGRAM_MAP_K, "ngram-map-k", "ngram-map-k"),
    NgramKind(LOOKUP, "ngram-simple", "prompt lookup"),
    NgramKind(NGRAM_CACHE, "ngram-cache", "n-gram cache", learns=True),
)
NGRAM_KINDS = tuple(k.name for k in NGRAM_REGISTRY)
SPEC_TYPE_OF = {k.name: k.spec_type for k in NGRAM_REGISTRY}  # engine kind -> llama.cpp's --spec-type
KIND_OF_SPEC_TYPE = {k.spec_type: k.name for k in NGRAM_REGISTRY}  # --spec-type -> engine kind


def kind_title(kind: str) -> str:
    """What a (combined) kind is called: "prompt lookup + n-gram cache"."""
    titles = {k.name: k.title for k in NGRAM_REGISTRY}
    return " + ".join(titles.get(part, part) for part in kind.split("+"))

from app.engine.seam import DEFAULT_DRAFT_MAX  # noqa: E402,F401 - defined beside the loop's seam, read from here too


@dataclass(frozen=True)
class ModParams:
    """`--spec-ngram-mod-*` (app.engine.drafting.ngram_mod): the pool's n-grams are n_match tokens
    long, a draft needs a chain of n_min known tokens and is at most n_max long. llama.cpp's
    n_min is 48 because it drafts the whole chain; ours drafts the length the measured schedule
    finds pays, so any chain after an exact 24-token match counts (a 32-token reply asked again
    drafted nothing at 48)."""

    n_match: int = 24
    n_min: int = 1
    n_max: int = 64


@dataclass(frozen=True)
class MapParams:
    """`--spec-ngram-map-k-*` and `--spec-ngram-map-k4v-*` (app.engine.drafting.ngram_map), llama.cpp's
    defaults (common/common.h): the key is the last size_n tokens, a draft at most the size_m that
    followed it, and k4v drafts a key seen at least min_hits times (ngram-map-k ignores min_hits)."""

    size_n: int = 12
    size_m: int = 48
    min_hits: int = 1
