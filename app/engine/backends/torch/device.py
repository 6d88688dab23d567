"""Where a model runs: device, dtype and llama.cpp-style GPU offload (-ngl)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from app.engine.errors import DeviceError

log = logging.getLogger(__name__)

DTYPES = {
    "float32": torch.float32,
    "f32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "f16": torch.float16,
}


@dataclass(frozen=True)
class DevicePlan:
    """gpu: the accelerator ("cuda", "mps") or None; n_gpu_layers of n_layers computed on it."""

    gpu: str | None
    dtype: torch.dtype
    n_gpu_layers: int
    n_layers: int

    @property
    def all_on_gpu(self) -> bool:
        return self.gpu is not None and self.n_gpu_layers >= self.n_layers

    @property
    def input_device(self) -> str:
        return self.gpu if self.all_on_gpu else "cpu"

    @property
    def dtype_name(self) -> str:
        return str(self.dtype).removeprefix("torch.")

    def describe(self) -> str:
        if self.gpu is None or self.n_gpu_layers == 0:
            where = "CPU"
        elif self.all_on_gpu:
            where = f"{self.gpu.upper()} (all {self.n_layers} layers)"
        else:
            where = f"{self.gpu.upper()} {self.n_gpu_layers}/{self.n_layers} layers, rest on CPU"
        return f"{where}, {self.dtype_name}"


def available_gpu() -> str | None:
    if torch.cuda.is_available():
        return "cuda"
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return "mps"
    return None


def auto_dtype(gpu: str | None) -> torch.dtype:
    if gpu == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if gpu == "mps":
        return torch.float16
    # The torch backend on the CPU is the fallback, there to be right rather than fast: float32,
    # transformers' default, whose batch rows are the closest to one-token rows.
    return torch.float32


def resolve_plan(
    n_layers: int,
    device: str = "auto",
    dtype: str = "auto",
    n_gpu_layers: int | None = None,
) -> DevicePlan:
    """Turn user choices into a plan; a GPU asked for where there is none is a DeviceError.

    n_gpu_layers follows llama.cpp's -ngl: None means all layers on the GPU when there is one,
    0 means CPU only, N >= the layer count (99 by convention) means all.
    """
    found = available_gpu()
    if device not in ("auto", "cpu", "cuda", "mps"):
        raise DeviceError(f"unknown device {device!r} (use auto, cpu, cuda or mps)")
    if device in ("cuda", "mps") and found != device:
        raise DeviceError(f"device {device} was asked for, but {_no_gpu_reason(device)}")
    if device == "cpu":
        gpu = None
        if n_gpu_layers:
            raise DeviceError(f"-ngl {n_gpu_layers} asks for GPU layers, but the device is cpu")
    else:
        gpu = found
    if gpu is None and n_gpu_layers:
        raise DeviceError(f"-ngl {n_gpu_layers} asks for GPU layers, but {_no_gpu_reason('cuda')}")
    layers_on_gpu = 0 if gpu is None else n_layers if n_gpu_layers is None else min(n_gpu_layers, n_layers)
    if dtype == "auto":
        compute_on = gpu if layers_on_gpu else None
        chosen = auto_dtype(compute_on)
    elif dtype in DTYPES:
        chosen = DTYPES[dtype]
    else:
        raise DeviceError(f"unknown dtype {dtype!r} (use auto, float32, bfloat16 or float16)")
    return DevicePlan(gpu=gpu, dtype=chosen, n_gpu_layers=layers_on_gpu, n_layers=n_layers)


def _no_gpu_reason(kind: str) -> str:
    if kind == "mps":
        return "this machine has no Apple GPU available to torch"
    build = "a CPU-only build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
    return f"torch {torch.__version__} ({build}) sees no CUDA GPU"


def _to_device(value, device: torch.device):
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, tuple):
        return tuple(_to_device(v, device) for v in value)
    if isinstance(value, list):
        return [_to_device(v, device) for v in value]
    return value


def _follow_inputs_hook(device: torch.device):
    """A pre-forward hook that moves a module's tensor inputs to the module's device."""

    def hook(module, args, kwargs):
        return _to_device(args, device), {k: _to_device(v, device) for k, v in kwargs.items()}

    return hook


def apply_plan(model: torch.nn.Module, plan: DevicePlan) -> torch.nn.Module:
    """Place a CPU-loaded model by the plan. Partial offload computes the first n_gpu_layers
    decoder layers on the GPU and the rest on the CPU, moving activations at the boundaries (a
    device_map with "cpu" entries would instead stream CPU weights to the GPU: facts.md)."""
    if plan.gpu is None or plan.n_gpu_layers == 0:
        return model
    if plan.all_on_gpu:
        return model.to(plan.gpu)
    layers = model.model.layers
    gpu = torch.device(plan.gpu)
    cpu = torch.device("cpu")
    for index, layer in enumerate(layers):
        target = gpu if index < plan.n_gpu_layers else cpu
        layer.to(target)
        layer.register_forward_pre_hook(_follow_inputs_hook(target), with_kwargs=True)
    model.model.norm.register_forward_pre_hook(_follow_inputs_hook(cpu), with_kwargs=True)
    log.info("offloaded %d/%d layers to %s", plan.n_gpu_layers, plan.n_layers, plan.gpu)
    return model


def reset_cuda_peak() -> None:
    """Start counting the CUDA allocator's peak afresh (compare's memory column)."""
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()


def cuda_peak_bytes() -> int:
    return int(torch.cuda.max_memory_allocated()) if torch.cuda.is_available() else 0


def release_cuda_cache() -> None:
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
