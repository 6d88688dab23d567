"""GGUF file -> a model on llama.cpp, after our own header checks (llama.cpp's GGUF reader has had
memory-safety bugs: a file reaches it only once app.engine.gguf.info has read and checked it)."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from app.engine.backends.llamacpp import cost as llamacpp_cost, lib as llamacpp_lib
from app.engine.backends.llamacpp.kv import LlamaKV, LlamaSettings, LlamaWeights
from app.engine.backends.llamacpp.tokenizer import LlamaTokenizer
from app.engine.errors import InsufficientMemoryError
from app.engine.gguf.format import format_bytes
from app.engine.gguf.info import GGUFInfo
from app.common.machine import memory_limit_bytes

log = logging.getLogger(__name__)

# llama.cpp's own default context (-c 4096), where the model was trained on more: a context's KV
# cache is allocated whole when it is made.
DEFAULT_CTX = 4096


@dataclass(frozen=True)
class LlamaPlan:
    """Where and how llama.cpp runs a model: what the window, inspect and run show."""

    n_gpu_layers: int
    n_layers: int
    quant: str | None
    threads: int
    gpu: str | None = None  # "llama.cpp GPU" where layers are offloaded
    dtype_name: str = "gguf"

    def describe(self) -> str:
        where = "CPU" if self.n_gpu_layers == 0 else (
            "GPU" if self.n_gpu_layers >= self.n_layers else f"GPU {self.n_gpu_layers}/{self.n_layers} layers, rest on CPU")
        quant = f" · {self.quant}" if self.quant else ""
        return f"llama.cpp on {where}{quant} · {self.threads} threads"


def weights_bytes(info: GGUFInfo) -> int:
    """The tensor data llama.cpp maps: the file's weights as they are stored."""
    return info.memory_bytes("gguf")


def check_memory(info: GGUFInfo) -> None:
    need = weights_bytes(info)
    limit = memory_limit_bytes()
    if limit is not None and need > limit:
        raise InsufficientMemoryError(f"{info.path.name}: needs about {format_bytes(need)} of memory, "
                                      f"only {format_bytes(limit)} available (try a smaller quantization or model)")


# Step curves measured in this process, by what a step's cost depends on: the tensors' names,
# shapes and types, the layers offloaded and the settings (not the file's name or place).
_curves: dict[tuple, llamacpp_cost.StepCurve] = {}


def shared_step_curve(weights: LlamaWeights, info: GGUFInfo, layers: int, settings: LlamaSettings,
                      cancel: Callable[[], bool] | None = None) -> llamacpp_cost.StepCurve:
    """The step curve of these weights: one measurement for every load of the same tensors in
    this process. A model loaded as its own draft (the same file, or a copy of it downloaded
    beside the built-in one) used to measure its curve a second time, moments after the main
    model's: on a busy 2-core CPU two measurements of the same weights differed by 1.5-3x (the
    one-token step 42 vs 124 ms), so the chat priced a self-draft at 1.95x a main-model token
    where Discover said it drafts at its own cost. Sharing the measurement makes it exactly 1x."""
    key = (tuple((t.name, tuple(t.shape), t.ggml_type) for t in info.tensors), layers, settings)
    curve = _curves.get(key)
    if curve is None:
        curve = llamacpp_cost.step_curve(weights, llamacpp_lib.build_key(), cancel)
        if cancel is None or not cancel():  # a cancelled measurement is partial: not kept
            _curves[key] = curve
    return curve


def load_llamacpp(info: GGUFInfo, n_gpu_layers: int | None, settings: LlamaSettings,
                  progress: Callable[[str, float], None] | None = None,
                  cancel: Callable[[], bool] | None = None):
    """(weights, tokenizer, plan, seconds) for a checked header; raises one-line SpeculaErrors."""
    started = time.monotonic()
    check_memory(info)
    # llama.cpp offloads the output layer too once -ngl passes the repeating layers: "all" is n + 1.
    layers = info.n_layers + 1 if n_gpu_layers is None else max(0, min(n_gpu_layers, info.n_layers + 1))
    if not llamacpp_lib.has_gpu():
        if n_gpu_layers:
            log.warning("this llama.cpp build has no GPU: -ngl %d ignored, every layer on the CPU", n_gpu_layers)
        layers = 0
    report = progress or (lambda stage, fraction: None)
    weights = LlamaWeights(info.path, layers, settings, lambda f: report("reading weights", f), cancel)
    tokenizer = LlamaTokenizer(weights, info)
    report("measuring llama.cpp's steps here (once per model)", 1.0)
    weights.step_curve = shared_step_curve(weights, info, layers, settings, cancel)
    plan = LlamaPlan(min(layers, info.n_layers), info.n_layers, info.file_type, settings.thread_count(),
                     gpu="llama.cpp" if layers else None)
    elapsed = time.monotonic() - started
    log.info("loaded %s on llama.cpp in %.2fs (%s)", Path(info.path).name, elapsed, plan.describe())
    return weights, tokenizer, plan, elapsed


def new_context(weights: LlamaWeights, info: GGUFInfo, n_ctx: int | None) -> LlamaKV:
    """A KV cache of n_ctx tokens (default: llama.cpp's 4096, or less where the model was trained
    on less)."""
    trained = info.context_length or weights.n_ctx_train or DEFAULT_CTX
    kv = weights.context(n_ctx or min(DEFAULT_CTX, trained))
    curve = getattr(weights, "step_curve", None)
    kv.step_cost = curve.cost if curve is not None else None
    return kv
