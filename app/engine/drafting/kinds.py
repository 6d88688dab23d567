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


@dataclass(frozen=True)
class ModParams:
    """`--spec-ngram-mod-*`: our ngram-mod is prompt lookup on exactly the last n_match tokens,
    drafting n_min..n_max tokens (inside the loop's own draft ceiling). llama.cpp's defaults are
    24, 48 and 64."""

    n_match: int = 24
    n_min: int = 0
    n_max: int = 64
