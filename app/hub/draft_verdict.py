"""Will this model speed that one up as its draft? One verdict of three, in a person's words.

PAYS: it can draft (token by token, or through text: "text-level") and is small enough to save
time. NO_GAIN: it can draft, but will not pay: too big (more than MAX_RATIO of the main model's
parameters), the main model's own weights (it would draft exactly what the main model writes, at
the main model's cost), or priced out on this machine: where the main model's steps were measured
here (app.hub.draft_price), a draft that needs more than USUAL_ACCEPTANCE of its tokens accepted
to pay does not pay in practice. FAILS: it cannot draft for it, with the reason. Each verdict has
one colour wherever it is shown. Decided on headers and cached measurements alone (no Qt, no
torch, no network, nothing loaded).
"""

from __future__ import annotations

from dataclasses import dataclass

from app.engine.drafting.compat import DraftCheck
from app.engine.gguf.info import GGUFInfo
from app.hub.draft_price import DraftPrice
from app.hub.identity import same_header_weights, same_weights

PAYS, NO_GAIN, FAILS = "pays", "no-gain", "fails"
MAX_RATIO = 0.5  # a draft with more than half the main's parameters saves too little
# A model as its own draft, as Discover, the pair picker and the chat's note price it: the engine
# measures its step once for both (app.engine.backends.llamacpp.load.shared_step_curve).
SELF_DRAFT_COST = "a drafted token costs as much as a main-model token (1.00x)"
TEXT_LEVEL_COST = "another vocabulary: its drafts are re-tokenized, so each step costs more"
# A draft needing more of its tokens accepted than this to pay seldom pays: greedy drafts of a
# same-family model are accepted some 60-80% of the time (the window's real pair: 82% on a
# rewrite of code it had seen, where copying is easiest).
USUAL_ACCEPTANCE = 0.8
UNPRICED = "whether it pays here is measured when the main model is first loaded"


@dataclass(frozen=True)
class DraftVerdict:
    kind: str  # PAYS, NO_GAIN or FAILS
    text: str  # one line, without the main model's name: "text-level, 8% of its size: ..."

    @property
    def works(self) -> bool:
        return self.kind != FAILS


def draft_verdict(check: DraftCheck, draft: GGUFInfo, main: GGUFInfo, local: bool = True,
                  price: DraftPrice | None = None) -> DraftVerdict:
    """The verdict on `draft` drafting for `main`, given the engine's check of the two headers.
    `local`: both files are on this disk (the weights' identity is then checked on their bytes).
    `price`: what this machine's measured steps predict (app.hub.draft_price), None where the
    main model was never measured here."""
    if not check.compatible:
        return DraftVerdict(FAILS, f"cannot draft: {check.reason}")
    level = "text-level" if check.text_level else "same vocabulary"
    if (same_weights if local else same_header_weights)(main, draft):
        return DraftVerdict(NO_GAIN, f"works, but will not pay: it is the same model (the same weights): "
                                     f"{SELF_DRAFT_COST}, so drafting can only slow it down")
    ratio = draft.n_params / max(main.n_params, 1)
    share = f"{ratio:.0%}" if ratio >= 0.01 else "under 1%"
    if ratio > MAX_RATIO:
        bigger = "; it is the bigger model: rather find a draft for it" if ratio > 1 else ""
        return DraftVerdict(NO_GAIN, f"works ({level}), but will not pay: {ratio:.0%} of its size; "
                                     f"a draft must be well under half the main model's size{bigger}")
    how = (f"text-level draft, {share} of its size ({TEXT_LEVEL_COST})" if check.text_level else
           f"drafts token by token (same vocabulary), {share} of its size")
    if price is None:
        return DraftVerdict(PAYS, f"{how}; {UNPRICED}")
    if price.acceptance is None:
        return DraftVerdict(NO_GAIN, f"{how}, but will not pay on this machine: {price.prices()}, "
                                     f"so no draft length pays even with every token accepted")
    needs = f"{price.acceptance:.0%} of its drafts accepted ({price.length} a step)"
    if price.acceptance > USUAL_ACCEPTANCE:
        return DraftVerdict(NO_GAIN, f"{how}, but will hardly pay on this machine: {price.prices()}, "
                                     f"so it needs {needs} to pay, more than drafts usually get")
    return DraftVerdict(PAYS, f"{how}; it pays here with {needs} or more: {price.prices()}")
