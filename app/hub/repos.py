"""GGUF repositories on the hub: search them, list their GGUF files by quantization.

Everything goes through huggingface_hub's HfApi (list_models, model_info with files metadata), so
HF_ENDPOINT, HF_TOKEN, the saved token and offline mode behave as in every other HF tool.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from huggingface_hub import HfApi, constants
from huggingface_hub.utils import get_session

from app.hub import fields
from app.hub.errors import HubError, check_online, endpoint, hub_call
from app.hub.remote import check_repo_id
from app.hub.names import is_gguf, is_model_file, quant_label, quant_rank, split_name

log = logging.getLogger(__name__)

SORTS = {"downloads": "downloads", "likes": "likes", "recent": "last_modified"}
_EXPAND = ["downloads", "likes", "lastModified", "createdAt", "gated", "tags", "gguf"]
_PROBE_TIMEOUT_S = 5.0
# A search of several words asks the hub for this many times the results wanted (at most
# _MAX_ASKED), since the words matched here leave out most of what the longest one finds.
_WIDEN, _MAX_ASKED = 10, 1000


@dataclass(frozen=True)
class RepoResult:
    repo_id: str
    downloads: int
    likes: int
    last_modified: datetime | None
    gated: bool  # needs a token and accepted terms to download
    tags: tuple[str, ...]
    n_params: int | None  # from the hub's GGUF summary when it has one
    architecture: str | None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["last_modified"] = self.last_modified.isoformat() if self.last_modified else None
        d["tags"] = list(self.tags)
        return d


@dataclass(frozen=True)
class GGUFModelFile:
    """One downloadable model: a GGUF file, or all parts of a split one."""

    repo_id: str
    filename: str  # the file (or first part) to pass to fetch_remote_info / download_gguf
    quant: str | None  # "Q4_K_M", ...; None when the name does not say
    size_bytes: int  # all parts together
    parts: tuple[str, ...]  # repo paths; one item unless split
    sha256: str | None  # of the file (first part when split), from the hub's LFS metadata

    @property
    def is_split(self) -> bool:
        return len(self.parts) > 1

    @property
    def complete(self) -> bool:
        """False when the repo lacks some parts of a split model."""
        split = split_name(self.filename)
        return split is None or len(self.parts) == split.count

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "parts": list(self.parts), "is_split": self.is_split,
                "complete": self.complete}


def _probe() -> None:
    """One quick request before searching: list_models retries a dead connection for ~25 s
    (huggingface_hub's backoff), while a user without network should hear so at once."""
    with hub_call("search the hub"):
        get_session().head(f"{endpoint()}/", timeout=_PROBE_TIMEOUT_S)


def search_words(query: str) -> list[str]:
    """The words of a search, lower-cased: each must be in a repository's id for it to match."""
    return [w for w in query.lower().split() if w]


def search_gguf(query: str, sort: str = "downloads", limit: int = 30) -> list[RepoResult]:
    """GGUF repositories whose id holds every word of `query` ("qwen coder" finds
    Qwen2.5-Coder), best first by `sort` (downloads, likes or recent). The hub's `search` matches
    one substring of the id, so it is asked for the longest word (the fewest results), more of
    them than `limit`, and the other words are matched here."""
    if sort not in SORTS:
        raise HubError(f"unknown sort {sort!r} (use {', '.join(SORTS)})")
    words = search_words(query)
    asked = max(words, key=len) if words else None
    wanted = max(1, limit)
    check_online("search the hub")
    _probe()
    api = HfApi(endpoint=endpoint())
    with hub_call("search the hub"):
        models = list(api.list_models(search=asked, filter="gguf", sort=SORTS[sort],
                                      limit=wanted if len(words) < 2 else min(wanted * _WIDEN, _MAX_ASKED),
                                      expand=_EXPAND))
    others = words[:]
    if asked is not None:
        others.remove(asked)  # the hub matched that one its own way
    found = [r for r in map(_repo_result, models) if r is not None]
    return [r for r in found if all(w in r.repo_id.lower() for w in others)][:wanted]


def _repo_result(model: Any) -> RepoResult | None:
    """A search hit with every field checked (app.hub.fields); None for one without a usable id."""
    repo_id = getattr(model, "id", None)
    if not isinstance(repo_id, str) or not repo_id or len(repo_id) > 200:
        return None
    gguf = getattr(model, "gguf", None)
    gguf = gguf if isinstance(gguf, dict) else {}
    return RepoResult(
        repo_id=repo_id, downloads=fields.count(getattr(model, "downloads", 0)),
        likes=fields.count(getattr(model, "likes", 0)),
        last_modified=fields.when(getattr(model, "last_modified", None)) or fields.when(getattr(model, "created_at", None)),
        gated=bool(getattr(model, "gated", False)), tags=fields.texts(getattr(model, "tags", ())),
        n_params=fields.optional_int(gguf.get("total")), architecture=fields.optional_text(gguf.get("architecture")),
    )


def list_gguf_files(repo_id: str, revision: str | None = None) -> list[GGUFModelFile]:
    """The GGUF models of a repository, split parts counted as one, smallest first."""
    return gguf_listing(repo_id, revision)[0]


def gguf_listing(repo_id: str, revision: str | None = None) -> tuple[list[GGUFModelFile], int]:
    """(list_gguf_files, how many GGUF names were left out because a download would refuse them)."""
    check_repo_id(repo_id)
    check_online(f"list the files of {repo_id}")
    api = HfApi(endpoint=endpoint())
    with hub_call(f"list the files of {repo_id}", repo_id):
        info = api.model_info(repo_id, revision=revision, files_metadata=True,
                              timeout=constants.HF_HUB_ETAG_TIMEOUT * 3)
    names = [s for s in (info.siblings or []) if isinstance(getattr(s, "rfilename", None), str)]
    ggufs = [s for s in names if is_gguf(s.rfilename) and is_model_file(s.rfilename)]
    usable = [s for s in ggufs if fields.downloadable_name(s.rfilename)]
    return _group_parts(repo_id, usable), len(ggufs) - len(usable)


def _group_parts(repo_id: str, siblings: list[Any]) -> list[GGUFModelFile]:
    groups: dict[str, list[Any]] = {}
    for s in siblings:
        split = split_name(s.rfilename)
        groups.setdefault(split.first if split else s.rfilename, []).append(s)
    files = []
    for first, members in groups.items():
        members.sort(key=lambda s: s.rfilename)
        head = next((s for s in members if s.rfilename == first), None)
        sha = getattr(head.lfs, "sha256", None) if head is not None and head.lfs is not None else None
        sha = sha if isinstance(sha, str) and len(sha) == 64 and all(c in "0123456789abcdef" for c in sha) else None
        files.append(GGUFModelFile(
            repo_id=repo_id, filename=first, quant=quant_label(first),
            size_bytes=sum(fields.count(s.size) for s in members),
            parts=tuple(s.rfilename for s in members), sha256=sha,
        ))
    files.sort(key=lambda f: (f.size_bytes or 0, quant_rank(f.quant), f.filename))
    return files


def group_by_quant(files: list[GGUFModelFile]) -> dict[str, list[GGUFModelFile]]:
    """Quantization label -> its files ("other" when the name does not say), smallest first."""
    groups: dict[str, list[GGUFModelFile]] = {}
    for f in sorted(files, key=lambda f: (quant_rank(f.quant), f.size_bytes)):
        groups.setdefault(f.quant or "other", []).append(f)
    return groups
