"""Download a GGUF model with progress, cancel, resume and SHA-256 verification.

Into the Hugging Face cache by default (shared with every HF tool), or into a folder (`dest_dir`,
laid out like huggingface_hub's `local_dir`). What we take from huggingface_hub:
- get_hf_file_metadata for size, ETag (the LFS SHA-256), commit and the CDN location;
- file_download.http_get for the transfer: Range resume, its own retries when the connection drops
  mid-file, the 200-instead-of-206 fallback, the size check;
- hf_hub_download to link the verified blob into the cache's snapshot (it sees the blob is there
  and only creates the pointer), and _local_folder's metadata for a folder download.

What we add, because hf_hub_download (2.x) cannot do it: a partial that survives. Its temporary
file has a per-process random name and is deleted on any failure, so a cancelled or interrupted
download would restart from zero. Ours has a stable name (`blobs/<etag>.incomplete` in the cache,
the `local_dir` incomplete path in a folder), is appended to by http_get through a small file
wrapper that hashes every byte (no second pass to verify) and reports progress / honours cancel
between chunks, and only becomes the real file after its SHA-256 matched. A `.json` sidecar
records what the partial is, so `pending_downloads()` can offer to resume after a restart.
http_get reads in DOWNLOAD_CHUNK_SIZE chunks (10 MiB); we lower that library constant to 256 KiB
so progress and cancel react within a fraction of a second on slow links.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock, Timeout

from huggingface_hub import HfApi, constants, hf_hub_download
from huggingface_hub.file_download import http_get, repo_folder_name
from tqdm.auto import tqdm

from app.engine.gguf.format import format_bytes
from app.hub.disk import check_free_space, hub_cache_dir, size_or_zero
from app.hub.errors import (ChecksumError, DiskFullError, DownloadCancelled, DownloadInterrupted,
                            GatedRepoError, HubError, NotFoundError, check_online, endpoint, hub_call)
from app.hub.names import split_name
from app.hub.partials import PendingDownload, discard_partial, pending_downloads, sidecar, write_sidecar
from app.hub.progress import DownloadProgress, Meter
from app.hub.remote import RemoteFile, check_repo_id, remote_file, request_headers
from app.engine.errors import Cancel

log = logging.getLogger(__name__)

CHUNK_BYTES = 256 * 1024
_HASH_BLOCK = 4 * 1024 * 1024

ProgressCallback = Callable[[DownloadProgress], None]

__all__ = ["download_gguf", "DownloadProgress", "PendingDownload", "pending_downloads",
           "discard_partial"]


class _NoBar(tqdm):
    """http_get's own progress bar, silenced: progress is reported through our callback."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs["disable"] = True
        super().__init__(*args, **kwargs)


@dataclass
class _Target:
    """Where one file (or split part) goes, and the state it is in."""

    file: RemoteFile
    final: Path  # the snapshot pointer (cache) or the file (folder)
    partial: Path
    storage: Path | None  # cache mode: the repo's folder in the cache
    dest_dir: Path | None
    sha256: str | None
    verified: bool = False  # the bytes are all there and checked (maybe not linked yet)

    @property
    def blob(self) -> Path | None:
        return self.storage / "blobs" / self.file.etag if self.storage else None

    @property
    def installed(self) -> bool:
        return self.verified and self.final.exists()



def _check_within(root: Path, *paths: Path) -> None:
    """Every path we write must lie under `root` (the repo's cache folder or --dir) once its
    folder is resolved: names built from the hub's answers or the user's arguments are checked
    again here, where they become paths (a link the user made to a file inside is fine)."""
    base = root.resolve()
    for path in paths:
        where = path.parent.resolve() / path.name
        if path.name in ("", ".", "..") or not where.is_relative_to(base):
            raise HubError(f"refusing to write {path}: it is outside {root}")


def _target(file: RemoteFile, dest_dir: Path | None, sha256: str | None) -> _Target:
    if dest_dir is None:
        storage = hub_cache_dir() / repo_folder_name(repo_id=file.repo_id, repo_type="model")
        blob = storage / "blobs" / file.etag
        pointer = storage / "snapshots" / file.commit / file.filename
        t = _Target(file, pointer, Path(f"{blob}.incomplete"), storage, None, sha256)
        _check_within(storage, blob, pointer, t.partial)
        # A blob only ever gets its name after verification (by us or by huggingface_hub).
        t.verified = pointer.exists() or (blob.exists() and size_or_zero(blob) == file.size)
        return t
    from huggingface_hub._local_folder import (get_local_download_paths, read_download_metadata,
                                               write_download_metadata)

    paths = get_local_download_paths(dest_dir, file.filename)
    t = _Target(file, paths.file_path, paths.incomplete_path(file.etag), None, dest_dir, sha256)
    _check_within(dest_dir, t.final, t.partial)
    meta = read_download_metadata(dest_dir, file.filename)
    t.verified = paths.file_path.is_file() and meta is not None and meta.etag == file.etag
    if not t.verified and sha256 and size_or_zero(paths.file_path) == file.size:
        # The file is there without huggingface_hub's record of it (copied in by hand, say):
        # hashing it is cheaper than downloading it again.
        if _hash_prefix(paths.file_path, file.size).hexdigest() == sha256:
            write_download_metadata(dest_dir, file.filename, file.commit, file.etag)
            t.verified = True
    return t


def _lfs_sha256(files: list[RemoteFile], token: str | bool | None) -> dict[str, str]:
    """SHA-256s from the hub's paths-info, for files whose ETag is not one (not stored in LFS)."""
    missing = [f.filename for f in files if f.sha256 is None]
    if not missing:
        return {}
    api = HfApi(endpoint=endpoint())
    with hub_call("read file hashes", files[0].repo_id):
        infos = api.get_paths_info(files[0].repo_id, missing, revision=files[0].commit, token=token)
    return {i.path: i.lfs.sha256 for i in infos if getattr(i, "lfs", None) is not None}


class _HashingSink:
    """The file object http_get writes to: appends, hashes, reports progress, honours cancel."""

    def __init__(self, handle, hasher, meter: Meter, cancel: Cancel | None, name: str) -> None:
        self.handle, self.hasher, self.meter, self.cancel, self.name = handle, hasher, meter, cancel, name

    def write(self, data: bytes) -> int:
        written = self.handle.write(data)
        self.hasher.update(data)
        self.meter.advance(len(data))
        if self.cancel is not None and self.cancel():
            self.handle.flush()
            raise DownloadCancelled(f"download of {self.name} cancelled; "
                                    f"{format_bytes(self.meter.done)} kept, download it again to resume")
        return written

    def tell(self) -> int:
        return self.handle.tell()

    def seek(self, offset: int, whence: int = 0) -> int:
        return self.handle.seek(offset, whence)

    def truncate(self, size: int | None = None) -> int:
        # http_get truncates when a server ignored our Range and sent the whole file again.
        end = self.handle.truncate(size)
        self.meter.rewind(end)
        self.hasher = _hash_prefix(Path(self.handle.name), end)
        return end

    def flush(self) -> None:
        self.handle.flush()


def _hash_prefix(path: Path, length: int, meter: Meter | None = None):
    hasher = hashlib.sha256()
    left = length
    with open(path, "rb") as f:
        while left > 0:
            block = f.read(min(_HASH_BLOCK, left))
            if not block:
                break
            hasher.update(block)
            left -= len(block)
            if meter is not None:
                meter.checking(length - left)
    return hasher


def _transfer(t: _Target, index: int, meter: Meter, cancel: Cancel | None,
              token: str | bool | None) -> None:
    """Append the rest of the file to its partial with http_get (resuming where it stopped)."""
    constants.DOWNLOAD_CHUNK_SIZE = min(constants.DOWNLOAD_CHUNK_SIZE, CHUNK_BYTES)
    name, size = t.file.filename, t.file.size
    resume = size_or_zero(t.partial)
    if resume > size:  # not ours, or the file changed: start again
        t.partial.unlink()
        resume = 0
    hasher = _hash_prefix(t.partial, resume, meter) if resume else hashlib.sha256()
    meter.start_part(index, resume)
    try:
        with open(t.partial, "ab") as handle:
            sink = _HashingSink(handle, hasher, meter, cancel, name)
            with hub_call(f"download {name}", t.file.repo_id, name):
                if resume < size:
                    http_get(t.file.url, sink, resume_size=resume, headers=request_headers(t.file, token),
                             expected_size=size, displayed_filename=name, tqdm_class=_NoBar)
            hasher = sink.hasher
    except (DownloadCancelled, GatedRepoError, NotFoundError, DiskFullError):
        raise
    except (HubError, OSError) as exc:
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__  # http_get's are 2 lines
        raise DownloadInterrupted(f"download of {name} stopped at {format_bytes(size_or_zero(t.partial))} of "
                                  f"{format_bytes(size)} ({why}); download it again to resume") from exc
    _verify(t, hasher.hexdigest(), meter)
    meter.finish_part()
    t.verified = True


def _verify(t: _Target, digest: str, meter: Meter) -> None:
    meter.phase("verifying")
    if t.sha256 is not None and digest != t.sha256:
        t.partial.unlink(missing_ok=True)
        sidecar(t.partial).unlink(missing_ok=True)
        raise ChecksumError(f"{t.file.filename}: SHA-256 mismatch (got {digest[:12]}..., the hub says "
                            f"{t.sha256[:12]}...); the file was deleted, download it again")
    if t.sha256 is None:
        log.warning("%s: the hub gave no SHA-256; only its size was checked", t.file.filename)


def _install(t: _Target, revision: str | None, token: str | bool | None) -> None:
    """Move the verified partial into place and record it the way huggingface_hub does."""
    if t.storage is not None and t.blob is not None:
        if t.partial.exists() and not (t.blob.exists() and size_or_zero(t.blob) == t.file.size):
            os.replace(t.partial, t.blob)
        with hub_call(f"link {t.file.filename} into the cache", t.file.repo_id, t.file.filename):
            hf_hub_download(t.file.repo_id, t.file.filename, revision=t.file.commit,
                            cache_dir=hub_cache_dir(), endpoint=endpoint(), token=token)
        # Given a commit, hf_hub_download records no branch; do it so that offline look-ups of
        # "main" (ours and other tools') find this snapshot.
        if revision != t.file.commit:
            ref = t.storage / "refs" / (revision or "main")
            _check_within(t.storage / "refs", ref)
            ref.parent.mkdir(parents=True, exist_ok=True)
            ref.write_text(t.file.commit)
    else:
        from huggingface_hub._local_folder import write_download_metadata

        os.replace(t.partial, t.final)
        assert t.dest_dir is not None
        write_download_metadata(t.dest_dir, t.file.filename, t.file.commit, t.file.etag)
    sidecar(t.partial).unlink(missing_ok=True)


def download_gguf(repo_id: str, filename: str, dest_dir: Path | None = None, *,
                  revision: str | None = None, token: str | bool | None = None,
                  progress: ProgressCallback | None = None,
                  cancel: Cancel | None = None) -> Path:
    """Download a GGUF file (all parts of a split one) and return its local path (the first part).

    Raises DiskFullError before writing anything when it cannot fit; DownloadCancelled or
    DownloadInterrupted leave the partial for the next call to resume; ChecksumError deletes it.
    """
    check_repo_id(repo_id)  # a bad argument whatever the network
    check_online(f"download {filename}")
    split = split_name(filename)
    names = split.parts() if split else [filename]
    files = [remote_file(repo_id, name, revision, token) for name in names]
    hashes = _lfs_sha256(files, token)
    dest = Path(dest_dir).expanduser().absolute() if dest_dir is not None else None
    if dest is not None and not dest.exists():  # nothing to resume: refuse before creating it
        check_free_space(sum(f.size for f in files), dest, f"{repo_id}/{filename}")
    with _exclusive(_lock_path(files[0], dest), f"{repo_id}/{filename}"):
        return _download_files(files, hashes, dest, filename, revision, token, progress, cancel)


def _lock_path(file: RemoteFile, dest: Path | None) -> Path:
    folder = hub_cache_dir() / ".locks" / "specula" if dest is None else dest / ".cache" / "huggingface"
    _check_within(folder, folder / f"{file.etag}.lock")
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"{file.etag}.lock"


@contextmanager
def _exclusive(lock_path: Path, what: str) -> Iterator[None]:
    """One download of a file at a time (two would append to the same partial)."""
    lock = FileLock(str(lock_path))
    try:
        lock.acquire(timeout=0.2)
    except Timeout:
        raise HubError(f"{what} is already being downloaded (by this or another Specula)") from None
    try:
        yield
    finally:
        lock.release()


def _download_files(files: list[RemoteFile], hashes: dict[str, str], dest: Path | None, filename: str,
                    revision: str | None, token: str | bool | None, progress: ProgressCallback | None,
                    cancel: Cancel | None) -> Path:
    repo_id = files[0].repo_id
    targets = [_target(f, dest, f.sha256 or hashes.get(f.filename)) for f in files]
    needed = sum(t.file.size - size_or_zero(t.partial) for t in targets if not t.verified)
    check_free_space(needed, dest or hub_cache_dir(), f"{repo_id}/{filename}")
    meter = Meter(progress, repo_id, filename, len(targets), sum(f.size for f in files),
                  sum(t.file.size for t in targets if t.verified))
    for index, t in enumerate(targets, 1):
        if t.installed:
            continue
        if not t.verified:
            t.partial.parent.mkdir(parents=True, exist_ok=True)
            write_sidecar(t.partial, t.file.repo_id, filename, t.file.filename, revision, t.dest_dir,
                          t.file.size)
            _transfer(t, index, meter, cancel, token)
        _install(t, revision, token)
    meter.phase("done")
    log.info("downloaded %s/%s to %s", repo_id, filename, targets[0].final)
    return targets[0].final
