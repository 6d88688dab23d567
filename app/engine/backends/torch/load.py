"""The torch backend's load: GGUF file -> (transformers model, tokenizer) on a device plan, with
progress and cancel. Used where llama.cpp cannot run a file or is not installed, for CUDA/MPS
where the llama.cpp build has no GPU, and with --backend torch or a --dtype asked for.

Everything that can be checked on the header is checked before any weight is read: the file is a
whole GGUF, its architecture runs, and it fits in memory. Errors are one line naming the file.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterator

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers import modeling_gguf_pytorch_utils as gguf_utils

from app.engine.backends.torch import fastload
from app.engine.backends.base import LoadRequest, ProgressCallback
from app.engine.backends.torch.device import DevicePlan, apply_plan, resolve_plan
from app.engine.errors import Cancel, DeviceError, InsufficientMemoryError, LoadCancelled, ModelFileError, SpeculaError, UnsupportedModelError, first_line
from app.engine.gguf.format import format_bytes
from app.engine.gguf.info import GGUFInfo, read_tensor
from app.common.machine import memory_limit_bytes
from app.engine.backends.torch.kv import require_cache_argument
from app.engine.backends.torch.rope import apply_rope_scaling

log = logging.getLogger(__name__)

# transformers reads GGUF tensors through one module-level loop; loads are serialized so that our
# progress hook on that loop belongs to exactly one load.
_LOAD_LOCK = threading.Lock()
GiB = 1 << 30


def supported_architectures() -> list[str]:
    # transformers' list is the keys of its config mapping, which include "general" and "tokenizer".
    archs = set(gguf_utils.GGUF_SUPPORTED_ARCHITECTURES) - {"general", "tokenizer"}
    return sorted(archs | {"gemma3", "qwen2_moe", "qwen3_moe"})


def check_supported(info: GGUFInfo) -> None:
    arch = info.architecture
    aliases = {"qwen2moe": "qwen2_moe", "qwen3moe": "qwen3_moe", "gpt-oss": "gpt_oss", "minimax-m2": "minimax_m2"}
    if aliases.get(arch, arch) not in supported_architectures():
        raise UnsupportedModelError(
            f"{info.path.name}: architecture {arch!r} is not supported "
            f"(supported: {', '.join(supported_architectures())})"
        )


def estimate_load_bytes(info: GGUFInfo, plan: DevicePlan) -> int:
    """RAM needed to load: the weights at the plan's dtype plus one float32 tensor in flight (each tensor is dequantized to float32 before it
    is cast)."""
    largest = max((t.n_elements for t in info.tensors), default=0) * 4
    return weights_bytes(info, plan) + largest


def weights_bytes(info: GGUFInfo, plan: DevicePlan) -> int:
    """The weights' bytes in the plan: every weight dequantized to its dtype."""
    return info.memory_bytes(plan.dtype_name)


def check_memory(info: GGUFInfo, plan: DevicePlan) -> None:
    need = estimate_load_bytes(info, plan)
    limit = memory_limit_bytes()
    if limit is not None and need > limit:
        raise InsufficientMemoryError(
            f"{info.path.name}: needs about {format_bytes(need)} of memory at {plan.dtype_name}, "
            f"only {format_bytes(limit)} available (try a smaller quantization or model)"
        )
    if plan.gpu == "cuda" and plan.n_gpu_layers:
        free, _total = torch.cuda.mem_get_info()
        gpu_need = info.memory_bytes(plan.dtype_name) * plan.n_gpu_layers // max(plan.n_layers, 1)
        if gpu_need > free:
            raise InsufficientMemoryError(
                f"{info.path.name}: {plan.n_gpu_layers} layers need about {gpu_need / GiB:.1f} GiB "
                f"of GPU memory, {free / GiB:.1f} GiB free (lower -ngl)"
            )


@contextlib.contextmanager
def _tensor_progress(progress: ProgressCallback | None, cancel: Cancel | None) -> Iterator[None]:
    """Report transformers' per-tensor dequantization loop as progress, and cancel inside it."""
    original = gguf_utils.tqdm

    def tracked(iterable, *args, **kwargs):
        items = list(iterable)
        for index, item in enumerate(items):
            if cancel is not None and cancel():
                raise LoadCancelled("loading cancelled")
            if progress is not None:
                progress("reading weights", index / max(len(items), 1))
            yield item

    gguf_utils.tqdm = tracked
    try:
        yield
    finally:
        gguf_utils.tqdm = original


def load_torch(path: Path, info: GGUFInfo, request: LoadRequest,
               ) -> tuple[torch.nn.Module, transformers.PreTrainedTokenizerBase, DevicePlan, str | None, float]:
    """Load a checked GGUF header's file on torch, every weight dequantized to the plan's dtype
    (on the CPU float32 unless asked otherwise: this backend is the fallback, right before fast).
    (model, tokenizer, plan, rope fix, seconds); raises SpeculaError subclasses with one-line
    messages."""
    started = time.monotonic() if request.started is None else request.started
    progress, cancel = request.progress, request.cancel
    report = progress or (lambda stage, fraction: None)
    require_cache_argument()  # before seconds of loading, not after
    check_supported(info)
    try:
        plan = resolve_plan(info.n_layers, request.device, request.dtype, request.n_gpu_layers)
    except DeviceError as exc:
        raise DeviceError(f"{path.name}: {exc}") from exc
    check_memory(info, plan)
    name = path.name
    try:
        if fastload.can_fast_load(info):
            tokenizer, model = _fast_load(info, plan, progress, cancel)
        else:
            tokenizer, model = _transformers_load(path, plan, progress, cancel)
    except SpeculaError:
        raise
    except MemoryError as exc:
        raise InsufficientMemoryError(f"{name}: ran out of memory while loading") from exc
    except Exception as exc:  # transformers raises bare ValueError/KeyError/OSError on bad files
        raise ModelFileError(f"{name}: could not be loaded ({type(exc).__name__}: {first_line(exc, 200)})") from exc
    model.eval()
    rope_freqs = read_tensor(info, "rope_freqs.weight") if _has_tensor(info, "rope_freqs.weight") else None
    rope_fix = apply_rope_scaling(model, info.architecture, info.metadata, rope_freqs)
    report("placing on device", 1.0)
    model = apply_plan(model, plan)
    elapsed = time.monotonic() - started
    log.info("loaded %s in %.1fs on %s", name, elapsed, plan.describe())
    return model, tokenizer, plan, rope_fix, elapsed


def _fast_load(info: GGUFInfo, plan: DevicePlan, progress: ProgressCallback | None,
               cancel: Cancel | None) -> tuple[transformers.PreTrainedTokenizerBase, torch.nn.Module]:
    """Our fast path (app.engine.backends.torch.fastload). The tokenizer loads on a thread while the weights
    load (their torch kernels release the GIL), but only once the embedding table is filled: the
    tokenizer's parsing holds the GIL for up to a second at a time, and the table's many small
    blocks, each needing it, would wait (Gemma's table took 2.7 s beside it, 0.2 s alone)."""
    if progress is not None:
        progress("building tokenizer", 0.0)
    with ThreadPoolExecutor(2, thread_name_prefix="specula-load") as pool:
        tokenizer_jobs = []

        def start_tokenizer(*_table) -> None:
            if not tokenizer_jobs:
                tokenizer_jobs.append(pool.submit(fastload.load_tokenizer, info))

        model = fastload.build_model(info, plan.dtype, progress, cancel, on_table=start_tokenizer)
        start_tokenizer()  # a file without a table among its tensors
        return tokenizer_jobs[0].result(), model


def torch_runs(info: GGUFInfo) -> bool:
    """transformers knows this file's architecture."""
    try:
        check_supported(info)
    except UnsupportedModelError:
        return False
    return True


def _transformers_load(path: Path, plan: DevicePlan, progress: ProgressCallback | None,
                       cancel: Cancel | None) -> tuple[transformers.PreTrainedTokenizerBase, torch.nn.Module]:
    """transformers' own GGUF path: every architecture it supports, slowly (see fastload)."""
    folder, name = str(path.parent), path.name
    with _LOAD_LOCK, _tensor_progress(progress, cancel):
        if progress is not None:
            progress("building tokenizer", 0.0)
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name, local_files_only=True)
        if cancel is not None and cancel():
            raise LoadCancelled("loading cancelled")
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=plan.dtype, local_files_only=True)
    return tokenizer, model


def _has_tensor(info: GGUFInfo, name: str) -> bool:
    return any(t.name == name for t in info.tensors)




__all__ = ["load_torch", "supported_architectures", "check_supported", "torch_runs"]
