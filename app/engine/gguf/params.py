"""How many parameters a model has, from its tensor table: each weight counted once.

A model with tied embeddings (Qwen2.5 0.5B to 3B, Llama 3.2 1B and 3B, Gemma) uses one matrix both
to embed tokens and to score them. Most GGUF files store it once (token_embd.weight, no
output.weight), but some store the output layer again as output.weight, often in another
quantization (Qwen's own Qwen2.5-Coder 1.5B GGUF: token_embd Q4_K, output Q6_K). Summing the table
then counts the matrix twice: 1.78B for a 1.5B model, 630M for a 0.5B one.

The header has no flag for tying, and an untied output of the same shape is common (Llama 3.1 8B).
The publisher's size label decides: where output.weight has token_embd's shape, the total is more
than LABEL_TOLERANCE off the label, and the total without it is nearer to the label, the output is
the tied matrix stored again and is counted once. Without a plain label ("1.5B"; not "8x7B") the
table's sum stands.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

LABEL_TOLERANCE = 0.10  # a label rounds its count: "1.5B" for 1.54B, "7B" for 7.6B
_LABEL = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMBT])\s*$", re.IGNORECASE)
_UNITS = {"K": 1e3, "M": 1e6, "B": 1e9, "T": 1e12}


class _Tensor(Protocol):
    name: str
    shape: tuple[int, ...]
    n_elements: int


@dataclass(frozen=True)
class ParamCount:
    n_params: int  # every weight once
    tied_output: int  # elements of an output.weight that repeats the token embeddings (0: none)


def label_count(label: object) -> float | None:
    """A plain size label's count ("1.5B" -> 1.5e9, "270M" -> 2.7e8); None for anything else."""
    match = _LABEL.match(label) if isinstance(label, str) else None
    return float(match[1]) * _UNITS[match[2].upper()] if match and float(match[1]) > 0 else None


def count_params(tensors: Iterable[_Tensor], size_label: object = None) -> ParamCount:
    """The model's parameters, a tied output layer stored twice counted once (see the module)."""
    tensors = list(tensors)
    total = sum(t.n_elements for t in tensors)
    by_name = {t.name: t for t in tensors}
    embed, output = by_name.get("token_embd.weight"), by_name.get("output.weight")
    label = label_count(size_label)
    if embed is None or output is None or tuple(embed.shape) != tuple(output.shape) or label is None:
        return ParamCount(total, 0)
    once = total - output.n_elements

    def off(n: int) -> float:
        return abs(math.log(max(n, 1) / label))

    if off(total) > math.log(1 + LABEL_TOLERANCE) and off(once) < off(total):
        return ParamCount(once, output.n_elements)
    return ParamCount(total, 0)
