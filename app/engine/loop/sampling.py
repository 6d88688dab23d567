"""Logits to probabilities, seeded sampling, and the speculative acceptance rule.

Notation as in Leviathan et al. / Chen et al. (2023): p is the main (target) model's distribution,
q the draft's. A drafted token x is accepted with probability min(1, p(x)/q(x)); on rejection the
replacement is sampled from normalize(max(0, p - q)). This makes the output distribution exactly p.
A deterministic drafter (prompt lookup) has q = one-hot(x), so x is accepted with probability p(x)
and the replacement is sampled from p with x removed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from app.engine.errors import SpeculaError

# 1 / temperature must be a finite float32 (logits are float32): below this a temperature is
# too small to divide by, and sampling at it is greedy anyway.
MIN_TEMPERATURE = 1.0 / float(np.finfo(np.float32).max)


@dataclass(frozen=True)
class SamplingParams:
    """llama.cpp's sampling knobs. temperature <= 0 means greedy (argmax)."""

    temperature: float = 0.0
    top_k: int = 40  # 0 disables
    top_p: float = 0.95  # 1.0 disables
    min_p: float = 0.05  # 0.0 disables
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature < MIN_TEMPERATURE


MAX_SEED = 2**63 - 1  # a 64-bit seed (numpy's generators take any size); the server's limit too


def check_sampling(params: SamplingParams) -> None:
    """One-line SpeculaError for values no sampler can use (NaN, inf, negative, out of range)."""
    for name, value, high in (("temperature", params.temperature, math.inf), ("top-p", params.top_p, 1.0),
                              ("min-p", params.min_p, 1.0)):
        if not (isinstance(value, (int, float)) and math.isfinite(value) and 0.0 <= value <= high):
            bounds = "0 or more" if high == math.inf else f"between 0 and {high:g}"
            raise SpeculaError(f"{name} must be a finite number {bounds} (got {value})")
    if params.top_k < 0:
        raise SpeculaError(f"top-k must be 0 (off) or more (got {params.top_k})")
    if params.seed is not None and not 0 <= params.seed <= MAX_SEED:
        raise SpeculaError(f"seed must be at most {MAX_SEED}, or negative for a random one (got {params.seed})")


Generator = np.random.Generator


def make_generator(seed: int | None) -> Generator:
    """numpy's PCG64 stream, seeded (None: from the OS's entropy)."""
    return np.random.default_rng(seed)


def softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise softmax in float32 (rows of -inf except some finite values allowed)."""
    top = logits.max(axis=-1, keepdims=True)
    e = np.exp(logits - top, dtype=np.float32)
    return e / e.sum(axis=-1, keepdims=True)


def logits_to_probs(logits, params: SamplingParams) -> np.ndarray:
    """Rows of logits [n, V] -> rows of probabilities [n, V] (float32).

    Truncation (top-k, top-p, min-p) is decided on the untempered distribution and temperature is
    applied last, as in llama.cpp's default sampler chain. Each row's work is on its top-k
    candidates only (about 0.3 ms for Gemma's 262k logits, where sorting them all took 7 ms).
    """
    logits = np.asarray(logits, dtype=np.float32)
    probs = np.zeros_like(logits)
    if params.greedy:
        np.put_along_axis(probs, logits.argmax(-1)[..., None], 1.0, axis=-1)
        return probs
    for row, out in zip(logits.reshape(-1, logits.shape[-1]), probs.reshape(-1, logits.shape[-1])):
        kept = _candidates(row, params.top_k)
        values = row[kept]
        p = softmax(values)
        keep = np.ones(len(kept), dtype=bool)
        if params.top_p < 1.0:
            order = np.argsort(-p, kind="stable")
            mass_before = np.cumsum(p[order]) - p[order]
            drop = mass_before >= params.top_p
            drop[0] = False  # the most likely token always stays (top_p = 0 included)
            keep[order[drop]] = False
        if params.min_p > 0.0:
            keep &= p >= params.min_p * p.max()
        # Shifted so the top logit is 0 before scaling: a tiny temperature sends the others to
        # -inf (greedy in the limit), never to inf - inf = NaN.
        top = values[keep].max()
        scale = np.float32(min(1.0 / params.temperature, float(np.finfo(np.float32).max)))
        with np.errstate(over="ignore", invalid="ignore"):
            tempered = np.where(keep, (values - top) * scale, -np.inf).astype(np.float32)
        out[kept] = softmax(tempered)
    return probs


def _candidates(row: np.ndarray, top_k: int) -> np.ndarray:
    """Indices of the tokens top-k keeps (every token at the k-th largest value, ties included),
    in index order; all of them when top-k is off."""
    if not 0 < top_k < row.shape[-1]:
        return np.arange(row.shape[-1])
    kth = row[np.argpartition(row, -top_k)[-top_k:]].min()
    return np.flatnonzero(row >= kth)


class RowProbs:
    """Main-model probabilities of consecutive positions, read as p[i] or p[i, token] like a
    [n, V] array, each row made from its logits when first read: a verify reads rows only up to
    the first rejection (llama.cpp's rows are read in place, only those asked for)."""

    def __init__(self, row_logits: Callable[[int], np.ndarray], n_rows: int, params: SamplingParams) -> None:
        self._row_logits, self._n, self._params = row_logits, n_rows, params
        self._rows: dict[int, np.ndarray] = {}

    def __len__(self) -> int:
        return self._n

    def _row(self, i: int) -> np.ndarray:
        if not 0 <= i < self._n:
            raise IndexError(i)
        if i not in self._rows:
            self._rows[i] = logits_to_probs(np.asarray(self._row_logits(i))[None], self._params)[0]
        return self._rows[i]

    def __getitem__(self, key):
        if isinstance(key, tuple):
            i, j = key
            return self._row(int(i))[j]
        return self._row(int(key))


def sample(probs, generator: Generator) -> int:
    """A token drawn from `probs` (any non-negative weights, not all zero), by inverse CDF over
    the tokens of non-zero weight (the same draw as over all of them, at a fraction of the cost
    where top-k or top-p leave few)."""
    probs = np.asarray(probs)
    kept = np.flatnonzero(probs)
    cdf = np.cumsum(probs[kept], dtype=np.float64)
    u = generator.random() * cdf[-1]
    return int(kept[min(np.searchsorted(cdf, u, side="right"), len(kept) - 1)])


AcceptRule = Callable[[object, object, list[int], Generator], tuple[int, int]]


def speculative_accept(p, q, draft: list[int], generator: Generator) -> tuple[int, int]:
    """Accept a prefix of `draft` and choose the next token, preserving the distribution p.

    p: [k+1, V] main-model probabilities at each draft position plus the bonus position (an
       array, or RowProbs, which makes each row when first read).
    q: [k, V] draft probabilities, or None for a deterministic (one-hot) drafter.
    Returns (number of draft tokens accepted, the token that follows them).

    A one-hot draft is judged as llama.cpp judges every draft: the main model samples each
    position with one draw of the stream, as plain decoding would, and the draft token stands
    while it matches. That keeps p exactly (the draft token is accepted with probability p_x,
    the most any rule can), and more: a seeded reply is plain decoding's reply, whatever was
    drafted and however long the adaptive schedule made the drafts.
    """
    if q is None:
        for i, token in enumerate(draft):
            sampled = sample(p[i], generator)
            if sampled != token:
                return i, sampled
        return len(draft), sample(p[len(draft)], generator)
    for i, token in enumerate(draft):
        p_x, q_x = float(p[i, token]), float(q[i, token])
        if q_x > 0 and generator.random() * q_x < p_x:
            continue  # accepted with probability min(1, p_x / q_x)
        residual = np.clip(np.asarray(p[i], dtype=np.float64) - np.asarray(q[i], dtype=np.float64), 0.0, None)
        total = float(residual.sum())
        # total == 0 only when p == q exactly, where rejection has probability 0.
        replacement = sample(residual if total > 0 else p[i], generator)
        return i, replacement
    return len(draft), sample(p[len(draft)], generator)
