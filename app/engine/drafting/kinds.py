"""The drafter kinds a user picks (the window's list, `--spec-type`, `--drafts`) and ngram-mod's
parameters: plain names and numbers, importable without torch (the CLI parses with them before
anything heavy loads; app.engine.drafting.pair builds the drafters)."""

from __future__ import annotations

from dataclasses import dataclass

LOOKUP = "lookup"
NONE = "none"
NGRAM_CACHE = "ngram-cache"
NGRAM_MOD = "ngram-mod"
LOOKUP_CACHE = f"{LOOKUP}+{NGRAM_CACHE}"  # the window's "prompt lookup + n-gram cache"
NGRAM_KINDS = (NGRAM_MOD, LOOKUP, NGRAM_CACHE)  # in the order a tie between matches goes

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
