"""How a draft model is shown in the pair picker's and the Compare view's lists: as is when it
shares the main model's vocabulary, marked "text-level" when it drafts through text, with the
reason when it cannot draft, and marked when it holds the main model's own weights (a copy of
the same file drafts for itself: it accepts everything and costs as much, so it never pays)."""

from __future__ import annotations

from app.engine.drafting.compat import TOKEN_LEVEL, DraftCheck
from app.hub.draft_verdict import SELF_DRAFT_COST
from app.hub.identity import same_weights
from app.hub.library_entries import LibraryEntry

SAME_WEIGHTS = "same weights, 1x cost"  # short: the list is narrow; the tooltip says the rest


def is_same_model(entry: LibraryEntry, main: LibraryEntry) -> bool:
    """The draft is the main model's own weights (another copy of the file)."""
    return entry.info is not None and main.info is not None and same_weights(main.info, entry.info)


def draft_title(title: str, check: DraftCheck, same: bool = False) -> str:
    """A draft's line in a list: its title, marked when it drafts through text or cannot draft,
    or when it is the main model itself."""
    if same and check:
        return f"{title} — {SAME_WEIGHTS}"
    if check.level == TOKEN_LEVEL:
        return title
    if check.text_level:
        return f"{title} — text-level (other vocabulary)"
    return f"{title} — incompatible: {check.reason}"


def draft_tooltip(entry: LibraryEntry, main: LibraryEntry, check: DraftCheck, same: bool = False) -> str:
    if same and check:
        return (f"{entry.facts()}\nThe same weights as {main.title}: it would draft exactly what the main "
                f"model writes, and {SELF_DRAFT_COST}, so drafting can only slow it down.")
    if not check:
        return f"Cannot draft for {main.title}: {check.reason}"
    if check.text_level:
        return (f"{entry.facts()}\nDrafts for {main.title} through text: its tokens are decoded and "
                f"re-tokenized with the main model's tokenizer ({check.token.reason}). The reply is "
                f"still the main model's own; each step costs more than a same-vocabulary draft.")
    return entry.facts()
