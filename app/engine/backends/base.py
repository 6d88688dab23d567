"""What every backend hands the code above it: a loaded model (LoadedModel) that holds its backend
(a ModelBackend), and what a load is asked for (LoadRequest).

Code outside app.engine.backends asks the model's backend (its KV cache, its weights' bytes, why
it runs as it does, its threads, ...) and never tests the backend's name: the name ("llama.cpp",
"torch") is data users see, in the window, the CLI's lines and JSON. This module imports no
backend, so a backend can build a LoadedModel without importing app.engine.loader.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Protocol

from app.engine.gguf.info import GGUFInfo
from app.engine.seam import KVModelLike
from app.engine.errors import Cancel

ProgressCallback = Callable[[str, float], None]  # (what is happening, fraction done 0..1)


@dataclass(frozen=True)
class LoadRequest:
    """How to load, as asked (`-dev`, `--dtype`, `-ngl`, llama.cpp's run-time flags). Each
    backend reads what it uses: llama.cpp the layers and `llama`, torch the device and dtype."""

    device: str = "auto"
    dtype: str = "auto"
    n_gpu_layers: int | None = None
    # llama.cpp's app.engine.backends.llamacpp.kv.LlamaSettings (None: its defaults); not imported
    # here: no backend module is, so that every backend can import this one
    llama: Any = None
    progress: ProgressCallback | None = None
    cancel: Cancel | None = None
    started: float | None = None  # when the load began (the header read counts in load_s)


class PlanLike(Protocol):
    """Where and how a backend runs a model (app.engine.backends.llamacpp.load.LlamaPlan,
    app.engine.backends.torch.device.DevicePlan)."""

    gpu: str | None
    n_gpu_layers: int
    n_layers: int

    @property
    def dtype_name(self) -> str: ...

    def describe(self) -> str: ...


class ModelBackend(Protocol):
    """One model as one backend runs it: what callers would otherwise branch on the name for."""

    name: str  # "llama.cpp" or "torch": shown and written, never compared by callers
    reason: str  # why this backend, in one line
    model: Any  # llama.cpp: a LlamaWeights; torch: the transformers model
    plan: PlanLike
    llama_cpp_kernels: bool  # its steps are llama.cpp's: llama.cpp's own programs compare like for like

    def plan_reason(self) -> str:
        """Why the model runs as it does, for the window, inspect, run and bench."""

    def weights_bytes(self) -> int:
        """What the weights hold once loaded, in this plan on this machine."""

    def vocab_size(self) -> int:
        """Rows of the model's output layer (can exceed the header's token count: a padded head)."""

    def kv_model(self, n_ctx: int | None = None) -> KVModelLike:
        """A fresh KV cache over the model, of n_ctx tokens (None: the backend's default)."""

    def threads(self) -> int:
        """CPU threads its steps run on."""

    def plain_step_s(self) -> float | None:
        """Seconds of one plain one-token step as measured at load, or None where not measured."""

    def engine_facts(self) -> str:
        """What its steps run on, in one line (bench's header)."""

    def tie_cause(self) -> str:
        """Why a verify can part from plain decoding at a near-tie on this backend, in words."""

    def transformers_model(self) -> Any | None:
        """The transformers model (its own generate() can run it), or None where there is none."""


@dataclass
class LoadedModel:
    """A GGUF model loaded on a backend: its header, its tokenizer and the backend that runs it."""

    path: Path
    info: GGUFInfo
    tokenizer: Any  # torch: transformers' tokenizer; llama.cpp: a LlamaTokenizer (the same calls)
    backend: ModelBackend
    load_s: float
    rope_fix: str | None = None

    @property
    def name(self) -> str:
        return self.info.name or self.path.stem

    @property
    def model(self) -> Any:
        return self.backend.model

    @property
    def plan(self) -> PlanLike:
        return self.backend.plan

    @property
    def plan_reason(self) -> str:
        return self.backend.plan_reason()

    @property
    def weights_bytes(self) -> int:
        return self.backend.weights_bytes()

    @property
    def vocab_size(self) -> int:
        """Rows of the model's output layer: the ids a drafter may propose stay below it."""
        return self.backend.vocab_size()

    def kv_model(self, n_ctx: int | None = None) -> KVModelLike:
        """A fresh KV cache over this model (app.engine.seam.KVModelLike); n_ctx defaults to the
        model's context length (llama.cpp: its own default, 4096, where the model allows it)."""
        return self.backend.kv_model(n_ctx)
