"""Partial downloads that survive a cancel, a failure or a restart, so the app can offer to resume.

Each partial file (`blobs/<etag>.incomplete` in the HF cache, huggingface_hub's `local_dir`
incomplete path in a folder) has a `.json` sidecar saying what it is; download_gguf resumes a
partial by itself, this module only lists and discards them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from app.hub.disk import hub_cache_dir, size_or_zero


@dataclass(frozen=True)
class PendingDownload:
    """A partial download; download_gguf(repo_id, filename, dest_dir) resumes it."""

    repo_id: str
    filename: str  # the model's file (first part when split)
    part: str  # the file this partial belongs to
    revision: str | None
    dest_dir: Path | None
    partial: Path
    done: int
    total: int


def sidecar(partial: Path) -> Path:
    return partial.with_name(partial.name + ".json")


def write_sidecar(partial: Path, repo_id: str, filename: str, part: str, revision: str | None,
                  dest_dir: Path | None, size: int) -> None:
    record = {"repo_id": repo_id, "filename": filename, "part": part, "revision": revision,
              "dest_dir": str(dest_dir) if dest_dir else None, "size": size}
    sidecar(partial).write_text(json.dumps(record))



def pending_downloads(extra_folders: list[Path] | tuple[Path, ...] = ()) -> list[PendingDownload]:
    """Partials in the HF cache and under the given download folders, newest first."""
    sidecars = list(hub_cache_dir().glob("*/blobs/*.incomplete.json"))
    for folder in extra_folders:
        sidecars += (Path(folder) / ".cache" / "huggingface" / "download").rglob("*.incomplete.json")
    found = []
    for path in sidecars:
        partial = path.with_name(path.name.removesuffix(".json"))
        try:
            rec = json.loads(path.read_text())
            item = PendingDownload(rec["repo_id"], rec["filename"], rec["part"], rec.get("revision"),
                                   Path(rec["dest_dir"]) if rec.get("dest_dir") else None,
                                   partial, size_or_zero(partial), int(rec["size"]))
            mtime = partial.stat().st_mtime
        except (OSError, ValueError, KeyError, TypeError):
            continue  # a sidecar without its partial, or not ours
        found.append((mtime, item))
    return [item for _, item in sorted(found, key=lambda x: x[0], reverse=True)]


def discard_partial(item: PendingDownload) -> int:
    """Delete a partial download; returns the bytes freed."""
    size = size_or_zero(item.partial)
    item.partial.unlink(missing_ok=True)
    sidecar(item.partial).unlink(missing_ok=True)
    return size
