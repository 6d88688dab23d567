"""The window's engine calls, made on the model host's thread: its Model tab's choice as the
engine's spec, opened once as a Session (this process, llama-server started here, or a server at
a URL: the host never asks which), the drafter swapped on a loaded main model, devices probed.

torch and transformers are imported inside these functions, on the worker thread, so that the
window opens at once and the UI modules never import them.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

from app.engine.errors import Cancel
from app.hub.display import display_name
from app.worker.requests import AT_URL, MODEL, NONE, PairChoice

log = logging.getLogger(__name__)

Progress = Callable[[str, float], None]


def engine_spec(spec: PairChoice):
    """The window's choice as the engine's spec: app.engine.pair_loader.PairSpec for Specula's
    own loop here, app.engine.session.ServerSpec for llama-server started here or a server at a
    URL (the key read from its store here, where it is sent: it never travels in a signal)."""
    from app.engine.pair_loader import PairSpec as EnginePairSpec

    if spec.on_server:
        return server_spec(spec)
    model = spec.drafter == MODEL
    return EnginePairSpec(spec.main_path, spec.draft_path if model else None, ngram=NONE if model else spec.drafter,
                          dtype=spec.dtype, n_gpu_layers=spec.main_gpu_layers,
                          n_gpu_layers_draft=spec.draft_gpu_layers, backend=spec.backend)


def server_spec(spec: PairChoice):
    from app.engine.errors import SpeculaError
    from app.engine.llama_server.keys import read_key
    from app.engine.llama_server.spec import ServerEngine, check_rpc_endpoints
    from app.engine.session import ServerSpec

    if spec.runs_on == AT_URL:
        key = read_key(spec.key_store, spec.server_url) if spec.key_store else None
        return ServerSpec(ServerEngine(url=spec.server_url, api_key=key))
    types = () if spec.spec_type == "none" else (spec.spec_type,)
    draft = Path(spec.draft_path) if spec.drafter == MODEL and spec.draft_path else None
    try:
        rpc = check_rpc_endpoints(spec.rpc) if spec.rpc.strip() else ()
    except ValueError as exc:
        raise SpeculaError(f"RPC workers: {exc}") from None
    # With workers every layer goes to them (llama.cpp's -ngl counts RPC devices as GPUs): the Model
    # tab's offload, 0 on a computer without a GPU, would keep the whole model here.
    layers = None if rpc else spec.main_gpu_layers
    return ServerSpec(ServerEngine(spec_types=types, draft=draft, rpc=rpc, n_gpu_layers=layers,
                                   n_gpu_layers_draft=spec.draft_gpu_layers if draft else None), Path(spec.main_path))


def open_pair(spec: PairChoice, progress: Progress, cancel: Cancel):
    """The engine the window's choice names, opened (app.engine.reply_engine.open_session): the pair
    loaded here (the main model checked against its draft first, the n-gram cache of the
    window's folder), llama-server started, or the server at the URL checked."""
    from app.engine.reply_engine import open_session

    return open_session(engine_spec(spec), progress, cancel, local_options(spec))


def local_options(spec: PairChoice):
    from app.engine.session import LocalOptions

    return LocalOptions(ngram_dir=spec.ngram_dir, learns=spec.learns)


def window_facts(session, spec: PairChoice):
    """The session's facts as the window names things: the choice's own main path (a URL as
    typed) and the drafter kind it picked, file titles from the hub's display names."""
    facts = session.describe()
    if spec.on_server:
        return replace(facts, main_path=spec.main_path, drafter=spec.drafter)
    return replace(facts, main_name=display_name(Path(facts.main_path), facts.file_type), drafter=spec.drafter)


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


def can_swap_drafter(session, spec: PairChoice, loaded: PairChoice | None) -> bool:
    return session is not None and keeps_main(loaded, spec)


def swap_drafter(session, spec: PairChoice, progress: Progress, cancel: Cancel):
    """The loaded main model and its KV cache with `spec`'s drafter (LocalSession.with_drafter):
    the session is left as it was, so a failed or cancelled draft load keeps it running."""
    return session.with_drafter(engine_spec(spec), progress, cancel, local_options(spec))


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
