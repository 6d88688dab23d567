"""The drafter factory (make_drafter): a main model's drafter, chosen the way a user chooses
it: a draft GGUF file, prompt lookup, the learned n-gram cache, a combination of these, or none. The draft's vocabulary is
checked on headers before it is loaded: the same vocabulary drafts token by token (ModelDrafter),
another one through text (TextDrafter)."""

from __future__ import annotations

from pathlib import Path

from app.engine.drafting.compat import DraftCheck, check_draft
from app.engine.drafting.drafters import Drafter, ModelDrafter, NoDrafter, PromptLookupDrafter
from app.engine.errors import IncompatibleDraftError
from app.engine.gguf.info import GGUFInfo, read_gguf_info
from app.engine.loader import LoadedModel, load_model
from app.engine.drafting.ngram_cache import N_MAX, NgramCache, vocab_key
from app.engine.drafting.ngram_drafters import CombinedDrafter, NgramCacheDrafter
from app.engine.drafting.ngram_map import NgramMapDrafter
from app.engine.drafting.ngram_mod import NgramModDrafter, NgramModPool
from app.engine.drafting.text_drafter import TextDrafter

# The kinds' names and the n-gram types' parameters live where the CLI can read them without torch.
from app.engine.drafting.kinds import (LOOKUP, LOOKUP_CACHE, NGRAM_CACHE, NGRAM_KINDS, NGRAM_MAP_K,  # noqa: F401
                                      NGRAM_MAP_K4V, NGRAM_MOD, NONE, MapParams, ModParams)


def kind_parts(kind: str) -> list[str]:
    """"lookup+ngram-cache" -> ["lookup", "ngram-cache"]; ValueError for an unknown part."""
    parts = [p for p in kind.split("+") if p and p != NONE]
    unknown = [p for p in parts if p not in NGRAM_KINDS]
    if unknown:
        raise ValueError(f"unknown drafter {unknown[0]!r}")
    return sorted(set(parts), key=NGRAM_KINDS.index)


def main_vocab_key(main: LoadedModel) -> str:
    """The key of the main model's vocabulary: what an n-gram cache file is named by."""
    return vocab_key(main.info.tokens(), main.info.vocab_type)


def cache_path(folder: str | Path, key: str) -> Path:
    """The file of the n-gram cache of vocabulary `key` in `folder`."""
    return Path(folder) / f"{key}.ngc"


def open_cache(main: LoadedModel, folder: str | Path | None) -> NgramCache:
    """The main vocabulary's n-gram cache saved in `folder` (empty when new or damaged); an
    in-memory one without a folder."""
    key = main_vocab_key(main)
    if folder is None:
        return NgramCache(key)
    return NgramCache.load(cache_path(folder, key), key, vocab_size=main.info.vocab_size)  # ids checked


def check_pair(main: GGUFInfo, draft: GGUFInfo) -> DraftCheck:
    """How the draft drafts (token- or text-level); raise IncompatibleDraftError (exit code 3 on
    the command line) naming the reason when it cannot."""
    result = check_draft(main, draft)
    if not result:
        error = IncompatibleDraftError(
            f"{draft.path.name} cannot draft for {main.path.name}: {result.reason}"
        )
        error.exit_code = 3  # type: ignore[attr-defined]
        raise error
    return result


def make_drafter(
    main: LoadedModel,
    kind: str = NONE,
    draft: LoadedModel | None = None,
    draft_ctx: int | None = None,
    cache: NgramCache | None = None,
    mod: ModParams = ModParams(),
    check: DraftCheck | None = None,
    map_k: MapParams = MapParams(),
    map_k4v: MapParams = MapParams(),
) -> Drafter:
    """kind: "none", or n-gram drafters joined by "+" ("lookup", "ngram-cache", "ngram-mod",
    "ngram-map-k", "ngram-map-k4v"); with `draft` (a loaded draft model) the n-gram drafters go
    first and the model drafts when none of them matches. "ngram-cache" uses `cache` (an
    in-memory one when None); mod, map_k and map_k4v are those types' parameters. `check`: the
    draft's check against the main model, where the caller made it (else it is made here)."""
    model = _model_drafter(main, draft, draft_ctx, check) if draft is not None else None
    kinds = kind_parts(kind)
    # Combined, lookup matches up to the cache's longest n-gram, so that "longest match first"
    # compares like with like (else the cache's 4-grams would always beat lookup's 3-grams).
    lookup_max = N_MAX if NGRAM_CACHE in kinds else 3
    params = {NGRAM_MOD: mod, NGRAM_MAP_K: map_k, NGRAM_MAP_K4V: map_k4v}
    parts = [_ngram_drafter(main, part, cache, params.get(part), lookup_max) for part in kinds]
    if not parts:
        return model or NoDrafter()
    if len(parts) == 1 and model is None:
        return parts[0]
    return CombinedDrafter(parts, model)


def _model_drafter(main: LoadedModel, draft: LoadedModel, draft_ctx: int | None,
                   check: DraftCheck | None) -> Drafter:
    vocab = main.vocab_size
    if (check or check_draft(main.info, draft.info)).text_level:
        return TextDrafter(draft.kv_model(draft_ctx), draft.tokenizer, main.tokenizer, vocab,
                           name=f"{draft.path.stem} (text-level)")
    return ModelDrafter(draft.kv_model(draft_ctx), vocab, name=draft.path.stem)


def _ngram_drafter(main: LoadedModel, part: str, cache: NgramCache | None,
                   params: ModParams | MapParams | None, lookup_max: int = 3) -> Drafter:
    if part == LOOKUP:
        return PromptLookupDrafter(ngram_max=lookup_max)
    if isinstance(params, ModParams):  # ngram-mod
        return NgramModDrafter(NgramModPool(params.n_match), params.n_min, params.n_max)
    if isinstance(params, MapParams):  # ngram-map-k, ngram-map-k4v
        return NgramMapDrafter(params, key_only=part == NGRAM_MAP_K)
    return NgramCacheDrafter(cache if cache is not None else open_cache(main, None))
