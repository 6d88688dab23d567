"""The order of the draft models in the pair picker: the best first, so that the draft chosen for
the user (llama-server's draft-* types need one) is the one most likely to pay.

Best: one the engine can use (token by token before through text; llama-server only token by
token), not the main model's own weights, of the main model's family (its smaller sibling: the
same training, so it agrees most), well under half its size, nearest a tenth of it (the usual
sweet spot, as Discover ranks drafts: app.hub.drafts)."""

from __future__ import annotations

import math

from app.engine.drafting.compat import TOKEN_LEVEL, DraftCheck
from app.engine.gguf.info import GGUFInfo
from app.hub.draft_verdict import MAX_RATIO
from app.hub.drafts import TARGET_RATIO, family_query


def draft_rank(main: GGUFInfo, draft: GGUFInfo, check: DraftCheck, usable: bool, same: bool) -> tuple:
    """A sort key, lowest best. `usable`: the engine chosen can draft with it; `same`: it holds
    the main model's own weights."""
    level = 0 if usable and check.level == TOKEN_LEVEL else (1 if usable else 2)
    family = 0 if family_query(draft) == family_query(main) else 1
    ratio = draft.n_params / max(main.n_params, 1)
    size = 0 if ratio <= MAX_RATIO else (1 if ratio < 1 else 2)
    near_tenth = abs(math.log10(max(ratio, 1e-9)) - math.log10(TARGET_RATIO))
    return level, int(same), family, size, near_tenth
