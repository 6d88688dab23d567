"""Discover's draft questions, as plain functions HubCalls runs on its workers (no Qt): what the
measured steps here predict for the selected file as a draft, and which hub models can draft for a
main model. The hub modules are imported inside them, as in app.worker.hub_tasks: huggingface_hub
takes a few tenths of a second to import, which the window should not spend before it opens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from app.engine.gguf.info import GGUFInfo
    from app.hub.draft_price import DraftPrice
    from app.hub.drafts import DraftSuggestion


@dataclass(frozen=True)
class DraftSearch:
    """Drafts for one main model: hub repositories worth a look and models already here."""

    main_key: str
    query: str  # what the hub was searched for (the main model's family)
    hub: tuple[DraftSuggestion, ...]  # best first, one per repository
    local: tuple[DraftSuggestion, ...]


def local_copy(info: GGUFInfo, downloaded: str | None = None) -> str | None:
    """The file on this disk with these weights: a download of it, else the built-in model that is
    the same model (whose measured steps then price it); None when it is only on the hub."""
    if downloaded:
        return downloaded
    from app.hub.identity import same_header_weights
    from app.hub.library import builtin_models

    return next((str(m.path) for m in builtin_models() if m.info is not None and same_header_weights(m.info, info)),
                None)


def price_for(main: GGUFInfo, main_file: str | None, draft: GGUFInfo, draft_file: str | None) -> DraftPrice | None:
    """app.hub.draft_price.price_draft, each model priced by its copy on this disk where it has one."""
    from app.hub.draft_price import price_draft

    return price_draft(main, main_file or local_copy(main), draft, local_copy(draft, draft_file))


def drafts_for(main_key: str, main: GGUFInfo, main_repo: str | None) -> DraftSearch:
    """Smaller models that can draft for `main` (app.hub.drafts.suggest_drafts): from the library,
    and from a hub search for its family, each checked on its header read with range requests."""
    from app.hub.drafts import family_query, suggest_drafts

    query = family_query(main)
    found = suggest_drafts(main, query=query, main_repo=main_repo, limit=12)
    hub, seen = [], set()
    for s in found:
        if s.source == "hub" and s.repo_id not in seen:
            seen.add(s.repo_id)
            hub.append(s)
    return DraftSearch(main_key, query, tuple(hub), tuple(s for s in found if s.source == "local"))
