"""A model on torch as the code above the backends sees it (app.engine.backends.base)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
from transformers import PreTrainedModel

from app.engine.backends import TORCH
from app.engine.backends.base import LoadedModel, LoadRequest
from app.engine.backends.torch import load
from app.engine.backends.torch.device import DevicePlan
from app.engine.backends.torch.kv import KVModel
from app.engine.gguf.info import GGUFInfo


@dataclass
class TorchBackend:
    """app.engine.backends.base.ModelBackend for a transformers model on torch."""

    model: PreTrainedModel
    info: GGUFInfo
    plan: DevicePlan
    reason: str

    name: ClassVar[str] = TORCH
    llama_cpp_kernels: ClassVar[bool] = False

    def plan_reason(self) -> str:
        return "as asked" if self.plan.gpu is None else "on the GPU"

    def weights_bytes(self) -> int:
        return load.weights_bytes(self.info, self.plan)

    def vocab_size(self) -> int:
        head = self.model.get_output_embeddings()
        return int(head.out_features if hasattr(head, "out_features") else head.weight.shape[0])

    def kv_model(self, n_ctx: int | None = None) -> KVModel:
        return KVModel(self.model, n_ctx or self.info.context_length or None)

    def threads(self) -> int:
        return torch.get_num_threads()

    def plain_step_s(self) -> float | None:
        return None  # torch's schedule measures its steps as it decodes: nothing measured at load

    def engine_facts(self) -> str:
        return f"torch threads={torch.get_num_threads()}, CPU kernels {torch.backends.cpu.get_cpu_capability()}"

    def tie_cause(self) -> str:
        return (f"in {self.plan.dtype_name} a verify of several tokens and a one-token step use different kernels; "
                f"greedy identity is exact in float32: --dtype float32")

    def transformers_model(self) -> Any | None:
        return self.model


def load_model(path: Path, info: GGUFInfo, request: LoadRequest, reason: str) -> LoadedModel:
    """A checked header's file on torch (app.engine.backends.torch.load.load_torch)."""
    model, tokenizer, plan, rope_fix, load_s = load.load_torch(path, info, request)
    return LoadedModel(path, info, tokenizer, TorchBackend(model, info, plan, reason), load_s, rope_fix)
