"""The local library: every GGUF model on this machine that Specula can offer.

Three sources: the built-in demo models, the Hugging Face cache (huggingface_hub's scan_cache_dir,
so only complete files that a snapshot points to are seen: partial `.incomplete` blobs never are),
and folders the user added (searched recursively for `*.gguf`, hidden folders such as a local
download's `.cache/` skipped). Each model comes with its header facts, or the one-line reason it is
unusable. Split models (`-00001-of-0000N`) are one entry; vision projectors are left out.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from huggingface_hub import scan_cache_dir
from huggingface_hub.errors import CacheNotFound

from app.engine.errors import SpeculaError
from app.engine.gguf.info import GGUFInfo, read_gguf_info
from app.hub import builtin
from app.hub.disk import hub_cache_dir, size_or_zero
from app.hub.errors import HubError
from app.hub.identity import same_file, same_weights
from app.hub.names import is_model_file, model_title, split_name

log = logging.getLogger(__name__)

# Header reads are cached by (path, size, mtime): the window refreshes the library often.
_INFO_CACHE: dict[tuple[str, int, int], GGUFInfo | str] = {}


@dataclass(frozen=True)
class LocalModel:
    path: Path  # the file, or the first part of a split model
    source: str  # "builtin" | "hf-cache" | "folder"
    name: str  # display name, e.g. "SmolLM2 135M Instruct (Q4_1)" or "owner/repo-GGUF (Q4_K_M)"
    repo_id: str | None
    size_bytes: int
    info: GGUFInfo | None = field(repr=False)  # header facts; None when unreadable
    error: str | None  # why it is unusable, else None
    parts: tuple[Path, ...] = field(default=())  # every file of the model (split parts)
    same_as: str | None = None  # the built-in model with these very weights (another file of them)
    repo_file: str | None = None  # the file's path in its repository (HF cache), e.g. "Q4/m-Q4_0.gguf"
    copies: tuple[LocalModel, ...] = field(default=(), repr=False)  # the same file elsewhere: one entry

    @property
    def usable(self) -> bool:
        return self.error is None and self.info is not None

    def to_dict(self) -> dict[str, Any]:
        info = self.info
        return {
            "path": str(self.path), "source": self.source, "name": self.name, "repo_id": self.repo_id,
            "size_bytes": self.size_bytes, "error": self.error, "parts": [str(p) for p in self.parts],
            "architecture": info.architecture if info else None,
            "n_params": info.n_params if info else None,
            "file_type": info.file_type if info else None,
            "context_length": info.context_length if info else None,
            "vocab_size": info.vocab_size if info else None,
            "has_chat_template": info.has_chat_template if info else None,
            "same_as": self.same_as,
            "copies": [str(c.path) for c in self.copies],
        }


def _header(path: Path) -> tuple[GGUFInfo | None, str | None]:
    try:
        st = path.stat()
    except OSError as exc:
        return None, f"{path.name}: cannot read file ({exc.strerror})"
    key = (str(path), st.st_size, st.st_mtime_ns)
    if key not in _INFO_CACHE:
        try:
            _INFO_CACHE[key] = read_gguf_info(path)
        except SpeculaError as exc:
            _INFO_CACHE[key] = str(exc)
    found = _INFO_CACHE[key]
    return (found, None) if isinstance(found, GGUFInfo) else (None, found)


def _model(parts: list[Path], source: str, name: str, repo_id: str | None,
           sizes: Sequence[int] | None = None) -> LocalModel:
    parts = sorted(parts)
    first = parts[0]
    size = sum(sizes) if sizes is not None else sum(size_or_zero(p) for p in parts)
    info, error = _header(first)
    split = split_name(first.name)
    if split is not None and error is None:
        have = {p.name for p in parts}
        missing = [p for p in split.parts() if p.rsplit("/", 1)[-1] not in have]
        error = (f"{first.name}: split model with {len(missing)} of {split.count} parts missing"
                 if missing else
                 f"{first.name}: split into {split.count} files, which Specula cannot load yet "
                 f"(merge them with `llama-gguf-split --merge`)")
    return LocalModel(first, source, name, repo_id, size, info, error, tuple(parts))



def _group_split(paths: Iterable[tuple[str, Path]]) -> dict[str, list[Path]]:
    """relative name -> files; split parts grouped under their first part's name."""
    groups: dict[str, list[Path]] = {}
    for rel, path in paths:
        split = split_name(rel)
        groups.setdefault(split.first if split else rel, []).append(path)
    return groups


def builtin_models() -> list[LocalModel]:
    """The installed built-in models. One joined on demand (the 1.6 GB pair) is listed once it
    has been joined: reading the library never copies gigabytes."""
    models = []
    for m in builtin.BUILTIN_MODELS:
        if not builtin.is_installed(m.key) or builtin.needs_joining(m.key):
            continue
        try:
            path = builtin.builtin_path(m.key)  # assembles Gemma from its parts the first time
        except (OSError, SpeculaError) as exc:
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            models.append(LocalModel(Path(m.key), "builtin", m.title, None, 0, None,
                                     f"{m.key}: {first}", ()))
            continue
        models.append(_model([path], "builtin", m.title, None))
    return models


def cache_models() -> list[LocalModel]:
    """GGUF models in the Hugging Face cache (newest revision of each file)."""
    try:
        cache = scan_cache_dir(hub_cache_dir())
    except (CacheNotFound, ValueError, OSError):
        return []
    for warning in cache.warnings:  # e.g. a repo holding only a partial download: not an error
        log.info("Hugging Face cache: %s", warning)
    models = []
    for repo in cache.repos:
        if repo.repo_type != "model":
            continue
        seen_blobs: set[Path] = set()
        for rev in sorted(repo.revisions, key=lambda r: r.last_modified, reverse=True):
            files = [(f.file_path.relative_to(rev.snapshot_path).as_posix(), f) for f in rev.files]
            files = [(rel, f) for rel, f in files if is_model_file(rel) and f.blob_path not in seen_blobs]
            by_path = {f.file_path: f for _, f in files}
            for rel, parts in _group_split((rel, f.file_path) for rel, f in files).items():
                seen_blobs.update(by_path[p].blob_path for p in parts)
                model = _model(parts, "hf-cache", f"{repo.repo_id}/{rel}", repo.repo_id,
                               [by_path[p].size_on_disk for p in parts])
                models.append(replace(model, repo_file=rel, name=model_title(
                    repo.repo_id, rel, model.info.file_type if model.info else None)))
    return _unique_names(one_entry_per_file(models))


def _unique_names(models: list[LocalModel]) -> list[LocalModel]:
    """Two files of one repository with one quantization keep their file names apart."""
    count: dict[str, int] = {}
    for m in models:
        count[m.name] = count.get(m.name, 0) + 1
    return [replace(m, name=f"{m.name} · {m.path.name}") if count[m.name] > 1 else m for m in models]


def folder_models(folder: Path) -> list[LocalModel]:
    """GGUF models under a user-added folder (hidden folders skipped)."""
    folder = Path(folder).expanduser()
    if not folder.is_dir():
        return []
    found = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in files:
            path = Path(root) / name
            rel = path.relative_to(folder).as_posix()
            if is_model_file(rel) and not name.startswith("."):
                found.append((rel, path))
    return [_model(parts, "folder", rel, None) for rel, parts in _group_split(found).items()]


def list_local_models(extra_folders: Sequence[Path] = (), include_builtin: bool = True) -> list[LocalModel]:
    """Every local GGUF model: built-in first, then the HF cache, then the folders (by name).
    A file reachable from two sources (a folder inside the cache) is listed once."""
    by_name = lambda models: sorted(models, key=lambda m: m.name.lower())  # noqa: E731
    candidates = builtin_models() if include_builtin else []
    candidates += by_name(cache_models())
    for folder in extra_folders:
        candidates += by_name(folder_models(Path(folder)))
    seen: set[str] = set()
    out = []
    for model in candidates:
        real = os.path.realpath(model.path)
        if real not in seen:
            seen.add(real)
            out.append(model)
    return _mark_builtin_copies(one_entry_per_file(out))


def one_entry_per_file(models: Sequence[LocalModel]) -> list[LocalModel]:
    """The same file found twice is one entry: a download of a built-in model, a folder holding
    a copy of a cached file, one file of a repository in two revisions. The first found keeps
    the entry and lists the others as its copies; callers list built-ins first (a built-in's
    file belongs to its package, is what `-m smollm2-135m` and the demo load, and cannot be
    deleted here), then the cache's newest revision, then the folders."""
    kept: list[LocalModel] = []
    for model in models:
        at = next((i for i, k in enumerate(kept) if _same_file(k, model)), None)
        if at is None:
            kept.append(model)
        else:
            keeper = kept[at]
            kept[at] = replace(keeper, copies=keeper.copies + (replace(model, copies=()),) + model.copies)
    return kept


def _same_file(a: LocalModel, b: LocalModel) -> bool:
    if not (a.usable and b.usable):
        return False
    if a.repo_id and a.repo_id == b.repo_id and a.repo_file == b.repo_file:
        return True  # one repository's file, in two revisions
    return a.size_bytes == b.size_bytes and same_file(a.info, b.info)


def _mark_builtin_copies(models: list[LocalModel]) -> list[LocalModel]:
    """A downloaded copy of a built-in model says so (same_as): it is already here."""
    builtins = [m for m in models if m.source == "builtin" and m.usable]
    out = []
    for m in models:
        twin = None if m.source == "builtin" or not m.usable else next(
            (b.name for b in builtins if same_weights(b.info, m.info)), None)
        out.append(replace(m, same_as=twin) if twin else m)
    return out


def delete_local_model(model: LocalModel) -> int:
    """Delete a model's files and every copy of them (one_entry_per_file) and return the bytes
    freed. The UI asks the user first. A built-in model's own file is never deleted: with copies
    only the copies go, without any it is refused. In the HF cache a blob is kept while another
    revision uses it."""
    targets = ([] if model.source == "builtin" else [replace(model, copies=())]) + list(model.copies)
    if not targets:
        raise HubError(f"{model.name} is a built-in model and cannot be deleted "
                       f"(uninstall its package instead)")
    for target in targets:  # all first: a model half deleted and then refused helps nobody
        _refuse_to_delete(target)
    return sum(_delete_files(target) for target in targets)


def _refuse_to_delete(model: LocalModel) -> None:
    for part in model.parts or (model.path,):
        if model.source == "builtin" or builtin.title_of_path(part) is not None:
            raise HubError(f"not deleting {part}: it is a built-in model's file")  # e.g. a folder holding it
        if model.source == "hf-cache":
            _refuse_outside_cache(part)


def _delete_files(model: LocalModel) -> int:
    parts = model.parts or (model.path,)
    freed = 0
    try:
        for part in parts:
            freed += _delete_cached(part) if model.source == "hf-cache" else _delete_file(part)
    except OSError as exc:
        raise HubError(f"cannot delete {model.name}: {exc.strerror or exc}") from exc
    _INFO_CACHE.clear()
    log.info("deleted %s (%d bytes freed)", model.name, freed)
    return freed


def _refuse_outside_cache(pointer: Path) -> None:
    """Refuse a cache entry that, once links are followed, lies outside its repo's own
    snapshots/ folder: a snapshots/ or snapshots/<commit> that links elsewhere would otherwise
    make the delete remove a file there. The entry itself may be a link (to its blob); the
    folders above it may not lead out. huggingface_hub's own deletion likewise acts only on
    the paths its scan found inside the repo folder."""
    snapshots = next((p for p in pointer.parents if p.name == "snapshots"), None)
    if snapshots is None:
        return  # a --dir download or a plain file: deleted where it is
    root = Path(os.path.realpath(snapshots.parent)) / "snapshots"
    where = Path(os.path.realpath(pointer.parent)) / pointer.name
    if Path(os.path.realpath(snapshots)) != root or not where.is_relative_to(root):
        raise HubError(f"not deleting {pointer}: it leads to {where}, outside the cache folder {root}")


def _delete_file(path: Path) -> int:
    size = size_or_zero(path)
    path.unlink(missing_ok=True)
    # A --dir download also left huggingface_hub's metadata file; drop it so nothing claims the file.
    meta = path.parent / ".cache" / "huggingface" / "download" / (path.name + ".metadata")
    meta.unlink(missing_ok=True)
    return size


def _delete_cached(pointer: Path) -> int:
    """Remove a snapshot entry, and its blob unless another snapshot still points to it."""
    snapshots = next((p for p in pointer.parents if p.name == "snapshots"), None)
    if snapshots is None or not pointer.is_symlink():
        return _delete_file(pointer)  # a cache without symlinks (Windows) holds plain files
    blob = Path(os.path.abspath(pointer.parent / os.readlink(pointer)))
    pointer.unlink()
    # The commit folder stays, even empty: refs/ names it, and a ref to a missing snapshot makes
    # huggingface_hub's scan call the whole repo corrupt.
    commit_dir = next(p for p in pointer.parents if p.parent == snapshots)
    _prune_empty(pointer.parent, stop=commit_dir)
    if not _in_blobs(blob, snapshots.parent / "blobs"):
        # A link the cache would never hold (made by hand, or planted): its target is not ours.
        log.warning("not deleting %s: %s points outside %s", blob, pointer, snapshots.parent / "blobs")
        return 0
    still_used = any(p.is_symlink() and Path(os.path.abspath(p.parent / os.readlink(p))) == blob
                     for p in snapshots.rglob("*"))
    if still_used or not (blob.exists() or blob.is_symlink()):
        return 0
    size = 0 if blob.is_symlink() else size_or_zero(blob)  # unlinking a link frees only the link
    blob.unlink()
    return size


def _in_blobs(blob: Path, blobs: Path) -> bool:
    """The blob is an entry of the repo's own blobs/ folder, by name and once that folder is
    resolved (a blobs/ that is itself a link elsewhere is not the cache's)."""
    return (blob.parent == Path(os.path.abspath(blobs)) and blobs.is_dir() and not blobs.is_symlink()
            and blob.parent.resolve() == blobs.resolve())


def _prune_empty(folder: Path, stop: Path) -> None:
    while folder != stop and folder.is_dir() and not any(folder.iterdir()):
        folder.rmdir()
        folder = folder.parent
