"""A model on llama.cpp as the code above the backends sees it (app.engine.backends.base)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from app.engine.backends import LLAMA_CPP
from app.engine.backends.base import LoadedModel, LoadRequest
from app.engine.backends.llamacpp import load
from app.engine.backends.llamacpp.kv import LlamaKV, LlamaSettings, LlamaWeights
from app.engine.gguf.info import GGUFInfo


@dataclass
class LlamaCppBackend:
    """app.engine.backends.base.ModelBackend for a model on llama.cpp."""

    model: LlamaWeights
    info: GGUFInfo
    plan: load.LlamaPlan
    reason: str

    name: ClassVar[str] = LLAMA_CPP
    llama_cpp_kernels: ClassVar[bool] = True

    def plan_reason(self) -> str:
        return self.reason

    def weights_bytes(self) -> int:
        return load.weights_bytes(self.info)

    def vocab_size(self) -> int:
        return int(self.model.n_vocab)

    def kv_model(self, n_ctx: int | None = None) -> LlamaKV:
        return load.new_context(self.model, self.info, n_ctx)

    def threads(self) -> int:
        return self.plan.threads

    def plain_step_s(self) -> float | None:
        curve = getattr(self.model, "step_curve", None)
        return curve.cost(1) if curve is not None else None

    def engine_facts(self) -> str:
        """llama.cpp's threads and the price of a 5-token verify over one token as measured here
        (it caps what any drafter can gain)."""
        curve = self.model.step_curve
        batch = f", a 5-token batch costs {curve.ratio(5):.1f}x one token here" if curve is not None else ""
        return f"llama.cpp threads={self.plan.threads}{batch}"

    def tie_cause(self) -> str:
        return "llama.cpp's batch rows and one-token rows round such ties apart"

    def transformers_model(self) -> Any | None:
        return None


def load_model(path: Path, info: GGUFInfo, request: LoadRequest, reason: str) -> LoadedModel:
    """A checked header's file on llama.cpp; raises one-line SpeculaErrors."""
    settings = request.llama if request.llama is not None else LlamaSettings()
    weights, tokenizer, plan, load_s = load.load_llamacpp(info, request.n_gpu_layers, settings, request.progress,
                                                          request.cancel)
    return LoadedModel(path, info, tokenizer, LlamaCppBackend(weights, info, plan, reason), load_s)
