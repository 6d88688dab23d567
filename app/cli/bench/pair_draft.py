"""A draft model for llama-cpp-python's own speculation (`Llama(draft_model=...)`): a second
`Llama` of the draft file drafting greedily, as llama.cpp's speculative example does, with the
drafted and accepted counts the binding does not keep.

Imported by `specula bench-pair` only when llama-cpp-python is there (it subclasses the binding's
LlamaDraftModel)."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import llama_cpp
from llama_cpp.llama_speculative import LlamaDraftModel

from app.engine.seam import common_prefix_length


class GreedyDraftModel(LlamaDraftModel):
    """Proposes `n_draft` tokens: the draft model's argmax, token by token, from its own KV cache
    (kept in step with the main model's context by common prefix).

    The binding calls it once per verify step with the context so far plus the token just
    sampled, so the step before accepted (this call's length - last call's length - 1) of the
    tokens drafted then: counts() sums that over the steps whose outcome is known."""

    def __init__(self, llm: Any, n_draft: int) -> None:
        self.llm = llm
        self.n_draft = n_draft
        self.start()

    def start(self) -> None:
        """A new generation begins (the binding does not say): forget the last one's step."""
        self.llm.reset()
        self._last: tuple[int, int] | None = None  # (context length, tokens drafted) of the last call
        self.drafted = self.accepted = 0

    def counts(self) -> tuple[int, int]:
        """(drafted, accepted) over the steps verified so far."""
        return self.drafted, self.accepted

    def __call__(self, input_ids: npt.NDArray[np.intc], /, **kwargs: Any) -> npt.NDArray[np.intc]:
        context = [int(t) for t in input_ids]
        if self._last is not None:
            length, drafted = self._last
            accepted = len(context) - length - 1
            if 0 <= accepted <= drafted:
                self.drafted += drafted
                self.accepted += accepted
        draft = self._draft(context)
        self._last = (len(context), len(draft))
        return np.array(draft, dtype=np.intc)

    def _draft(self, context: list[int]) -> list[int]:
        llm = self.llm
        held = llm.input_ids[: llm.n_tokens].tolist()
        # At least one token fed: its logits are the next.
        keep = min(common_prefix_length(held, context), len(context) - 1)
        llm.n_tokens = keep  # eval() drops the cache past n_tokens first
        llm.eval(context[keep:])
        out: list[int] = []
        n_vocab = llm.n_vocab()
        while True:
            logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(n_vocab,))
            out.append(int(np.argmax(logits)))
            if len(out) >= self.n_draft:
                return out
            llm.eval(out[-1:])
