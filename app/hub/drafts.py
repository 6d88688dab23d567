"""Draft models for a main model: smaller models, same vocabulary first, best first.

A draft only helps when the engine's check on the two headers passes and it is much cheaper than
the main model. The main model's own vocabulary (llama.cpp's rules) drafts token by token; another
vocabulary that both tokenizers can handle drafts through text, which costs more per step, so
those rank after every same-vocabulary one. Candidates come from the local library (free to
try) and from a hub search for the main model's family (e.g. "Llama-3" for Llama 3.1 8B, which
finds the Llama 3.2 1B repos); hub candidates are checked on headers read with range requests, so
nothing is downloaded to find out a draft cannot be used.

Ranking: a draft around a tenth of the main's parameters is the usual sweet spot (llama.cpp's
Llama 3.1 8B + 3.2 1B, Qwen2.5 7B + 0.5B); closer to that ratio ranks higher, local before hub.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.engine.drafting.compat import TEXT_LEVEL, TOKEN_LEVEL, DraftCheck, check_draft
from app.engine.errors import SpeculaError
from app.engine.gguf.info import GGUFInfo
from app.hub.draft_verdict import MAX_RATIO  # a draft with more than half the main's parameters saves too little
from app.hub.errors import OfflineError
from app.hub.library import LocalModel, list_local_models
from app.hub.names import params_from_name, quant_label, quant_rank
from app.hub.remote import fetch_remote_header, fetch_remote_info
from app.hub.repos import GGUFModelFile, RepoResult, list_gguf_files, search_gguf

log = logging.getLogger(__name__)

TARGET_RATIO = 0.1
# Drafts are small, so their quality matters more than their size: prefer 8-bit.
_PREFERRED_QUANTS = ("Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "F16", "BF16")
_STOP_WORDS = {"instruct", "chat", "it", "base", "gguf", "hf", "model", "preview"}


@dataclass(frozen=True)
class DraftSuggestion:
    source: str  # "local" | "hub"
    name: str
    repo_id: str | None
    filename: str | None  # repo path (hub) or file name (local)
    path: Path | None  # local file, None for hub suggestions
    size_bytes: int
    n_params: int
    ratio: float  # draft parameters / main parameters
    info: GGUFInfo = field(repr=False)
    level: str = TOKEN_LEVEL  # TOKEN_LEVEL (same vocabulary) or TEXT_LEVEL (through text)
    repo: RepoResult | None = field(default=None, repr=False)  # the search hit (hub suggestions)

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "name": self.name, "repo_id": self.repo_id,
                "filename": self.filename, "path": str(self.path) if self.path else None,
                "size_bytes": self.size_bytes, "n_params": self.n_params, "ratio": self.ratio,
                "level": self.level}


def check_remote_pair(main: GGUFInfo, repo_id: str, filename: str,
                      revision: str | None = None) -> DraftCheck:
    """Whether (and how) a hub file can draft for `main`: the engine's check on the two headers."""
    return check_draft(main, fetch_remote_info(repo_id, filename, revision))


def family_query(main: GGUFInfo) -> str:
    """A hub search for the main model's family: its base name without size, quantization or
    minor version ("Llama-3.1" -> "Llama-3", "Qwen2.5 7B Instruct" -> "Qwen2")."""
    base = main.metadata.get("general.basename")
    words = re.split(r"[\s_-]+", str(base or main.name or main.architecture))
    kept = []
    for w in words:
        if not w or w.lower() in _STOP_WORDS or quant_label(w + ".gguf") or params_from_name(w):
            break
        kept.append(w)
    query = "-".join(kept) or main.architecture
    return re.sub(r"(\d)\.\d+$", r"\1", query)


def _score(s: DraftSuggestion) -> tuple[int, float, int, int]:
    return (0 if s.level == TOKEN_LEVEL else 1, abs(math.log10(max(s.ratio, 1e-9)) - math.log10(TARGET_RATIO)),
            0 if s.source == "local" else 1, s.size_bytes)


def _usable(main: GGUFInfo, draft: GGUFInfo) -> tuple[float, str] | None:
    """(size ratio, drafting level) of a draft worth suggesting; None for one that is not."""
    ratio = draft.n_params / max(main.n_params, 1)
    check = check_draft(main, draft)
    if ratio > MAX_RATIO or not check:
        return None
    return ratio, check.level or TEXT_LEVEL


def _local_suggestions(main: GGUFInfo, local: Sequence[LocalModel]) -> list[DraftSuggestion]:
    out = []
    for m in local:
        if not m.usable or m.info is None:
            continue
        usable = _usable(main, m.info)
        if usable is not None:
            out.append(DraftSuggestion("local", m.name, m.repo_id, m.path.name, m.path,
                                       m.size_bytes, m.info.n_params, usable[0], m.info, usable[1]))
    return out


def _pick_file(files: Sequence[GGUFModelFile]) -> GGUFModelFile | None:
    whole = [f for f in files if not f.is_split]
    for quant in _PREFERRED_QUANTS:
        for f in whole:
            if f.quant == quant:
                return f
    return min(whole, key=lambda f: (quant_rank(f.quant) < quant_rank("Q4"), f.size_bytes), default=None)


def _hub_suggestions(main: GGUFInfo, query: str, main_repo: str | None,
                     max_checks: int) -> list[DraftSuggestion]:
    repos = [r for r in search_gguf(query, "downloads", limit=30) if r.repo_id != main_repo]
    # Repos whose name says they are small enough first; those that say they are too big never.
    sized = [(r, r.n_params or params_from_name(r.repo_id)) for r in repos]
    sized = [(r, n) for r, n in sized if n is None or n <= main.n_params * MAX_RATIO * 1.2]
    sized.sort(key=lambda rn: rn[1] is None)
    out = []
    for repo, _ in sized[:max_checks]:
        try:
            pick = _pick_file(list_gguf_files(repo.repo_id))
            if pick is None:
                continue
            header = fetch_remote_header(repo.repo_id, pick.filename)
        except OfflineError:
            raise
        except SpeculaError as exc:  # a gated or broken candidate is skipped, not fatal
            log.info("draft candidate %s skipped: %s", repo.repo_id, exc)
            continue
        usable = _usable(main, header.info)
        if usable is not None:
            out.append(DraftSuggestion("hub", f"{repo.repo_id}/{pick.filename}", repo.repo_id,
                                       pick.filename, None, pick.size_bytes,
                                       header.info.n_params, usable[0], header.info, usable[1], repo))
    return out


def suggest_drafts(main: GGUFInfo, *, local: Sequence[LocalModel] | None = None,
                   search_hub: bool = True, query: str | None = None, main_repo: str | None = None,
                   limit: int = 5, max_remote_checks: int = 6) -> list[DraftSuggestion]:
    """Drafts for `main`, best first (same vocabulary before text-level): local models (the library unless `local` is
    given) and, with `search_hub`, hub repos of the same family. Offline, the hub part raises
    OfflineError only when there are no local suggestions to return."""
    if local is None:
        local = list_local_models()
    found = _local_suggestions(main, local)
    if search_hub:
        try:
            found += _hub_suggestions(main, query or family_query(main), main_repo, max_remote_checks)
        except OfflineError:
            if not found:
                raise
            log.info("offline: draft suggestions from the local library only")
    found.sort(key=_score)
    return found[:limit]
