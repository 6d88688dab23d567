"""Load a main model and its drafter in one place, as llama.cpp's common_speculative_init does:
check the pair on headers (before the main model's long load), load the main model, load the
draft, make the drafter. The command line, the window's model host and a comparison describe
what they want as a PairSpec, parsed once from their flags or widgets.

Each header is read once: the check's read is handed to the load, and the check's verdict
(token- or text-level) to the drafter."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from app.engine import loader
from app.engine.backends import AUTO
from app.engine.backends.llamacpp.kv import LlamaSettings
from app.engine.drafting.compat import DraftCheck
from app.engine.drafting.drafters import Drafter
from app.engine.drafting.kinds import NONE, MapParams, ModParams
from app.engine.drafting.ngram_cache import NgramCache
from app.engine.drafting.factory import check_pair, main_vocab_key, make_drafter
from app.engine.gguf.info import GGUFInfo, read_gguf_info
from app.engine.errors import Cancel

Progress = Callable[[str, float], None]  # (what is happening, fraction done 0..1)
OpenCache = Callable[[loader.LoadedModel], NgramCache | None]  # the main model -> its n-gram cache
MAIN_SHARE = 0.8  # of the progress bar, for the main model when a draft model follows


@dataclass(frozen=True)
class PairSpec:
    """What to load and how it drafts. ngram: n-gram drafters joined by "+" (app.engine.drafting
    .kinds), drafting first when there is also a draft model; gpu layers follow llama.cpp's -ngl
    (None: all on the GPU when there is one)."""

    main_path: str | Path
    draft_path: str | Path | None = None
    ngram: str = NONE
    mod: ModParams = ModParams()
    map_k: MapParams = MapParams()
    map_k4v: MapParams = MapParams()
    cache_file: str | Path | None = None  # -lcd: the n-gram cache file to read (its key checked)
    draft_ctx: int | None = None  # the draft model's context (None: its default)
    device: str = "auto"
    dtype: str = "auto"
    n_gpu_layers: int | None = None
    n_gpu_layers_draft: int | None = None
    backend: str = AUTO
    llama: LlamaSettings = LlamaSettings()


def ngram_params(spec: PairSpec) -> dict[str, ModParams | MapParams]:
    """The parameters of llama.cpp's n-gram types, as make_drafter takes them."""
    return {"mod": spec.mod, "map_k": spec.map_k, "map_k4v": spec.map_k4v}


@dataclass
class LoadedPair:
    """A loaded main model, its draft model (when the spec names one) with the check that said
    how it drafts, the n-gram cache and the drafter."""

    spec: PairSpec
    main: loader.LoadedModel
    draft: loader.LoadedModel | None
    check: DraftCheck | None
    cache: NgramCache | None
    drafter: Drafter

    def new_drafter(self, cache: NgramCache | None = None) -> Drafter:
        """A fresh drafter of the same choice (a draft model's cache starts empty); `cache`:
        another n-gram cache than the pair's."""
        return make_drafter(self.main, self.spec.ngram, self.draft, self.spec.draft_ctx,
                            cache if cache is not None else self.cache, check=self.check, **ngram_params(self.spec))


@dataclass(frozen=True)
class Headers:
    """The pair's headers, read once, and the draft's check against the main model."""

    main: GGUFInfo
    draft: GGUFInfo | None = None
    check: DraftCheck | None = None


def check_spec(spec: PairSpec) -> Headers:
    """Read the headers and check the draft against the main model: IncompatibleDraftError
    (exit code 3) in a fraction of a second, before anything loads."""
    main = read_gguf_info(spec.main_path)
    if spec.draft_path is None:
        return Headers(main)
    draft = read_gguf_info(spec.draft_path)
    return Headers(main, draft, check_pair(main, draft))


def load_main(spec: PairSpec, progress: Progress | None = None, cancel: Cancel | None = None,
              info: GGUFInfo | None = None) -> loader.LoadedModel:
    """The spec's main model; `info`: its header, already read."""
    return loader.load_model(spec.main_path, device=spec.device, dtype=spec.dtype, n_gpu_layers=spec.n_gpu_layers,
                             progress=progress, cancel=cancel, backend=spec.backend, llama=spec.llama, info=info)


def load_draft_for(main: loader.LoadedModel, spec: PairSpec, progress: Progress | None = None,
                   cancel: Cancel | None = None, headers: Headers | None = None,
                   ) -> tuple[loader.LoadedModel, DraftCheck]:
    """The spec's draft model beside the loaded `main`, checked against it first (unless
    `headers` carries the check), with that check."""
    if headers is None or headers.check is None:
        info = read_gguf_info(spec.draft_path)
        headers = Headers(main.info, info, check_pair(main.info, info))
    draft = loader.load_model(spec.draft_path, device=spec.device, dtype=spec.dtype,
                              n_gpu_layers=spec.n_gpu_layers_draft, progress=progress, cancel=cancel,
                              backend=spec.backend, llama=spec.llama, info=headers.draft)
    return draft, headers.check


def open_cache_file(spec: PairSpec, main: loader.LoadedModel) -> NgramCache | None:
    """The -lcd cache file of the spec, checked against the main vocabulary; None without one."""
    if spec.cache_file is None:
        return None
    return NgramCache.load(spec.cache_file, main_vocab_key(main), vocab_size=main.info.vocab_size)


def load_pair(spec: PairSpec, progress: Progress | None = None, cancel: Cancel | None = None,
              open_cache: OpenCache | None = None) -> LoadedPair:
    """Check, load the main model, load the draft, make the drafter. Progress fractions cover the
    whole pair ("main model: ..." then "draft model: ..."); `open_cache`: how the caller opens
    the n-gram cache (default: the spec's cache file)."""
    headers = check_spec(spec)
    share = MAIN_SHARE if spec.draft_path is not None else 1.0
    main = load_main(spec, part_progress(progress, "main model", 0.0, share), cancel, headers.main)
    draft = check = None
    if spec.draft_path is not None:
        draft, check = load_draft_for(main, spec, part_progress(progress, "draft model", share, 1.0), cancel, headers)
    cache = open_cache(main) if open_cache is not None else open_cache_file(spec, main)
    drafter = make_drafter(main, spec.ngram, draft, spec.draft_ctx, cache, check=check, **ngram_params(spec))
    return LoadedPair(spec, main, draft, check, cache, drafter)


def part_progress(progress: Progress | None, role: str, start: float, end: float) -> Progress | None:
    """`progress` for one model of the pair: its stages named by role, its fractions in start..end."""
    if progress is None:
        return None
    return lambda stage, fraction: progress(f"{role}: {stage}", start + fraction * (end - start))
