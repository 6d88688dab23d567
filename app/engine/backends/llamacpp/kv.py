"""llama.cpp behind the KV-model seam: feed tokens through a llama_batch that asks for logits only
on the rows the loop reads, and roll a rejected tail back with the memory API's seq_rm.

One LlamaWeights holds a loaded llama_model; each LlamaKV is a llama_context over it (its own KV
cache), so a draft model and the main model, or two server requests, never share a cache.
Rollback with seq_rm gives logits bit-identical to evaluating the kept prefix afresh, also for
Gemma 3's sliding-window layers when the context keeps a full-size SWA cache (facts.md), which
every context here does.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from app.engine.backends.llamacpp import lib as llamacpp_lib
from app.engine.backends.llamacpp.threads import DEFAULT_POLL, ThreadGovernor, Threadpool
from app.engine.errors import LoadCancelled, ModelFileError, SpeculaError
from app.engine.seam import common_prefix_length, first_argmax

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LlamaSettings:
    """Run-time settings of llama.cpp, as its own flags name them. They depend on the model and
    the machine only, never on the drafter: a drafter may change the speed, not the answer.

    threads: llama.cpp's default, the physical cores (-t); flash_attn: -1 auto (-fa auto);
    repack: llama.cpp's repacked CPU weights (--no-repack turns them off); kv_type: -ctk/-ctv."""

    threads: int = 0  # 0: physical cores
    flash_attn: int = -1
    poll: int = DEFAULT_POLL  # ggml's polling level between steps (--poll): 0 sleeps, 100 spins
    repack: bool = True
    n_batch: int = 2048
    n_ubatch: int = 512

    def thread_count(self) -> int:
        return self.threads if self.threads > 0 else physical_cores()


def physical_cores() -> int:
    """Cores this process may run on, counting a core's hyper-threads once (llama.cpp's own
    default thread count, cpu_get_num_math)."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    cores = set()
    for cpu in cpus:
        try:
            siblings = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list").read_text().strip()
        except OSError:
            siblings = str(cpu)
        cores.add(siblings)
    return max(1, len(cores))


class LlamaWeights:
    """A llama_model loaded from a GGUF file (weights memory-mapped, as llama.cpp does)."""

    def __init__(self, path: str | Path, n_gpu_layers: int = 0, settings: LlamaSettings = LlamaSettings(),
                 progress: Callable[[float], None] | None = None, cancel: Callable[[], bool] | None = None) -> None:
        lib = llamacpp_lib.binding()
        self.lib = lib
        self.path = Path(path)
        self.settings = settings
        params = lib.llama_model_default_params()
        params.n_gpu_layers = n_gpu_layers
        params.use_extra_bufts = settings.repack
        cancelled = [False]

        def on_progress(fraction: float, _user) -> bool:
            if cancel is not None and cancel():
                cancelled[0] = True
                return False
            if progress is not None:
                progress(float(fraction))
            return True

        callback = lib.llama_progress_callback(on_progress)
        params.progress_callback = callback
        llamacpp_lib.clear_errors()
        self.model = lib.llama_model_load_from_file(str(self.path).encode(), params)
        if cancelled[0]:
            if self.model:
                lib.llama_model_free(self.model)
            raise LoadCancelled("loading cancelled")
        if not self.model:
            cause = llamacpp_lib.last_error()
            raise ModelFileError(f"{self.path.name}: llama.cpp could not load it" + (f" ({cause})" if cause else ""))
        self.vocab = lib.llama_model_get_vocab(self.model)
        self.n_vocab = int(lib.llama_vocab_n_tokens(self.vocab))
        self.n_ctx_train = int(lib.llama_model_n_ctx_train(self.model))
        self.n_layers = int(lib.llama_model_n_layer(self.model))
        self.n_gpu_layers = n_gpu_layers
        self.step_curve = None  # app.engine.backends.llamacpp.cost.StepCurve, set by the loader
        self._free_lock = threading.Lock()

    def context(self, n_ctx: int | None = None) -> "LlamaKV":
        """A fresh KV cache over these weights; n_ctx defaults to the model's trained context."""
        return LlamaKV(self, n_ctx or self.n_ctx_train or 4096)

    def chat_template(self) -> str | None:
        raw = self.lib.llama_model_chat_template(self.model, None)
        return raw.decode("utf-8", "replace") if raw else None

    def close(self) -> None:
        with self._free_lock:
            if getattr(self, "model", None):
                self.lib.llama_model_free(self.model)
                self.model = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


class LlamaKV:
    """A llama_context: one KV cache and the token ids it holds (`ids`), as app.engine.backends.torch.kv's
    KVModel, which the loop and the drafters also take."""

    def __init__(self, weights: LlamaWeights, n_ctx: int) -> None:
        lib = weights.lib
        self.lib, self.weights = lib, weights
        settings = weights.settings
        params = lib.llama_context_default_params()
        params.n_ctx = n_ctx
        params.n_batch = min(settings.n_batch, n_ctx)
        params.n_ubatch = min(settings.n_ubatch, params.n_batch)
        params.n_seq_max = 1
        params.n_threads = params.n_threads_batch = settings.thread_count()
        params.flash_attn_type = settings.flash_attn
        params.swa_full = True  # rolling back across a sliding window needs the whole window's past
        params.no_perf = True
        llamacpp_lib.clear_errors()
        self.ctx = lib.llama_init_from_model(weights.model, params)
        if not self.ctx:
            cause = llamacpp_lib.last_error()
            raise SpeculaError(f"{weights.path.name}: llama.cpp could not make a context of {n_ctx} tokens"
                               + (f" ({cause})" if cause else ""))
        # A threadpool that lives with the context, as llama.cpp's programs attach one.
        self._threads = Threadpool(llamacpp_lib._loaded_ggml(), lib._lib, settings.thread_count(), settings.poll)
        self._threads.attach(self.ctx)
        # With the default thread count, fewer threads while other programs keep cores busy; a
        # count the user chose (-t) is kept.
        self.governor = ThreadGovernor(settings.thread_count(), self._set_threads) \
            if settings.threads <= 0 and settings.thread_count() > 1 else None
        self.n_ctx = int(lib.llama_n_ctx(self.ctx))
        self.n_batch = int(params.n_batch)
        self.memory = lib.llama_get_memory(self.ctx)
        self.vocab_size = weights.n_vocab
        self.ids: list[int] = []
        self._batch = lib.llama_batch_init(self.n_batch, 0, 1)
        # numpy views of llama.cpp's logits buffer by row count, for the buffer at
        # _logits_address: making one is ctypes work (56 us right after a decode, which leaves
        # Python's caches cold; with the batch's tokens set in place, 25 us less Python in a
        # 9.5 ms SmolLM2 step). The buffer moves only when llama.cpp grows it.
        self._logits_address = 0
        self._logit_views: dict[int, np.ndarray] = {}
        # Seconds of a step feeding n tokens, when measured (app.engine.loop.schedule's prior).
        self.step_cost: Callable[[int], float] | None = None

    # --- the seam -----------------------------------------------------------------------------

    def reset(self) -> None:
        self.lib.llama_memory_clear(self.memory, True)
        self.ids = []

    def rewind(self, n_tokens: int) -> None:
        """Keep only the first n_tokens of the cache."""
        if n_tokens >= len(self.ids):
            return
        if n_tokens <= 0:
            self.reset()
            return
        if not self.lib.llama_memory_seq_rm(self.memory, 0, n_tokens, -1):
            # A recurrent model's state cannot be cut: start again from the kept prefix.
            kept = self.ids[:n_tokens]
            self.reset()
            self.feed_rows(kept, 1)
            return
        del self.ids[n_tokens:]

    def feed(self, new_ids: Sequence[int], n_logits: int = 1) -> np.ndarray:
        """Append tokens to the cache; float32 logits [n_logits, V] of the last positions."""
        return self.feed_rows(new_ids, n_logits).all()

    def feed_rows(self, new_ids: Sequence[int], n_logits: int = 1) -> "LlamaRows":
        """Append tokens to the cache; the logit rows of the last n_logits positions, valid until
        the next feed (read them, or copy them with .all())."""
        new_ids = [int(t) for t in new_ids]
        if not new_ids:
            raise ValueError("nothing to feed")
        if len(self.ids) + len(new_ids) > self.n_ctx:
            raise SpeculaError(f"the context of {self.n_ctx} tokens is full")
        n_logits = max(1, min(n_logits, len(new_ids)))
        first_logit = len(new_ids) - n_logits
        if n_logits > len(new_ids) - (len(new_ids) - 1) // self.n_batch * self.n_batch:
            raise ValueError(f"at most the last batch's rows can have logits ({self.n_batch})")
        for start in range(0, len(new_ids), self.n_batch):
            chunk = new_ids[start:start + self.n_batch]
            self._decode(chunk, len(self.ids), first_logit - start)
            self.ids.extend(chunk)
        return LlamaRows(self._logits_view(n_logits))

    def _logits_view(self, n_logits: int) -> np.ndarray:
        """The last decode's logits [n_logits, V], in place in llama.cpp's buffer."""
        ptr = self.lib.llama_get_logits(self.ctx)
        address = ctypes.cast(ptr, ctypes.c_void_p).value or 0
        if address != self._logits_address:  # a moved buffer's views point at freed memory
            self._logits_address, self._logit_views = address, {}
        view = self._logit_views.get(n_logits)
        if view is None:
            view = self._logit_views[n_logits] = np.ctypeslib.as_array(ptr, shape=(n_logits, self.vocab_size))
        return view

    def sync(self, context: Sequence[int]) -> np.ndarray:
        """Make the cache hold `context` (reusing the common prefix); the last logits [V]."""
        keep = min(common_prefix_length(self.ids, context), len(context) - 1)
        self.rewind(keep)
        return self.feed(context[keep:], 1)[0]

    def in_step(self) -> bool:
        """The cache holds exactly the positions of `ids` (a decode that failed part-way may
        have left others): llama.cpp's own last position of the sequence."""
        return int(self.lib.llama_memory_seq_pos_max(self.memory, 0)) == len(self.ids) - 1

    # --- below the seam -----------------------------------------------------------------------

    def _set_threads(self, n_threads: int) -> None:
        self.lib.llama_set_n_threads(self.ctx, n_threads, n_threads)

    def _decode(self, chunk: list[int], pos0: int, first_logit: int) -> None:
        """One llama_decode of `chunk` at positions pos0...; logits from index first_logit on."""
        if self.governor is not None:
            self.governor.before_step()
        batch = self._batch
        n = len(chunk)
        for i in range(n):  # in place: no array built and copied (20 us of a one-token step, cold)
            batch.token[i] = chunk[i]
            batch.pos[i] = pos0 + i
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = i >= first_logit
        batch.n_tokens = n
        llamacpp_lib.clear_errors()
        status = self.lib.llama_decode(self.ctx, batch)
        if self.governor is not None:
            self.governor.after_step()
        if status != 0:
            cause = llamacpp_lib.last_error()
            raise SpeculaError(f"llama.cpp could not evaluate {n} tokens (status {status})"
                               + (f": {cause}" if cause else ""))

    def close(self) -> None:
        if getattr(self, "ctx", None):
            self.lib.llama_batch_free(self._batch)
            self.lib.llama_free(self.ctx)
            self.ctx = None
            self._threads.close()  # after the context that used it

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


class LlamaRows:
    """Logit rows of consecutive positions, read in place from llama.cpp's output buffer (valid
    until the context's next decode): a verify reads the argmax of a row without copying it."""

    def __init__(self, view: np.ndarray) -> None:
        self._view = view
        self._all: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self._view.shape[0])

    def row(self, i: int) -> np.ndarray:
        """float32 logits [V] of position i (a copy)."""
        if self._all is not None:
            return self._all[i]
        return self._view[i].copy()

    def argmax(self, i: int) -> int:
        """The greedy token at position i (the first of equal maxima, as torch's argmax)."""
        return first_argmax(self._view[i])

    def all(self) -> np.ndarray:
        """float32 logits [n, V], copied out of llama.cpp's buffer."""
        if self._all is None:
            self._all = self._view.copy()
        return self._all


