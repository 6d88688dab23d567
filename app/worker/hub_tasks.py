"""Hub calls for the window, run off the GUI thread: search, file listing, header facts with fit and
draft check, saving a token, and downloads with progress and cancel.

Calls run on a private QThreadPool rather than the global one: on a two-core machine the global
pool has two threads, and a download holding one of them for minutes would hold back the
library's header scans. Each call belongs to a *channel* ("search", "files", "header", ...); a new
call on a channel makes every older one on it stale, and a stale result is dropped here, so the
panel only ever hears about what the user is looking at now. Results cross threads as plain frozen
data; failures as HubFailure (a kind the panel can act on, and the hub's one-line message).

The hub modules are imported inside the functions (on the worker threads): huggingface_hub takes
a few tenths of a second to import, which the window should not spend before it opens.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QObject, QRunnable, QThreadPool, Signal, Slot

if TYPE_CHECKING:
    from app.engine.drafting.compat import DraftCheck
    from app.engine.gguf.info import GGUFInfo
    from app.hub.fit import FitResult, MachineMemory
    from app.hub.repos import GGUFModelFile

log = logging.getLogger(__name__)

MAX_THREADS = 4  # a download, plus a search, a listing and a header read at once
DOWNLOAD = "download"

# HubFailure kinds, from the hub's error classes (anything else is "error").
OFFLINE, GATED, NOT_FOUND, DISK_FULL, CHECKSUM = "offline", "gated", "not_found", "disk_full", "checksum"
CANCELLED, INTERRUPTED, NOT_GGUF, ERROR = "cancelled", "interrupted", "not_gguf", "error"


@dataclass(frozen=True)
class HubFailure:
    kind: str  # one of the kinds above
    message: str  # one line for the user


def failure_of(exc: BaseException) -> HubFailure:
    """The user-facing kind and line of an exception raised by a hub call."""
    from app.engine.errors import ModelFileError, SpeculaError
    from app.hub import errors

    kinds = [(errors.OfflineError, OFFLINE), (errors.GatedRepoError, GATED),
             (errors.NotFoundError, NOT_FOUND), (errors.DiskFullError, DISK_FULL),
             (errors.ChecksumError, CHECKSUM), (errors.DownloadCancelled, CANCELLED),
             (errors.DownloadInterrupted, INTERRUPTED), (ModelFileError, NOT_GGUF)]
    kind = next((k for cls, k in kinds if isinstance(exc, cls)), ERROR)
    lines = str(exc).strip().splitlines()
    first = lines[0][:400] if lines else ""
    if not isinstance(exc, SpeculaError):  # a bug or a library failure the hub did not translate
        first = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
    return HubFailure(kind, first or type(exc).__name__)


# --- the calls themselves: plain functions, run on a worker thread ------------------------------


@dataclass(frozen=True)
class RepoFiles:
    """A repository's GGUF models and what of them is already on this machine."""

    repo_id: str
    groups: tuple[tuple[str, tuple[GGUFModelFile, ...]], ...]  # by quantization, as group_by_quant
    local: dict[str, str] = field(default_factory=dict)  # filename -> complete copy in the HF cache
    partial: dict[str, int] = field(default_factory=dict)  # filename -> bytes kept by a stopped download

    @property
    def files(self) -> list[GGUFModelFile]:
        return [f for _, members in self.groups for f in members]


@dataclass(frozen=True)
class FileFacts:
    """What a remote file's header says, whether it fits, and whether it can draft for the main."""

    repo_id: str
    filename: str
    info: GGUFInfo
    fit: FitResult
    compat: DraftCheck | None  # None without a main model
    bytes_read: int  # header bytes fetched with range requests
    requests: int
    machine: MachineMemory  # measured once per panel, passed back in on the next read
    same_as: str | None = None  # the built-in model holding these very weights: already here


def search_repos(query: str, sort: str, limit: int) -> list:
    """GGUF repositories matching `query` (app.hub.repos.RepoResult), best first by `sort`."""
    from app.hub.search import search_gguf

    return search_gguf(query, sort, limit)


def save_hub_token(token: str) -> bool:
    """Store a token as `hf auth login` does; True when the hub checked it (app.hub.token)."""
    from app.hub.token import save_token

    return save_token(token)


def list_repo_files(repo_id: str) -> RepoFiles:
    from app.hub.search import group_by_quant, list_gguf_files

    files = list_gguf_files(repo_id)
    groups = tuple((quant, tuple(members)) for quant, members in group_by_quant(files).items())
    return local_copies(RepoFiles(repo_id, groups))


def local_copies(listing: RepoFiles) -> RepoFiles:
    """The listing with what this machine holds of it: complete copies in the HF cache, and
    partials of stopped downloads (read from disk, no network)."""
    from huggingface_hub import try_to_load_from_cache

    from app.hub.disk import hub_cache_dir
    from app.hub.partials import pending_downloads

    local = {}
    for f in listing.files:
        paths = [try_to_load_from_cache(listing.repo_id, part, cache_dir=hub_cache_dir()) for part in f.parts]
        if f.complete and all(isinstance(p, str) for p in paths):
            local[f.filename] = str(paths[0])
    partial = {p.filename: p.done for p in pending_downloads()
               if p.repo_id == listing.repo_id and p.dest_dir is None and p.done > 0}
    return RepoFiles(listing.repo_id, listing.groups, local, partial)


def read_file_facts(repo_id: str, filename: str, main: GGUFInfo | None,
                    machine: MachineMemory | None) -> FileFacts:
    from app.engine.drafting.compat import check_draft as check_pair
    from app.hub.fit import fits_this_machine, machine_memory
    from app.hub.search import fetch_remote_header

    header = fetch_remote_header(repo_id, filename)
    machine = machine or machine_memory()
    fit = fits_this_machine(header.info, machine=machine)
    compat = check_pair(main, header.info) if main is not None else None
    return FileFacts(repo_id, filename, header.info, fit, compat, header.bytes_transferred,
                     header.requests, machine, builtin_twin(header.info))


def builtin_twin(info: GGUFInfo) -> str | None:
    """The title of the built-in model with the same weights as this header, else None."""
    from app.hub.identity import same_header_weights
    from app.hub.library import builtin_models

    return next((m.name for m in builtin_models() if m.info is not None and same_header_weights(m.info, info)), None)


def check_draft(main: GGUFInfo, draft: GGUFInfo) -> DraftCheck:
    from app.engine.drafting.compat import check_draft as check_pair

    return check_pair(main, draft)


def fetch_pair(progress: Callable[[object], None], cancel: Callable[[], bool],
               from_packages: bool = True) -> tuple[str, str]:
    """The real main + draft pair's (main, draft) files: joined from the `pair` packages
    (AssemblyProgress events), else (their packages are not installed) the official files from
    the hub, or the copies already in the HF cache (DownloadProgress events)."""
    from huggingface_hub import try_to_load_from_cache

    from app.hub import builtin
    from app.hub.disk import hub_cache_dir
    from app.hub.download import download_gguf

    if from_packages:
        main, draft = builtin.pair_paths(progress, cancel)
        return str(main), str(draft)
    paths = []
    for repo_id, filename in builtin.PAIR_HUB_FILES:
        cached = try_to_load_from_cache(repo_id, filename, cache_dir=hub_cache_dir())
        paths.append(cached if isinstance(cached, str) else
                     str(download_gguf(repo_id, filename, progress=progress, cancel=cancel)))
    return paths[0], paths[1]


# --- running them -------------------------------------------------------------------------------


class _Relay(QObject):
    """Carries a worker's results to the GUI thread. It has no parent: the runnables hold it, so
    it outlives a HubCalls destroyed while a call is still running (no emit on a deleted object)."""

    result = Signal(str, int, object)
    failure = Signal(str, int, object)
    progress = Signal(int, object)


class _Call(QRunnable):
    def __init__(self, relay: _Relay, channel: str, request: int, fn: Callable[..., Any],
                 args: tuple[Any, ...]) -> None:
        super().__init__()
        self.relay, self.channel, self.request, self.fn, self.args = relay, channel, request, fn, args

    def run(self) -> None:
        try:
            result = self.fn(*self.args)
        except Exception as exc:  # noqa: BLE001 - every failure reaches the panel as one line
            failure = failure_of(exc)
            log.info("hub call %s failed: %s", self.channel, failure.message)
            self.relay.failure.emit(self.channel, self.request, failure)
        else:
            self.relay.result.emit(self.channel, self.request, result)


class HubCalls(QObject):
    """Latest-wins hub calls on worker threads. `finished`/`failed` fire on the GUI thread, only
    for the newest call of each channel; `downloadProgress` carries DownloadProgress events."""

    finished = Signal(str, int, object)  # channel, request id, result
    failed = Signal(str, int, object)  # channel, request id, HubFailure
    downloadProgress = Signal(object)  # app.hub.progress.DownloadProgress (start_long: its events)

    def __init__(self, parent: QObject | None = None, max_threads: int = MAX_THREADS) -> None:
        super().__init__(parent)
        self.pool = QThreadPool()
        self.pool.setMaxThreadCount(max_threads)
        self._relay = _Relay()
        self._relay.result.connect(self._on_result)
        self._relay.failure.connect(self._on_failure)
        self._relay.progress.connect(self._on_progress)
        self._latest: dict[str, int] = {}
        self._next_id = 0
        self._download_cancel: threading.Event | None = None
        self._closed = False

    def submit(self, channel: str, fn: Callable[..., Any], *args: Any) -> int:
        """Run fn(*args) on a worker; older calls on `channel` become stale. Returns the call's id."""
        request = self._new_request(channel)
        if not self._closed:
            self.pool.start(_Call(self._relay, channel, request, fn, args))
        return request

    def forget(self, channel: str) -> None:
        """Drop whatever the running call on `channel` returns (the user moved on)."""
        self._new_request(channel)

    def is_current(self, channel: str, request: int) -> bool:
        return self._latest.get(channel) == request

    def start_download(self, repo_id: str, filename: str) -> int:
        """Download into the HF cache; results on the DOWNLOAD channel, progress as it goes."""

        def run(progress: Callable[[object], None], cancel: Callable[[], bool]) -> str:
            from app.hub.download import download_gguf

            return str(download_gguf(repo_id, filename, progress=progress, cancel=cancel))

        return self.start_long(run)

    def start_long(self, fn: Callable[[Callable[[object], None], Callable[[], bool]], Any]) -> int:
        """fn(progress, cancel), a long job such as a download, on the DOWNLOAD channel: one at a
        time (a new one cancels the last), its progress events as `downloadProgress`."""
        self.cancel_download()
        cancel = threading.Event()
        self._download_cancel = cancel
        request = self._new_request(DOWNLOAD)
        relay = self._relay
        progress = lambda p: relay.progress.emit(request, p)  # noqa: E731
        if not self._closed:
            self.pool.start(_Call(relay, DOWNLOAD, request, fn, (progress, cancel.is_set)))
        return request

    def cancel_download(self) -> None:
        """Ask the running download to stop after its current chunk (the partial is kept)."""
        if self._download_cancel is not None:
            self._download_cancel.set()

    def shutdown(self, timeout_ms: int = 3000) -> bool:
        """Cancel the download, drop every pending result and wait for the workers; False when
        one is still busy after `timeout_ms` (a hub request waits out its own timeout)."""
        self._closed = True
        self.cancel_download()
        for channel in list(self._latest):
            self.forget(channel)
        done = self.pool.waitForDone(timeout_ms)
        if not done:
            log.warning("hub calls still running after %d ms", timeout_ms)
        return done

    def _new_request(self, channel: str) -> int:
        self._next_id += 1
        self._latest[channel] = self._next_id
        return self._next_id

    @Slot(str, int, object)
    def _on_result(self, channel: str, request: int, result: object) -> None:
        if self.is_current(channel, request):
            self.finished.emit(channel, request, result)

    @Slot(str, int, object)
    def _on_failure(self, channel: str, request: int, failure: object) -> None:
        if self.is_current(channel, request):
            self.failed.emit(channel, request, failure)

    @Slot(int, object)
    def _on_progress(self, request: int, progress: object) -> None:
        if self.is_current(DOWNLOAD, request):
            self.downloadProgress.emit(progress)
