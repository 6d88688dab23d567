"""Engine calls made on the model host's thread: load a pair, build decode settings, probe devices.

torch and transformers are imported inside these functions, on the worker thread, so that the
window opens at once and the UI modules never import them.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from app.engine.errors import Cancel
from app.hub.display import display_name
from app.worker.requests import MODEL, NONE, PairChoice

log = logging.getLogger(__name__)

Progress = Callable[[str, float], None]


@dataclass
class LoadedPair:
    """A loaded main model, its KV cache (kept across turns) and its drafter."""

    main: Any  # app.engine.loader.LoadedModel
    kv: Any  # app.engine.backends.torch.kv.KVModel
    drafter: Any  # app.engine.drafting.drafters.Drafter
    spec: PairChoice
    draft: Any = None  # LoadedModel of the draft model, when there is one
    facts: dict[str, Any] = field(default_factory=dict)
    ngram_cache: Any = None  # app.engine.drafting.ngram_cache.NgramCache: every finished reply teaches it
    check: Any = None  # app.engine.drafting.compat.DraftCheck of the draft model, when there is one

    def new_drafter(self):
        """A fresh drafter of the window's choice (the engine's, from the loaded pair) that
        teaches the pair's n-gram cache every finished reply whatever drafts (it is warm the day
        it is chosen)."""
        from app.engine.drafting.ngram_drafters import learning_into
        from app.engine.pair_loader import LoadedPair as EnginePair

        engine = EnginePair(engine_spec(self.spec), self.main, self.draft, self.check, self.ngram_cache, drafter=None)
        return learning_into(engine.new_drafter(), self.ngram_cache)

    def reset_state(self) -> None:
        """After a failed generation the caches may hold anything: start them afresh (the
        n-gram cache learns only from finished generations, so it is kept)."""
        self.kv.reset()
        self.drafter = self.new_drafter()

    def save_cache(self) -> None:
        """Write what the n-gram cache learned to its file; a failed write is a warning (the
        cache stays in memory and is written after the next reply)."""
        if self.ngram_cache is None or not self.ngram_cache.dirty or not self.spec.ngram_dir:
            return
        from app.engine.drafting.factory import cache_path

        path = cache_path(self.spec.ngram_dir, self.ngram_cache.key)  # the file open_cache read
        try:
            self.ngram_cache.save(path)
        except OSError as exc:
            log.warning("the n-gram cache could not be saved to %s: %s", path, exc)


def engine_spec(spec: PairChoice):
    """The window's choice as the engine's app.engine.pair_loader.PairSpec."""
    from app.engine.pair_loader import PairSpec as EnginePairSpec

    model = spec.drafter == MODEL
    return EnginePairSpec(spec.main_path, spec.draft_path if model else None, ngram=NONE if model else spec.drafter,
                          dtype=spec.dtype, n_gpu_layers=spec.main_gpu_layers,
                          n_gpu_layers_draft=spec.draft_gpu_layers, backend=spec.backend)


def open_ngram_cache(main, spec: PairChoice):
    """The main vocabulary's n-gram cache from spec.ngram_dir (the window names it whatever the
    drafter), or None when nothing learns."""
    if not spec.learns and not spec.ngram_dir:
        return None
    from app.engine.drafting.ngram_cache import NgramCacheError
    from app.engine.drafting.factory import open_cache

    try:
        return open_cache(main, spec.ngram_dir)
    except NgramCacheError as exc:  # a file renamed by hand: the app still starts
        log.warning("%s; starting with an empty n-gram cache", exc)
        return open_cache(main, None)


def load_pair(spec: PairChoice, progress: Progress, cancel: Cancel) -> LoadedPair:
    """Load the main model (and the draft model, checked against it first) through the engine's
    one pair loader. Progress fractions cover the whole pair: the main model takes most of the
    bar when there is a draft model."""
    from app.engine.pair_loader import load_pair as load_engine_pair

    loaded = load_engine_pair(engine_spec(spec), progress, cancel, open_cache=lambda main: open_ngram_cache(main, spec))
    progress("ready", 1.0)
    pair = LoadedPair(main=loaded.main, kv=loaded.main.kv_model(), drafter=None, spec=spec, draft=loaded.draft,
                      ngram_cache=loaded.cache, check=loaded.check)
    pair.drafter = pair.new_drafter()
    pair.facts = pair_facts(pair)
    return pair


def drafter_only_change(old: PairChoice | None, new: PairChoice | None) -> bool:
    """True when `new` differs from the loaded `old` only in how it drafts (drafter, draft file,
    draft offload): the loaded main model can stay, as LM Studio loads a draft beside it."""
    if old is None or new is None or old == new or old.on_server or new.on_server:
        return False  # llama-server takes its draft at start: a change restarts it
    return replace(new, drafter=old.drafter, draft_path=old.draft_path, draft_gpu_layers=old.draft_gpu_layers) == old


def keeps_main(old: PairChoice | None, new: PairChoice | None) -> bool:
    """Whether `new` is had by changing only the drafter of the loaded pair `old`: no backend's
    settings depend on the drafter, so the main model stays as loaded."""
    return drafter_only_change(old, new)


def can_swap_drafter(pair: LoadedPair | None, spec: PairChoice) -> bool:
    return pair is not None and keeps_main(pair.spec, spec)


def swap_drafter(pair: LoadedPair, spec: PairChoice, progress: Progress, cancel: Cancel) -> LoadedPair:
    """The loaded main model and its KV cache with `spec`'s drafter: only a new draft model is
    loaded (none for lookup, the n-gram cache or plain decoding, which are instant). `pair` is
    left as it was, so a failed or cancelled draft load keeps it running."""
    from app.engine.pair_loader import load_draft_for, part_progress

    started = time.monotonic()
    draft = check = None
    if spec.drafter == MODEL:
        same = pair.spec.drafter == MODEL and (pair.spec.draft_path, pair.spec.draft_gpu_layers) == (
            spec.draft_path, spec.draft_gpu_layers)
        if same:
            draft, check = pair.draft, pair.check
        else:  # checked against the loaded main model's header first
            draft, check = load_draft_for(pair.main, engine_spec(spec), part_progress(progress, "draft model", 0.0, 1.0),
                                          cancel)
    progress("ready", 1.0)
    pair.save_cache()  # what the cache learned so far; the same cache object goes on learning
    cache = pair.ngram_cache if pair.ngram_cache is not None else open_ngram_cache(pair.main, spec)
    swapped = LoadedPair(main=pair.main, kv=pair.kv, drafter=None, spec=spec, draft=draft, ngram_cache=cache,
                         check=check)
    swapped.drafter = swapped.new_drafter()
    swapped.facts = {**pair_facts(swapped), "main_kept": True, "swap_s": time.monotonic() - started}
    return swapped


def pair_facts(pair: LoadedPair) -> dict[str, Any]:
    """What the window shows about a loaded pair (plain data for a signal)."""
    main, draft = pair.main, pair.draft
    main_weights = weights_facts(main)
    draft_weights = weights_facts(draft) if draft is not None else None
    memory = main_weights["bytes"] + (draft_weights["bytes"] if draft_weights is not None else 0)
    load_s = main.load_s + (draft.load_s if draft is not None else 0.0)
    return {
        "main_name": display_name(main.path, main.info.file_type),
        "main_path": str(main.path),
        "main_plan": main.plan.describe(),
        "main_plan_reason": main.plan_reason,
        "backend": main.backend.name,
        "backend_reason": main.backend.reason,
        "main_plain_tps": _plain_tps(main),
        "main_weights": main_weights,
        "draft_name": draft.name if draft is not None else None,
        "draft_path": str(draft.path) if draft is not None else None,
        "draft_plan": draft.plan.describe() if draft is not None else None,
        "draft_weights": draft_weights,
        "drafter": pair.spec.drafter,
        "drafter_name": pair.drafter.name,
        "draft_text_level": pair.drafter.text_level,
        "ngram_entries": len(pair.ngram_cache) if pair.ngram_cache is not None else None,
        "load_s": load_s,
        "memory_bytes": memory,
        "n_ctx": pair.kv.n_ctx,
        "chat_template": bool(main.info.has_chat_template),
        "rope_fix": main.rope_fix,
    }


def _plain_tps(main: Any) -> float | None:
    """Tokens per second of plain decoding as the one-token step measured at load has it (llama.cpp
    measures it; torch does not)."""
    step_s = main.backend.plain_step_s()
    return 1.0 / step_s if step_s is not None and step_s > 0 else None


def weights_facts(model: Any) -> dict[str, Any]:
    """How a loaded model (app.engine.loader.LoadedModel) holds its weights, for the offload
    control's estimate (app.ui.models.offload)."""
    plan = model.plan
    return {"path": str(model.path), "dtype": plan.dtype_name,
            "gpu_layers": plan.n_gpu_layers if plan.gpu is not None else 0, "bytes": model.weights_bytes}


def device_facts() -> dict[str, Any]:
    """Is there a GPU torch can use, its name and memory, and the dtype each device loads in.
    Where no GPU can be there (no GPU device node on Linux) torch is not imported: about a
    second of the window's start, before its first load."""
    from app.engine.backends.choose import gpu_possible, llama_cpp_problem

    facts: dict[str, Any] = {
        "gpu": None, "name": None, "total_bytes": None, "free_bytes": None, "reason": None,
        # Where llama.cpp runs (auto's choice) it keeps the file's own types ("gguf"); torch, the
        # fallback, dequantizes to float32 on the CPU.
        "cpu_dtype": "gguf" if llama_cpp_problem() is None else "float32", "gpu_dtype": None,
    }
    if not gpu_possible():
        facts["reason"] = "no GPU: this machine has no GPU device"
        return facts
    import torch

    from app.engine.backends.torch.device import auto_dtype, available_gpu

    gpu = available_gpu()
    facts.update(gpu=gpu, gpu_dtype=str(auto_dtype(gpu)).removeprefix("torch.") if gpu else None)
    if gpu == "cuda":
        facts["name"] = torch.cuda.get_device_name(0)
        free, total = torch.cuda.mem_get_info()
        facts.update(free_bytes=int(free), total_bytes=int(total))
    elif gpu == "mps":
        facts["name"] = "Apple GPU (MPS)"
    else:
        build = "a CPU-only build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
        facts["reason"] = f"no GPU: torch {torch.__version__} ({build}) sees none"
    return facts
