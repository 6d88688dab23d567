"""How many tokens to draft at each step.

Drafting k tokens pays when the tokens they are expected to add outweigh what feeding k more
tokens to the main model's verify forward costs. Both sides are measured while generating:

- the acceptance probability per drafted token, alpha, as the maximum-likelihood estimate of a
  geometric run (accepted tokens over accepted tokens plus rejections), older trials decaying
  per trial so that a long accepted run is forgotten as fast as a string of rejections;
- the cost of a step (drafting plus verifying) as a line, seconds = a + b * k for k drafted
  tokens, fitted by decayed least squares (a draft model makes b large, prompt lookup small).

A step with k drafts yields on average E(k) = (1 - alpha^(k+1)) / (1 - alpha) tokens for a cost
a + b * k; the schedule picks the k <= draft_max that maximises E(k) / c(k)
(the objective of Leviathan et al. 2023, section 3.4, with the cost measured instead of assumed).
When drafting does not pay it drafts nothing, but still probes with one token every few steps so
that a copy-heavy stretch of text is noticed. The draft length never changes what is generated,
only how fast: outputs stay identical to plain decoding.
"""

from __future__ import annotations

from typing import Protocol

_DECAY = 0.9  # weight of the previous cost estimate per step: about the last 10 steps count
_TRIAL_DECAY = 0.85  # weight of the previous acceptance counts per judged draft token
_PROBE_EVERY = 4  # steps between one-token probes while drafting does not pay
_PRIOR_ALPHA = (0.5, 0.5)  # pseudo-counts (accepted, rejected), never decayed: alpha stays off 0 and 1
_PRIOR_SLOPE = 0.08  # extra cost per drafted token, relative to a step without drafts, until measured


class DraftSchedule(Protocol):
    def length(self, budget: int) -> int:
        """Most tokens to draft at this step (at most `budget`)."""

    def update(self, n_drafted: int, n_accepted: int, step_s: float) -> None:
        """What the last step drafted and kept, and how long drafting plus verifying took."""


class FixedDraftLength:
    """Always draft up to `draft_max` (llama.cpp's behaviour)."""

    def __init__(self, draft_max: int) -> None:
        self.draft_max = draft_max

    def length(self, budget: int) -> int:
        return min(self.draft_max, budget)

    def update(self, n_drafted: int, n_accepted: int, step_s: float) -> None:
        pass


class AdaptiveDraftLength:
    """Draft the length with the best expected tokens per second, from measured acceptance and cost."""

    def __init__(self, draft_max: int) -> None:
        self.draft_max = draft_max
        self.accepted = self.rejected = 0.0
        self._fit = _DecayedLine()
        self._idle_steps = 0

    @property
    def alpha(self) -> float:
        accepted, rejected = self.accepted + _PRIOR_ALPHA[0], self.rejected + _PRIOR_ALPHA[1]
        return accepted / (accepted + rejected)

    def length(self, budget: int) -> int:
        best = best_length(self.alpha, self._fit.relative_slope(), min(self.draft_max, budget))
        if best == 0 and budget > 0:
            self._idle_steps += 1
            if self._idle_steps >= _PROBE_EVERY:
                self._idle_steps = 0
                return 1
        return best

    def update(self, n_drafted: int, n_accepted: int, step_s: float) -> None:
        self._fit.add(n_drafted, step_s)
        if n_drafted == 0:
            return
        rejected = 1 if n_accepted < n_drafted else 0
        keep = _TRIAL_DECAY ** (n_accepted + rejected)  # one trial per token the main model judged
        self.accepted = self.accepted * keep + n_accepted
        self.rejected = self.rejected * keep + rejected


def expected_tokens(alpha: float, k: int) -> float:
    """Mean tokens one step yields with k drafts accepted independently with probability alpha."""
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def best_length(alpha: float, relative_slope: float, k_max: int) -> int:
    """argmax over k in [0, k_max] of E(k) / (1 + slope * k); ties go to the shorter draft."""
    best_k, best_rate = 0, 1.0
    for k in range(1, max(k_max, 0) + 1):
        rate = expected_tokens(alpha, k) / (1.0 + relative_slope * k)
        if rate > best_rate * 1.0001:
            best_k, best_rate = k, rate
    return best_k


class _DecayedLine:
    """seconds = a + b * k, fitted by least squares with exponentially decaying weights."""

    def __init__(self) -> None:
        self.w = self.sn = self.st = self.snn = self.snt = 0.0

    def add(self, n: int, seconds: float) -> None:
        if n < 0 or seconds <= 0:
            return
        self.w = self.w * _DECAY + 1.0
        self.sn = self.sn * _DECAY + n
        self.st = self.st * _DECAY + seconds
        self.snn = self.snn * _DECAY + n * n
        self.snt = self.snt * _DECAY + n * seconds

    def relative_slope(self) -> float:
        """b / a: the cost of one more drafted token relative to a step that drafts nothing."""
        if self.w < 2.0:
            return _PRIOR_SLOPE
        var = self.snn / self.w - (self.sn / self.w) ** 2
        if var < 0.25:  # all steps fed about the same number of tokens: no slope to see
            return _PRIOR_SLOPE
        b = (self.snt / self.w - (self.sn / self.w) * (self.st / self.w)) / var
        a = self.st / self.w - b * self.sn / self.w
        if a <= 0:
            return _PRIOR_SLOPE
        return min(max(b / a, 0.005), 2.0)
