"""What this machine's measured steps predict for a draft before it is tried: the prices the chat's
why panel shows once a reply runs (app.engine.loop.explain), from the step costs llama.cpp measured
when each model was first loaded here (app.engine.backends.llamacpp.cost caches them per file,
settings, layers offloaded, build and CPU).

A drafted token costs the draft model's one-token step against the main model's; a verify of k
drafts costs the main model's step feeding k + 1 tokens against one. A step with k drafts pays where
the tokens it is expected to yield beat its cost, which sets the acceptance a draft needs here. On
a 2-core CPU a verify costs nearly its length, and a draft a third of the main model's size may
need 98% acceptance: the size ratio alone said it pays.

Where the draft was never loaded here its step is estimated from the weights' sizes (a step reads
every weight once, so on a CPU it costs about its bytes); where the main model was never loaded,
nothing is predicted. Nothing is loaded or measured to find out.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from app.engine.gguf.info import GGUFInfo
from app.engine.loop.explain import break_even

if TYPE_CHECKING:
    from app.engine.backends.llamacpp.cost import StepCurve

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DraftPrice:
    draft_token: float  # a drafted token against a main-model token
    measured_draft: bool  # from the draft's own measured step; False: estimated from the sizes
    verify_4: float  # a verify of 4 drafts against a main-model token
    acceptance: float | None  # what a draft needs to be accepted at to pay here; None: it never pays
    length: int  # the draft length that needs the least acceptance

    def prices(self) -> str:
        """'a drafted token costs 0.62x a main-model token here and a verify of 4 drafts 2.4x'."""
        guess = "" if self.measured_draft else " (by its size: it was never loaded here)"
        return (f"a drafted token costs {'' if self.measured_draft else 'about '}{self.draft_token:.2f}x "
                f"a main-model token here{guess} and a verify of 4 drafts {self.verify_4:.1f}x")


def measured_curve(path: str | Path | None, n_layers: int) -> StepCurve | None:
    """The step curve llama.cpp measured for this file when the window or `specula run` last loaded
    it with the default settings (all layers on a GPU, or none), or None."""
    if path is None or not Path(path).is_file():
        return None
    try:
        from app.engine.backends.llamacpp import cost
        from app.engine.backends.llamacpp import lib as llamacpp_lib
        from app.engine.backends.llamacpp.kv import LlamaSettings

        build = llamacpp_lib.build_key()
    except ImportError as exc:  # no llama.cpp here: nothing was measured
        log.debug("no llama.cpp to read measured steps for: %s", exc)
        return None
    for layers in (0, n_layers + 1):
        curve = cost.cached_curve(Path(path), LlamaSettings(), layers, build)
        if curve is not None:
            return curve
    return None


def price_draft(main: GGUFInfo, main_file: str | Path | None, draft: GGUFInfo,
                draft_file: str | Path | None = None) -> DraftPrice | None:
    """The price of `draft` drafting for `main` on this machine, from the main model's measured
    steps and the draft's (or its size); None where the main model was never measured here."""
    main_curve = measured_curve(main_file, main.n_layers)
    if main_curve is None:
        return None
    draft_curve = measured_curve(draft_file, draft.n_layers)
    if draft_curve is not None:
        token = draft_curve.cost(1) / main_curve.cost(1)
    else:
        token = draft.memory_bytes("gguf") / max(main.memory_bytes("gguf"), 1)
    verdict = break_even(lambda k: main_curve.ratio(k + 1) + k * token, token, None)
    return DraftPrice(token, draft_curve is not None, verdict.verify_4, verdict.acceptance, verdict.length)
