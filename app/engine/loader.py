"""GGUF file -> a model behind the seam (app.engine.seam), on the backend chosen for it.

The header is read and checked by our own reader first (app.engine.gguf.info: a whole GGUF whose
header agrees with its tensors), whatever runs the file: llama.cpp's GGUF reader has had
memory-safety bugs. Then app.engine.backends.choose picks llama.cpp (where it imports, passed its
self-test on this CPU and runs the device asked for) or torch, and the chosen backend loads the
file; with `auto`, a file llama.cpp refuses is tried on torch. Errors are one line naming the file.

The loaded model (app.engine.backends.base.LoadedModel) holds its backend: callers ask it, never
which one it is. This module imports neither torch nor transformers: a llama.cpp load (the
default) starts without them.
"""

from __future__ import annotations

import time
from pathlib import Path

from app.engine.backends import AUTO
from app.engine.backends.base import LoadedModel, LoadRequest, ProgressCallback
from app.engine.backends.choose import choose_backend, load_chosen
from app.engine.backends.llamacpp.kv import LlamaSettings
from app.engine.gguf.info import GGUFInfo, read_gguf_info
from app.engine.errors import Cancel


def load_model(
    path: str | Path,
    *,
    device: str = "auto",
    dtype: str = "auto",
    n_gpu_layers: int | None = None,
    progress: ProgressCallback | None = None,
    cancel: Cancel | None = None,
    backend: str = AUTO,
    llama: LlamaSettings = LlamaSettings(),
    info: GGUFInfo | None = None,
) -> LoadedModel:
    """Load a GGUF model for generation. Raises SpeculaError subclasses with one-line messages.
    backend: auto (llama.cpp where it runs here, else torch; app.engine.backends.choose),
    llama.cpp or torch; `llama` holds llama.cpp's run-time settings, dtype the torch backend's
    (app.engine.backends.torch.load.load_torch). Nothing here depends on the drafter: choosing
    one never changes how the main model runs. `info`: this file's header, already read (and
    so checked) by the caller."""
    path = Path(path)
    started = time.monotonic()
    if progress is not None:
        progress("reading header", 0.0)
    if info is None:
        info = read_gguf_info(path)  # checks the header against the tensors, for every backend
    chosen = choose_backend(backend, path, device, n_gpu_layers, dtype)
    request = LoadRequest(device=device, dtype=dtype, n_gpu_layers=n_gpu_layers, llama=llama, progress=progress,
                          cancel=cancel, started=started)
    return load_chosen(chosen, backend, path, info, request)


__all__ = ["Cancel", "LoadedModel", "ProgressCallback", "load_model"]
