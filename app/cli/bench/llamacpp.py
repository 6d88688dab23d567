"""llama.cpp rows for `specula bench` and `specula calibrate --llama-cpp`, through
llama-cpp-python (the optional `bench` extra).

The same GGUF file, the same prompt token ids, greedy, the same thread count and the same clock
(generated tokens over wall time, prompt included) as our rows. llama.cpp computes with its own
quantized kernels, so its greedy output can differ from ours; the table says whether it does.
"""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path
from typing import Any

INSTALL_HINT = "llama.cpp's rows need llama-cpp-python: python3 packaging/bootstrap.py installs it"
# What llama-cpp-python raises for a file its llama.cpp cannot run ("Failed to load model from
# file: ..."): `bench` and `calibrate --llama-cpp` then go on without llama.cpp's rows.
LOAD_ERRORS = (ValueError, RuntimeError, OSError)


def available() -> bool:
    return importlib.util.find_spec("llama_cpp") is not None


class LlamaCppPeer:
    """One llama.cpp model per configuration: plain decoding and its prompt lookup."""

    def __init__(self, path: Path, n_ctx: int, n_threads: int, lookup_tokens: int, stop_ids: set[int]) -> None:
        from llama_cpp import Llama
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        self.stop_ids = set(stop_ids)  # our tokenizer's end of turn: the same ids, the same file
        common: dict[str, Any] = dict(model_path=str(path), n_ctx=n_ctx, n_threads=n_threads,
                                      n_threads_batch=n_threads, verbose=False)
        self.models = {
            "llama.cpp": Llama(**common),
            "llama.cpp lookup": Llama(**common, draft_model=LlamaPromptLookupDecoding(num_pred_tokens=lookup_tokens)),
        }

    def run(self, name: str, ids: list[int], n: int) -> tuple[list[int], float, float | None]:
        """Greedy tokens after `ids` (stopping at EOS or n), the wall time it took, and the decode
        rate after the first token (None with fewer than two tokens), as our summary counts it."""
        llm = self.models[name]
        stop = self.stop_ids | {llm.token_eos()}
        tokens: list[int] = []
        # Start cold, as our rows do: llama-cpp-python reuses whatever prefix of the prompt its
        # last call left in the cache, so a prompt run just before (the warm-up's) cost nothing.
        llm.reset()
        started = time.monotonic()
        first, ended_at_stop = None, False
        for token in llm.generate(ids, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0, reset=True):
            if first is None:
                first = time.monotonic()
            if token in stop:
                ended_at_stop = True  # its step is timed: counted, as decode_rate counts ours
                break
            tokens.append(int(token))
            if len(tokens) >= n:
                break
        ended = time.monotonic()
        steps = len(tokens) - 1 + int(ended_at_stop)
        decode_tps = steps / (ended - first) if first is not None and steps > 0 and ended > first else None
        return tokens, ended - started, decode_tps

    def warm_up(self, ids: list[int]) -> None:
        for name in self.models:
            self.run(name, ids, 8)
