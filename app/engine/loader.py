"""GGUF file -> a model behind the seam (app.engine.seam), on the backend chosen for it.

The header is read and checked by our own reader first (app.engine.gguf.info: a whole GGUF whose
header agrees with its tensors), whatever runs the file: llama.cpp's GGUF reader has had
memory-safety bugs. Then app.engine.backends.choose picks llama.cpp (where it imports, passed its
self-test on this CPU and runs the device asked for) or torch, and the file loads there; with
`auto`, a file llama.cpp refuses is tried on torch. Errors are one line naming the file.

This module imports neither torch nor transformers: a llama.cpp load (the default) starts
without them (app.engine.backends.torch.load has the torch path).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from app.engine.backends import AUTO, LLAMA_CPP, TORCH
from app.engine.backends.llamacpp import load as llamacpp_load
from app.engine.backends.choose import choose_backend
from app.engine.backends.llamacpp.kv import LlamaSettings
from app.engine.errors import LoadCancelled, ModelFileError, SpeculaError
from app.engine.gguf.info import GGUFInfo, read_gguf_info

log = logging.getLogger(__name__)

ProgressCallback = Callable[[str, float], None]  # (what is happening, fraction done 0..1)
CancelCheck = Callable[[], bool]


@dataclass
class LoadedModel:
    path: Path
    info: GGUFInfo
    model: Any  # torch: the transformers model; llama.cpp: a LlamaWeights
    tokenizer: Any  # torch: transformers' tokenizer; llama.cpp: a LlamaTokenizer (the same calls)
    plan: Any  # torch: app.engine.backends.torch.device.DevicePlan; llama.cpp: llamacpp_load.LlamaPlan
    load_s: float
    rope_fix: str | None = None
    backend: str = TORCH
    backend_reason: str = ""  # why this backend, in one line

    @property
    def plan_reason(self) -> str:
        """Why the model runs as it does, for the window, inspect, run and bench."""
        if self.backend == LLAMA_CPP:
            return self.backend_reason
        return "as asked" if self.plan.gpu is None else "on the GPU"

    @property
    def name(self) -> str:
        return self.info.name or self.path.stem

    @property
    def weights_bytes(self) -> int:
        """What the weights hold once loaded, in this plan on this machine."""
        if self.backend == LLAMA_CPP:
            return llamacpp_load.weights_bytes(self.info)
        from app.engine.backends.torch.load import weights_bytes

        return weights_bytes(self.info, self.plan)

    @property
    def vocab_size(self) -> int:
        """Rows of the model's output layer: the ids a drafter may propose stay below it (read
        from the loaded model; the header's token count can be smaller than a padded head)."""
        if self.backend == LLAMA_CPP:
            return int(self.model.n_vocab)
        head = self.model.get_output_embeddings()
        return int(head.out_features if hasattr(head, "out_features") else head.weight.shape[0])

    def kv_model(self, n_ctx: int | None = None):
        """A fresh KV cache over this model (app.engine.seam.KVModelLike); n_ctx defaults to the
        model's context length (llama.cpp: its own default, 4096, where the model allows it)."""
        if self.backend == LLAMA_CPP:
            return llamacpp_load.new_context(self.model, self.info, n_ctx)
        from app.engine.backends.torch.kv import KVModel

        return KVModel(self.model, n_ctx or self.info.context_length or None)


def load_model(
    path: str | Path,
    *,
    device: str = "auto",
    dtype: str = "auto",
    n_gpu_layers: int | None = None,
    progress: ProgressCallback | None = None,
    cancel: CancelCheck | None = None,
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
    backend_reason = chosen.reason
    if chosen.is_llama_cpp:
        try:
            weights, tokenizer, plan, load_s = llamacpp_load.load_llamacpp(info, n_gpu_layers, llama, progress, cancel)
            return LoadedModel(path, info, weights, tokenizer, plan, load_s, backend=LLAMA_CPP,
                               backend_reason=chosen.reason)
        except ModelFileError as exc:
            from app.engine.backends.torch.load import torch_runs

            if backend != AUTO or not torch_runs(info):
                raise
            log.info("%s; trying torch", exc)
            return _torch_after_llama_cpp(exc, path, info, device=device, dtype=dtype, n_gpu_layers=n_gpu_layers,
                                          progress=progress, cancel=cancel, started=started)
    from app.engine.backends.torch.load import load_torch

    return load_torch(path, info, device=device, dtype=dtype, n_gpu_layers=n_gpu_layers, progress=progress,
                      cancel=cancel, backend_reason=backend_reason, started=started)


def _torch_after_llama_cpp(refused: ModelFileError, path: Path, info: GGUFInfo, **kwargs) -> LoadedModel:
    """auto's second try, where llama.cpp refused the file: torch, whose reason names llama.cpp's
    refusal; if torch fails too, one line with both causes."""
    from app.engine.backends.torch.load import load_torch

    # The torch load's own warnings are lines beside the one error where this second try fails
    # too: kept back during it, its outcome says it all.
    torch_log = logging.getLogger("app.engine.backends.torch.load")
    level = torch_log.level
    torch_log.setLevel(logging.ERROR)
    try:
        return load_torch(path, info, backend_reason=f"torch: {refused}", **kwargs)
    except LoadCancelled:
        raise
    except SpeculaError as exc:
        raise ModelFileError(f"{refused}; torch could not run it either: {_without_name(exc, path)}") from exc
    finally:
        torch_log.setLevel(level)


def _without_name(exc: BaseException, path: Path) -> str:
    return str(exc).removeprefix(f"{path.name}: ")


# The torch backend's helpers, still reached through this module by the CLI and the tests.
_TORCH_NAMES = {"check_supported", "supported_architectures", "check_memory", "estimate_load_bytes",
                "weights_bytes"}


def __getattr__(name: str):
    if name in _TORCH_NAMES:
        from app.engine.backends.torch import load as torch_load

        return getattr(torch_load, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["LoadedModel", "load_model"]
