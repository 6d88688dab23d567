"""A remote GGUF file's header facts, read with HTTP range requests (never the whole file).

The file's metadata (size, SHA-256, where it is served from) comes from huggingface_hub's
get_hf_file_metadata (a HEAD on /resolve). Then the first bytes are fetched with a `Range:` header
through huggingface_hub's own HTTP session and parsed by the engine's header reader; when that says
the header goes on (HeaderIncomplete, with the bytes it needs at least), only the missing bytes are
fetched, at least doubling what we have, until the header parses. A 32k-vocabulary model takes one
or two requests of a few hundred KiB; a 262k-vocabulary one a few MiB, out of hundreds of MiB.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from urllib.parse import urlparse

from huggingface_hub import constants, get_hf_file_metadata, hf_hub_url
from huggingface_hub.file_download import HfFileMetadata
from huggingface_hub.utils import (HFValidationError, build_hf_headers, get_session, hf_raise_for_status,
                                   validate_repo_id)

from app.engine.errors import ModelFileError
from app.engine.gguf.info import GGUFInfo, HeaderIncomplete, parse_gguf_header
from app.hub.errors import HubError, check_online, endpoint, hub_call

log = logging.getLogger(__name__)

FIRST_READ = 128 * 1024
MAX_HEADER = 128 * 1024 * 1024  # no real header is this big; past it the file is not GGUF
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
# The only forms the hub gives, and the only ones huggingface_hub's cache layout expects: a commit
# is a git SHA-1; a file's ETag is its git SHA-1 (small files) or its LFS SHA-256. Both become
# file names in the cache, so anything else (`../../x`) is refused, never used as a path.
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_ETAG = re.compile(r"^(?:[0-9a-f]{40}|[0-9a-f]{64})$")


@dataclass(frozen=True)
class RemoteFile:
    """What a HEAD on /resolve says about a file."""

    repo_id: str
    filename: str
    url: str  # where the bytes are (a CDN after the hub's redirect)
    size: int
    etag: str
    commit: str
    sha256: str | None  # the LFS SHA-256 when the hub gives one

    @property
    def same_host(self) -> bool:
        return urlparse(self.url).netloc == urlparse(endpoint()).netloc


@dataclass(frozen=True)
class RemoteHeader:
    info: GGUFInfo
    file: RemoteFile
    bytes_transferred: int  # body bytes fetched for the header
    requests: int


def normalize_etag(etag: str) -> str:
    """An ETag header's value without its quotes and weak marker, as huggingface_hub's
    `_normalize_etag` makes it (it is the name of the file's blob in the cache)."""
    return etag.strip().removeprefix("W/").strip('"')


def check_repo_id(repo_id: str) -> None:
    """HubError (one line) unless `repo_id` is a hub repository id (`owner/name`, as
    huggingface_hub validates it): its own HFValidationError was a traceback on `hub info` and
    `hub download`, raised before any request."""
    try:
        validate_repo_id(repo_id)
    except HFValidationError as exc:
        reason = (str(exc).splitlines() or [""])[0][:200]
        raise HubError(f"{repo_id[:100]!r} is not a repository id (owner/name): {reason}") from None


def check_repo_filename(repo_id: str, filename: str) -> None:
    """A repo file name is a relative POSIX path inside the repo; it becomes a path under the
    cache or --dir, so an absolute one, a `..` or a backslash is refused."""
    parts = filename.split("/")
    if (not filename or filename.startswith("/") or "\\" in filename or ":" in parts[0]
            or any(part in ("", ".", "..") for part in parts) or "\0" in filename):
        raise HubError(f"{repo_id}: {filename!r} is not a file name inside the repository")


def _checked_hashes(repo_id: str, filename: str, etag: str, commit: str) -> tuple[str, str]:
    etag = normalize_etag(etag)
    if not _ETAG.match(etag):
        raise HubError(f"{endpoint()} gave {repo_id}/{filename} an ETag that is not a git or "
                       f"SHA-256 hash ({etag[:80]!r}); refusing to use it")
    if not _COMMIT.match(commit):
        raise HubError(f"{endpoint()} gave {repo_id}/{filename} a commit that is not a git hash "
                       f"({commit[:80]!r}); refusing to use it")
    return etag, commit


def remote_file(repo_id: str, filename: str, revision: str | None = None,
                token: str | bool | None = None) -> RemoteFile:
    """Size, hashes and location of a file on the hub (one HEAD, no retries). HubError when the
    hub's answer names the file with anything but the hashes the hub uses."""
    check_repo_id(repo_id)  # a bad argument whatever the network
    check_online(f"read {filename} from {repo_id}")
    check_repo_filename(repo_id, filename)
    url = hf_hub_url(repo_id, filename, revision=revision, endpoint=endpoint())
    with hub_call(f"read {filename} from {repo_id}", repo_id, filename):
        meta: HfFileMetadata = get_hf_file_metadata(url, token=token, endpoint=endpoint())
    if meta.size is None or meta.etag is None or meta.commit_hash is None:
        raise HubError(f"{endpoint()} gave no size, ETag or commit for {repo_id}/{filename}")
    etag, commit = _checked_hashes(repo_id, filename, meta.etag, meta.commit_hash)
    sha = etag if _SHA256.match(etag) else None
    return RemoteFile(repo_id, filename, meta.location, meta.size, etag, commit, sha)


def request_headers(file: RemoteFile, token: str | bool | None = None) -> dict[str, str]:
    """Headers for fetching the file's bytes; the token never leaves the hub for a CDN."""
    headers = build_hf_headers(token=token)
    headers["Accept-Encoding"] = "identity"  # sizes and ranges are about the real bytes
    if not file.same_host:
        headers.pop("authorization", None)
    return headers


def read_range(file: RemoteFile, start: int, stop: int, headers: dict[str, str]) -> bytes:
    """Bytes [start, stop) of the file. A server that ignores Range answers 200 with the whole
    file: then only the wanted bytes are read and the connection is dropped."""
    wanted = stop - start
    ranged = {**headers, "Range": f"bytes={start}-{stop - 1}"}
    with get_session().stream("GET", file.url, headers=ranged, follow_redirects=True,
                              timeout=constants.HF_HUB_DOWNLOAD_TIMEOUT) as response:
        if response.status_code >= 400:
            response.read()  # the error body, for hf_raise_for_status's message
        hf_raise_for_status(response)
        skip = start if response.status_code == 200 else 0
        out = bytearray()
        for chunk in response.iter_raw():
            if skip:
                dropped = min(skip, len(chunk))
                chunk, skip = chunk[dropped:], skip - dropped
            out += chunk
            if len(out) >= wanted:
                break
    return bytes(out[:wanted])


def fetch_remote_header(repo_id: str, filename: str, revision: str | None = None,
                        token: str | bool | None = None) -> RemoteHeader:
    """Parse a remote GGUF file's header from its first bytes. ModelFileError if it is not GGUF."""
    file = remote_file(repo_id, filename, revision, token)
    headers = request_headers(file, token)
    buf = bytearray()
    want, requests = min(FIRST_READ, file.size), 0
    with hub_call(f"read the header of {filename}", repo_id, filename):
        while True:
            chunk = read_range(file, len(buf), want, headers)
            requests += 1
            if not chunk:
                raise HubError(f"{repo_id}/{filename}: the server sent no bytes at offset {len(buf)}")
            buf += chunk
            try:
                info = parse_gguf_header(buf, f"{repo_id}/{filename}", file_size=file.size)
            except HeaderIncomplete as exc:
                want = min(file.size, max(exc.needed or 0, 2 * len(buf)))
                if want > MAX_HEADER:
                    raise ModelFileError(f"{filename}: GGUF header larger than "
                                         f"{MAX_HEADER >> 20} MiB; not a usable model") from None
                continue
            log.info("read the header of %s/%s: %d bytes in %d requests",
                     repo_id, filename, len(buf), requests)
            return RemoteHeader(info, file, len(buf), requests)


def fetch_remote_info(repo_id: str, filename: str, revision: str | None = None,
                      token: str | bool | None = None) -> GGUFInfo:
    """The header facts of a GGUF file on the hub, read with range requests."""
    return fetch_remote_header(repo_id, filename, revision, token).info
