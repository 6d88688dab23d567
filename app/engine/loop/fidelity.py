"""How a greedy reply compares with plain decoding's: identical, or where it left it and how near
a tie the main model's choice was there.

On llama.cpp a verify's rows are computed as one batch, and with several threads a batch row is
not always bit-identical to the same position decoded alone (flash attention splits a lone
query's keys across threads, the repacked and batched matrix kernels sum in another order:
facts.md). Where the two best logits are that close, either token is the model's choice within
float rounding, and the replies may part there. Anywhere else a difference is a bug.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

# Logits: a gap between the two best tokens below this counts as a tie. Batch and one-token rows
# of the demo models differ by up to a few hundredths at the leading tokens (tests/engine/test_fidelity.py).
NEAR_TIE = 0.5


@dataclass(frozen=True)
class Divergence:
    index: int  # the first generated token that differs
    gap: float  # plain decoding's top-2 logit gap there

    @property
    def at_near_tie(self) -> bool:
        return self.gap < NEAR_TIE


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first index where the two token lists differ (the shorter one's end counts), or None."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def top2_gap(logits) -> float:
    top2 = np.partition(np.asarray(logits, dtype=np.float32), -2)[-2:]
    return float(top2[1] - top2[0])


def compare_to_plain(kv, prompt_ids: Sequence[int], plain: Sequence[int], other: Sequence[int]) -> Divergence | None:
    """None where `other` equals `plain`; else where it first differs, with the main model's top-2
    gap at that position (from `kv`, a KV model of the main model; its cache is reused)."""
    index = first_divergence(plain, other)
    if index is None:
        return None
    return Divergence(index, top2_gap(kv.sync([*prompt_ids, *plain[:index]])))
