"""Which backend runs a model: llama.cpp wherever it imports, passed its probe on this CPU and
runs the device asked for; torch otherwise, with the reason in one line (said once). The choice
loads the model (BackendChoice.load, load_chosen): a backend's modules are imported only when it
is chosen, so a llama.cpp load never imports torch."""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from app.engine.backends import AUTO, LLAMA_CPP, TORCH, BACKEND_CHOICES
from app.engine.backends.base import LoadedModel, LoadRequest
from app.engine.backends.llamacpp import lib as llamacpp_lib, probe as llamacpp_probe
from app.engine.backends.llamacpp.lib import BackendUnavailable
from app.engine.errors import LoadCancelled, ModelFileError, SpeculaError
from app.engine.gguf.info import GGUFInfo

log = logging.getLogger(__name__)
_said: set[str] = set()


@dataclass(frozen=True)
class BackendChoice:
    name: str  # LLAMA_CPP or TORCH
    reason: str  # one line, for the window, inspect and run

    @property
    def is_llama_cpp(self) -> bool:
        return self.name == LLAMA_CPP

    def load(self, path: Path, info: GGUFInfo, request: LoadRequest) -> LoadedModel:
        """This backend loads a checked header's file; raises one-line SpeculaErrors."""
        if self.is_llama_cpp:
            from app.engine.backends.llamacpp.backend import load_model
        else:
            from app.engine.backends.torch.backend import load_model
        return load_model(path, info, request, self.reason)


def load_chosen(chosen: BackendChoice, requested: str, path: Path, info: GGUFInfo,
                request: LoadRequest) -> LoadedModel:
    """Load on the chosen backend; with `requested` auto, a file llama.cpp refuses is tried on
    torch (where torch is installed and transformers knows its architecture)."""
    try:
        return chosen.load(path, info, request)
    except ModelFileError as exc:
        if requested != AUTO or not chosen.is_llama_cpp or not torch_installed() or not _torch_runs(info):
            raise
        log.info("%s; trying torch", exc)
        return _torch_after_llama_cpp(exc, path, info, request)


def _torch_runs(info: GGUFInfo) -> bool:
    from app.engine.backends.torch.load import torch_runs

    return torch_runs(info)


def _torch_after_llama_cpp(refused: ModelFileError, path: Path, info: GGUFInfo, request: LoadRequest) -> LoadedModel:
    """auto's second try, where llama.cpp refused the file: torch, whose reason names llama.cpp's
    refusal; if torch fails too, one line with both causes."""
    # The torch load's own warnings are lines beside the one error where this second try fails
    # too: kept back during it, its outcome says it all.
    torch_log = logging.getLogger("app.engine.backends.torch.load")
    level = torch_log.level
    torch_log.setLevel(logging.ERROR)
    try:
        return BackendChoice(TORCH, f"torch: {refused}").load(path, info, request)
    except LoadCancelled:
        raise
    except SpeculaError as exc:
        cause = str(exc).removeprefix(f"{path.name}: ")
        raise ModelFileError(f"{refused}; torch could not run it either: {cause}") from exc
    finally:
        torch_log.setLevel(level)


def llama_cpp_problem(model_path: str | Path | None = None) -> str | None:
    """None where llama.cpp can run here; else why not, in one line."""
    problem = llamacpp_lib.import_problem()
    if problem is not None:
        return problem
    ok, why = llamacpp_probe.probe(model_path)  # before the first load: it picks the CPU backend
    if not ok:
        return why
    try:
        llamacpp_lib.binding()
    except BackendUnavailable as exc:
        return str(exc)
    return None


def choose_backend(requested: str, model_path: str | Path | None = None, device: str = "auto",
                   n_gpu_layers: int | None = None, dtype: str = "auto") -> BackendChoice:
    """The backend for a load. `requested`: auto, llama.cpp or torch (--backend); auto takes
    SPECULA_BACKEND's value where that is set (how CI runs the suite on either backend).
    llama.cpp runs the file's own tensor types, so auto with a dtype asked for means torch."""
    if requested == AUTO:
        requested = os.environ.get("SPECULA_BACKEND", AUTO) or AUTO
    if requested not in BACKEND_CHOICES:
        raise BackendUnavailable(f"unknown backend {requested!r} (choose from {', '.join(BACKEND_CHOICES)})")
    if requested == TORCH:
        return _torch("torch, as asked")
    if requested == LLAMA_CPP:
        problem = llama_cpp_problem(model_path)
        if problem is not None:
            raise BackendUnavailable(problem)
        return BackendChoice(LLAMA_CPP, "llama.cpp, as asked")
    if dtype != AUTO:
        return _torch(f"torch: --dtype {dtype} asked for (llama.cpp runs the file's own types)")
    problem = llama_cpp_problem(model_path)
    if problem is not None:
        return _fallback(f"torch: {problem}")
    wants_gpu = device in ("cuda", "mps") or (device == AUTO and (n_gpu_layers is None or n_gpu_layers != 0))
    torch_gpu = _torch_gpu() if wants_gpu and not llamacpp_lib.has_gpu() else None
    if torch_gpu is not None:
        return _fallback(f"torch on the {torch_gpu.upper()} GPU: this llama.cpp build runs on the CPU only")
    if device in ("cuda", "mps") and not llamacpp_lib.has_gpu():
        return _torch(f"torch: this llama.cpp build has no {device.upper()} support")
    return BackendChoice(LLAMA_CPP, "llama.cpp" + (" (GPU offload)" if llamacpp_lib.has_gpu() else " on the CPU"))


def torch_installed() -> bool:
    """Whether torch can be imported here, asked without importing it: the bundled app leaves
    torch out (its llama.cpp has a CPU backend for every x86-64 class)."""
    return importlib.util.find_spec("torch") is not None


def _torch(reason: str) -> BackendChoice:
    if not torch_installed():
        raise BackendUnavailable(f"{reason}, but torch is not installed here (pip install torch adds it)")
    return BackendChoice(TORCH, reason)


def _fallback(reason: str) -> BackendChoice:
    _torch(reason)  # a clear line where there is no torch to fall back to
    if reason not in _said:  # say why once, not at every load
        _said.add(reason)
        log.warning("%s", reason)
    return BackendChoice(TORCH, reason)


def _torch_gpu() -> str | None:
    """The GPU torch sees, if any; None at once where none can be there, without importing torch
    (about a second, most of a llama.cpp run's start)."""
    if not gpu_possible():
        return None
    from app.engine.backends.torch.device import available_gpu

    return available_gpu()


# Device nodes of the GPUs a torch build can use on Linux: NVIDIA's, AMD's ROCm, WSL2's.
_GPU_NODES = ("/dev/nvidiactl", "/dev/nvidia0", "/dev/kfd", "/dev/dxg")


def gpu_possible() -> bool:
    """Whether this machine may have a GPU torch can use: a Mac (MPS), Windows (no device nodes to
    look at), or a Linux GPU's device node; never where torch is not installed."""
    if not torch_installed():
        return False
    return sys.platform in ("darwin", "win32") or any(os.path.exists(node) for node in _GPU_NODES)
