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
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterator

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers import modeling_gguf_pytorch_utils as gguf_utils

from app.engine import fastload
from app.engine.backends import TORCH
from app.engine.cpu import calibrate, int8head, quantlinear
from app.engine.cpu import plan as cpu_plan
from app.engine.cpu.attention import use_cpu_attention
from app.engine.cpu.int8head import Int8Head
from app.engine.device import DevicePlan, apply_plan, resolve_plan
from app.engine.errors import DeviceError, InsufficientMemoryError, LoadCancelled, ModelFileError, SpeculaError, UnsupportedModelError
from app.engine.gguf_info import (GGUFInfo, check_tensor_table, format_bytes, int4_packable, read_gguf_info,
                                   read_tensor)
from app.engine.machine import memory_limit_bytes
from app.engine.cpu.rowexact import replaces_int4, wrap_linears
from app.engine.kvmodel import require_cache_argument
from app.engine.loader import CancelCheck, LoadedModel, ProgressCallback
from app.engine.rope import apply_rope_scaling

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
    """RAM needed to load: the weights at the plan's dtype (int4 where the plan keeps them
    quantized) plus one float32 tensor in flight (each tensor is dequantized to float32 before it
    is cast)."""
    largest = max((t.n_elements for t in info.tensors), default=0) * 4
    return weights_bytes(info, plan) + largest


def weights_bytes(info: GGUFInfo, plan: DevicePlan) -> int:
    """The weights' bytes in the plan, counting the layer matrices this CPU keeps in bf16 rather
    than in int4 passes (app.engine.cpu.rowexact.replaces_int4) as the loader will."""
    kept = replaces_int4 if plan.int4 else None
    return info.memory_bytes(plan.dtype_name, int4=plan.int4, int8_head=plan.int8_head, kept_in_dtype=kept)


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
def _tensor_progress(progress: ProgressCallback | None, cancel: CancelCheck | None) -> Iterator[None]:
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


def load_torch(
    path: Path,
    info: GGUFInfo,
    *,
    device: str = "auto",
    dtype: str = "auto",
    n_gpu_layers: int | None = None,
    progress: ProgressCallback | None = None,
    cancel: CancelCheck | None = None,
    int4: bool = True,
    drafter: str = "none",
    int8_head: bool = False,
    backend_reason: str = "",
    started: float | None = None,
) -> LoadedModel:
    """Load a checked GGUF header's file on torch. Raises SpeculaError subclasses with one-line
    messages. int4=False dequantizes every weight to the dtype even where the int4 kernel could
    run it. int8_head=True runs the output projection in int8 (app.engine.cpu.int8head) on a CPU
    bf16 load where it can run; with dtype "auto" the measured plan decides instead. With dtype
    "auto" on the CPU the plan is measured (app.engine.cpu.plan) for the drafter that will run
    ("none", "lookup", "draft")."""
    started = time.monotonic() if started is None else started
    report = progress or (lambda stage, fraction: None)
    require_cache_argument()  # before seconds of loading, not after
    check_supported(info)
    try:
        plan = resolve_plan(info.n_layers, device, dtype, n_gpu_layers)
    except DeviceError as exc:
        raise DeviceError(f"{path.name}: {exc}") from exc
    choice = None
    if dtype == "auto" and _on_cpu(plan) and fastload.can_fast_load(info):
        choice = choose_cpu_plan(info, drafter, int4=int4, cancel=cancel, progress=report)
        plan = replace(plan, dtype=choice.option.dtype, int4=choice.option.int4, int8_head=choice.option.int8_head)
    elif fastload.can_fast_load(info):
        plan = replace(plan, int4=int4 and _use_int4(info, plan),
                       int8_head=int8_head and _int8_head_runs(info, plan))
    check_memory(info, plan)
    name = path.name
    try:
        if fastload.can_fast_load(info):
            # The tokenizer loads on a thread while the weights load (their torch kernels release
            # the GIL), but only once the embedding table is filled: the tokenizer's parsing holds
            # the GIL for up to a second at a time, and the table's many small blocks, each needing
            # it, would wait (Gemma's table took 2.7 s beside it, 0.2 s alone).
            report("building tokenizer", 0.0)
            with ThreadPoolExecutor(2, thread_name_prefix="specula-load") as pool:
                tokenizer_jobs, head_jobs = [], []
                head_name = _head_tensor(info).name if plan.int8_head else None

                def start_tokenizer() -> None:
                    if not tokenizer_jobs:
                        tokenizer_jobs.append(pool.submit(fastload.load_tokenizer, info))

                def on_table(name: str, table: torch.Tensor) -> None:
                    # The int8 head is packed from its table as soon as that is filled, while the
                    # layers load (its packing, most of the work, releases the GIL).
                    if name == head_name:
                        head_jobs.append(pool.submit(Int8Head, table, cancel))
                    start_tokenizer()

                model = fastload.build_model(info, plan.dtype, progress, cancel, int4=plan.int4,
                                             int4_head=not plan.int8_head, on_table=on_table)
                start_tokenizer()  # a file without a table among its tensors
                tokenizer = tokenizer_jobs[0].result()
                int8_head = head_jobs[0].result() if head_jobs else None
        else:
            tokenizer, model = _transformers_load(path, plan, progress, cancel)
            int8_head = None
    except SpeculaError:
        raise
    except MemoryError as exc:
        raise InsufficientMemoryError(f"{name}: ran out of memory while loading") from exc
    except Exception as exc:  # transformers raises bare ValueError/KeyError/OSError on bad files
        raise ModelFileError(f"{name}: could not be loaded ({type(exc).__name__}: {_first_line(exc)})") from exc
    model.eval()
    if plan.gpu is None:
        prepare_cpu_model(model, plan.dtype, plan.int4, plan.int8_head, int8_head)
    rope_freqs = read_tensor(info, "rope_freqs.weight") if _has_tensor(info, "rope_freqs.weight") else None
    rope_fix = apply_rope_scaling(model, info.architecture, info.metadata, rope_freqs)
    report("placing on device", 1.0)
    model = apply_plan(model, plan)
    elapsed = time.monotonic() - started
    log.info("loaded %s in %.1fs on %s", name, elapsed, plan.describe())
    return LoadedModel(path, info, model, tokenizer, plan, elapsed, rope_fix, choice, TORCH, backend_reason)


def torch_runs(info: GGUFInfo) -> bool:
    """transformers knows this file's architecture."""
    try:
        check_supported(info)
    except UnsupportedModelError:
        return False
    return True


def prepare_cpu_model(model: torch.nn.Module, dtype: torch.dtype, int4: bool, int8_head: bool = False,
                      built_head: Int8Head | None = None) -> None:
    """What a CPU model needs after its weights: float32 attention for half precision
    (app.engine.cpu.attention), row-exact bf16 matrices beside int4 ones (app.engine.cpu.rowexact),
    the int8 head where the plan has one (app.engine.cpu.int8head). The calibration's shaped
    models get the same, but their int8 head (app.engine.cpu.calibrate)."""
    if dtype != torch.float32:
        use_cpu_attention(model, row_by_row=int4)
    if int4:
        wrap_linears(getattr(model, model.base_model_prefix).layers)
    if int8_head:
        table = model.get_output_embeddings().weight
        if built_head is None or built_head.table is not table:  # built while loading: of this very table
            built_head = Int8Head(table)
        model.set_output_embeddings(built_head)


def _on_cpu(plan: DevicePlan) -> bool:
    return plan.gpu is None or plan.n_gpu_layers == 0


def cpu_plan_options(info: GGUFInfo, int4: bool = True) -> list[cpu_plan.PlanOption]:
    """The plans `auto` chooses among for this file: float32 and bf16 always, int4 weights where
    the kernel runs here, the file has tensors it can run and the user has not turned it off,
    each bf16 one also with an int8 head where that runs here and the head is large enough to
    matter; a plan whose weights do not fit in memory is left out (float32 needs twice bf16's)."""
    options = [cpu_plan.FLOAT32, cpu_plan.BF16]
    if int4 and _int4_runs(info):
        options.append(cpu_plan.BF16_INT4)
    if _int8_head_runs(info) and _head_tensor(info).n_elements >= int8head.MIN_WEIGHTS:
        options += [cpu_plan.with_int8_head(o) for o in options if o.dtype == torch.bfloat16]
    limit = memory_limit_bytes()
    fitting = [o for o in options if limit is None or estimate_load_bytes(
        info, DevicePlan(None, o.dtype, 0, info.n_layers, o.int4, o.int8_head)) <= limit]
    return fitting or options[-1:]  # none fits: the smallest, so that check_memory says why


def choose_cpu_plan(info: GGUFInfo, drafter: str = "none", *, int4: bool = True, recalibrate: bool = False,
                    cancel: CancelCheck | None = None,
                    progress: ProgressCallback | None = None) -> cpu_plan.PlanChoice:
    """The measured plan for this model and drafter: the cached curves of this machine, torch and
    model shape, or a calibration of a few seconds (app.engine.cpu.calibrate)."""
    options = cpu_plan_options(info, int4)
    curves = None if recalibrate else cpu_plan.cached_curves(info, options)
    if curves is None:
        if progress is not None:
            progress("measuring this CPU (once per model shape)", 0.0)
        curves, steady = calibrate.measure(info, options, lambda m, o: prepare_cpu_model(m, o.dtype, o.int4), cancel)
        if steady:
            cpu_plan.store_curves(info, options, curves)
        else:
            log.warning("%s: the CPU was busy while its plan was measured; the next load measures again",
                        info.path.name)
    return cpu_plan.choose(curves, drafter)


def _head_tensor(info: GGUFInfo):
    """The file's output projection (output.weight, else the tied embedding), if 2-D."""
    tensor = info.head_tensor()
    return tensor if tensor is not None and len(tensor.shape) == 2 else None


def _int8_head_runs(info: GGUFInfo, plan: DevicePlan | None = None) -> bool:
    """The int8 head can run for this file (an engine here, a 2-D head) and, given a plan, in it
    (all on the CPU in bf16)."""
    in_plan = plan is None or (_on_cpu(plan) and plan.dtype == torch.bfloat16)
    return in_plan and _head_tensor(info) is not None and int8head.available()


def _use_int4(info: GGUFInfo, plan: DevicePlan) -> bool:
    """Keep quantized weights quantized when everything computes on the CPU in bf16 and the file
    has tensors the int4 kernel can run (SPECULA_INT4=0 turns it off)."""
    return _on_cpu(plan) and plan.dtype == torch.bfloat16 and _int4_runs(info)


def _int4_runs(info: GGUFInfo) -> bool:
    """The int4 kernel exists here (and is not turned off) and the file has tensors it can run."""
    return quantlinear.int4_available() and any(int4_packable(t.ggml_type, t.shape) for t in info.tensors)


def _transformers_load(path: Path, plan: DevicePlan, progress: ProgressCallback | None,
                       cancel: CancelCheck | None) -> tuple[transformers.PreTrainedTokenizerBase, torch.nn.Module]:
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


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else ""


__all__ = ["load_torch", "supported_architectures", "check_supported", "torch_runs"]
