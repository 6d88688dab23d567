"""How a draft model is shown in the pair picker's and the Compare view's lists: as is when it
shares the main model's vocabulary, marked "text-level" when it drafts through text, with the
reason when it cannot draft."""

from __future__ import annotations

from app.engine.compat import TOKEN_LEVEL, DraftCheck
from app.ui.library import LibraryEntry


def draft_title(title: str, check: DraftCheck) -> str:
    """A draft's line in a list: its title, marked when it drafts through text or cannot draft."""
    if check.level == TOKEN_LEVEL:
        return title
    if check.text_level:
        return f"{title} — text-level (other vocabulary)"
    return f"{title} — incompatible: {check.reason}"


def draft_tooltip(entry: LibraryEntry, main: LibraryEntry, check: DraftCheck) -> str:
    if not check:
        return f"Cannot draft for {main.title}: {check.reason}"
    if check.text_level:
        return (f"{entry.facts()}\nDrafts for {main.title} through text: its tokens are decoded and "
                f"re-tokenized with the main model's tokenizer ({check.token.reason}). The reply is "
                f"still the main model's own; each step costs more than a same-vocabulary draft.")
    return entry.facts()
