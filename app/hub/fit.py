"""Would a model fit this machine once loaded? Decided on its header alone, before downloading.

The estimate is the engine's (app.engine.backends.torch.load.check_memory): transformers dequantizes every
tensor, so the weights take n_params x the dtype's size whatever the file's quantization, plus
one float32 tensor in flight while loading, plus the KV cache for the context. The dtype is the one
the engine would pick (app.engine.backends.torch.device.auto_dtype). Both engine helpers import torch at module
level, and `specula hub` must start without it, so the few machine facts they use are read here
the same way: SPECULA_MEMORY_LIMIT or /proc/meminfo for RAM, the CPU's bf16 flags, and the GPU's
free memory from torch when it is already imported, else from nvidia-smi.

memory_need is the one estimate of what a model needs: Discover's fit and the Model tab's GPU
offload line both show its words (MemoryNeed.text), so one model never shows two needs.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass
from typing import Any

from app.engine.gguf.format import format_bytes
from app.engine.gguf.info import GGUFInfo
from app.common.machine import memory_limit_bytes, ram_total

log = logging.getLogger(__name__)

DEFAULT_CTX = 4096  # llama.cpp's and LM Studio's usual default; full contexts are rarely used
GPU_HEADROOM = 0.95  # the CUDA context and allocator fragmentation take the rest


@dataclass(frozen=True)
class GpuMemory:
    name: str
    total: int
    free: int


@dataclass(frozen=True)
class MachineMemory:
    ram_available: int | None
    ram_total: int | None
    gpu: GpuMemory | None


@dataclass(frozen=True)
class MemoryNeed:
    """What a model needs once loaded: weights, the KV cache for n_ctx tokens, and the one
    float32 tensor in flight while it loads (the peak, which is what must fit)."""

    weights: int
    kv: int
    loading: int
    n_ctx: int
    kind: str  # how the weights are held: "the file's own types", "float32"
    measured: bool = False  # the weights are the loaded model's own count, not a guess

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.loading

    def text(self) -> str:
        """'≈ 442 MiB: 155 MiB weights (bfloat16) + 180 MiB KV for 4,096 tokens + 107 MiB
        while loading' - the same words wherever a need is shown."""
        kind = self.kind + (", as loaded" if self.measured else "")
        loading = f" + {format_bytes(self.loading)} while loading" if self.loading else ""
        return (f"≈ {format_bytes(self.total)}: {format_bytes(self.weights)} weights ({kind}) + "
                f"{format_bytes(self.kv)} KV for {self.n_ctx:,} tokens{loading}")


def default_ctx(info: GGUFInfo) -> int:
    """The context an estimate counts: the model's own, at most DEFAULT_CTX."""
    return min(info.context_length or DEFAULT_CTX, DEFAULT_CTX)


def memory_need(info: GGUFInfo, *, dtype: str = "gguf",
                n_ctx: int | None = None, weights_bytes: int | None = None, kind: str | None = None) -> MemoryNeed:
    """The engine's estimate: dtype "gguf" is llama.cpp's (the file's tensors as stored, a float16
    KV cache), any other the torch backend's (app.engine.backends.torch.load.check_memory: every
    weight dequantized to `dtype`, the KV cache, and the largest tensor in float32 while loading).
    `weights_bytes` (and `kind`) replace the weights' guess with a loaded model's own count."""
    own_types = dtype == "gguf"  # llama.cpp: the file's tensors as stored, memory-mapped
    n_ctx = n_ctx or default_ctx(info)
    measured = weights_bytes is not None
    # A backend that keeps the file's own types keeps its KV cache in float16 (llama.cpp's default).
    kv_dtype = dtype if dtype in ("float32", "float16", "bfloat16") else "float16"
    weights = weights_bytes if measured else info.memory_bytes("gguf" if own_types else kv_dtype)
    kv = info.kv_bytes_per_token(kv_dtype) * n_ctx
    # torch dequantizes each tensor through float32 while loading; llama.cpp maps the file.
    loading = 0 if own_types else max((t.n_elements for t in info.tensors), default=0) * 4
    kind = kind or dtype
    # llama.cpp keeps each tensor in the file's own type: say so, not the backend's tag "gguf".
    kind = kind.replace("gguf", "the file's own types")
    return MemoryNeed(weights, kv, loading, n_ctx, kind, measured)


@dataclass(frozen=True)
class FitResult:
    fits: bool
    where: str  # "gpu" (all layers), "gpu+cpu" (gpu_layers of them), "cpu", or "none"
    need_bytes: int  # RAM needed to load and run it
    weights_bytes: int
    kv_bytes: int
    ram_available: int | None
    gpu_free: int | None
    gpu_layers: int | None  # llama.cpp's -ngl that fits; None without a GPU
    dtype: str
    n_ctx: int
    reason: str  # one line for the user

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# RAM as the loader sees it (SPECULA_MEMORY_LIMIT honoured), without importing torch.
ram_available = memory_limit_bytes


def parse_nvidia_smi(text: str) -> GpuMemory | None:
    """The first GPU of `nvidia-smi --query-gpu=name,memory.total,memory.free
    --format=csv,noheader,nounits` output (MiB)."""
    for line in text.strip().splitlines():
        fields = [f.strip() for f in line.rsplit(",", 2)]
        if len(fields) == 3:
            try:
                return GpuMemory(fields[0], int(float(fields[1])) << 20, int(float(fields[2])) << 20)
            except ValueError:
                continue
    return None


def gpu_memory() -> GpuMemory | None:
    """The first CUDA GPU's memory; None without one (Apple GPUs share the RAM)."""
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch.cuda.is_available():
                free, total = torch.cuda.mem_get_info(0)
                return GpuMemory(torch.cuda.get_device_name(0), int(total), int(free))
        except Exception:  # noqa: BLE001 - a broken CUDA setup means "no GPU" here
            log.debug("torch.cuda memory query failed", exc_info=True)
        return None
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run([smi, "--query-gpu=name,memory.total,memory.free",
                              "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=5, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return parse_nvidia_smi(out.stdout) if out.returncode == 0 else None


def machine_memory() -> MachineMemory:
    return MachineMemory(ram_available(), ram_total(), gpu_memory())


def default_dtype(gpu: GpuMemory | None) -> str:
    """The form the fit is estimated in: "gguf", llama.cpp's (the default backend), which keeps
    the file's own types on the CPU and on a GPU alike."""
    return "gguf"


def fits_this_machine(info: GGUFInfo, *, n_ctx: int | None = None, dtype: str | None = None,
                      machine: MachineMemory | None = None) -> FitResult:
    """RAM (and VRAM where there is a GPU) the model would need once loaded, against what is free."""
    machine = machine or machine_memory()
    gpu = machine.gpu
    dtype = dtype or default_dtype(gpu)
    estimate = memory_need(info, dtype=dtype, n_ctx=n_ctx)
    n_ctx, weights, kv, need = estimate.n_ctx, estimate.weights, estimate.kv, estimate.total
    ram = machine.ram_available
    if ram is not None and need > ram:
        return FitResult(False, "none", need, weights, kv, ram, gpu.free if gpu else None,
                         0 if gpu else None, dtype, n_ctx,
                         f"too big: needs {estimate.text()}; {format_bytes(ram)} of RAM available; "
                         f"try a smaller model or quantization")
    ram_note = f"{format_bytes(ram)} of RAM available" if ram is not None else "available RAM unknown"
    if gpu is None:
        return FitResult(True, "cpu", need, weights, kv, ram, None, None, dtype, n_ctx,
                         f"fits: needs {estimate.text()}; {ram_note}")
    layers = _gpu_layers(info, weights + kv, gpu)
    where = "gpu" if layers >= info.n_layers else "gpu+cpu" if layers else "cpu"
    on_gpu = {"gpu": f"all {info.n_layers} layers on the GPU",
              "gpu+cpu": f"{layers} of {info.n_layers} layers fit on the GPU (-ngl {layers})",
              "cpu": "no layer fits on the GPU, runs on the CPU"}[where]
    return FitResult(True, where, need, weights, kv, ram, gpu.free, layers, dtype, n_ctx,
                     f"fits: {on_gpu} ({gpu.name}, {format_bytes(gpu.free)} free); "
                     f"needs {estimate.text()}; {ram_note}")


def _gpu_layers(info: GGUFInfo, gpu_need: int, gpu: GpuMemory) -> int:
    budget = int(gpu.free * GPU_HEADROOM)
    if gpu_need <= budget:
        return max(info.n_layers, 1)
    per_layer = gpu_need / max(info.n_layers, 1)
    return max(0, min(info.n_layers, int(budget // per_layer)))
