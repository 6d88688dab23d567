"""A local fake of the Hugging Face Hub for tests: real HTTP on 127.0.0.1, what huggingface_hub asks.

Two ThreadingHTTPServers share one state: the hub (API and /resolve) and a "CDN" on another port,
as on the real hub, where /resolve answers an LFS file with a 302 to a CDN host: huggingface_hub then
takes the file's metadata (X-Repo-Commit, X-Linked-Etag = SHA-256, X-Linked-Size) from the redirect
itself and drops the token before going to the CDN. The CDN is named `localhost`, the hub
`127.0.0.1`: huggingface_hub before 2.4 follows a redirect to the same host name whatever the port,
and would then read the CDN's answer, which carries no commit, instead of the redirect's.

Served: GET /api/models (search, filter, sort, limit), GET /api/models/{repo}[/revision/{rev}]
(model_info, `siblings` with sizes and LFS hashes when blobs=True), GET /api/models/{repo}/tree/{rev},
POST /api/models/{repo}/paths-info/{rev}, GET /api/whoami-v2, HEAD/GET /{repo}/resolve/{rev}/{file},
HEAD/GET /cdn/{sha256} with Range. Gated repos want `Authorization: Bearer GOOD_TOKEN` on /resolve
(401 GatedRepo without a token, 403 with another one). Fault switches (FakeHub.faults, reset per
test): a status per endpoint kind, dropping the connection mid-file, throttling, corrupt bytes
under the right hash, ignoring Range. Every request is logged with the body bytes it was sent.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlparse

GOOD_TOKEN = "hf_good_token_for_tests"
DENIED_TOKEN = "hf_token_without_access"
_WRITE_PIECE = 16 * 1024


@dataclass
class FakeRepo:
    repo_id: str
    files: dict[str, bytes]
    gated: bool = False
    downloads: int = 0
    likes: int = 0
    last_modified: str = "2025-01-01T00:00:00.000Z"
    tags: list[str] = field(default_factory=lambda: ["gguf"])
    n_params: int | None = None  # the hub's `gguf.total` summary

    @property
    def commit(self) -> str:
        return hashlib.sha1(self.repo_id.encode()).hexdigest()

    @staticmethod
    def is_lfs(name: str) -> bool:
        return name.endswith(".gguf")

    def entry(self, name: str) -> dict:
        data = self.files[name]
        sha = hashlib.sha256(data).hexdigest()
        out = {"type": "file", "path": name, "size": len(data), "oid": git_oid(data)}
        if self.is_lfs(name):
            out["lfs"] = {"oid": sha, "size": len(data), "pointerSize": 134}
        return out

    def model_info(self, blobs: bool) -> dict:
        siblings = []
        for name, data in self.files.items():
            s = {"rfilename": name}
            if blobs:
                s.update(size=len(data), blobId=git_oid(data))
                if self.is_lfs(name):
                    s["lfs"] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
            siblings.append(s)
        return {**self.summary(), "sha": self.commit, "siblings": siblings, "disabled": False}

    def summary(self) -> dict:
        out = {"_id": self.commit[:24], "id": self.repo_id, "modelId": self.repo_id,
               "author": self.repo_id.split("/")[0], "downloads": self.downloads, "likes": self.likes,
               "lastModified": self.last_modified, "createdAt": self.last_modified,
               "private": False, "gated": "manual" if self.gated else False, "tags": self.tags}
        if self.n_params is not None:
            out["gguf"] = {"total": self.n_params, "architecture": "llama"}
        return out


def git_oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class Faults:
    status: dict[str, int] = field(default_factory=dict)  # kind -> status: search, model_info, tree,
    # paths_info, whoami, resolve, cdn, root
    drop_after: int | None = None  # CDN GET: close the connection after this many body bytes...
    drop_times: int = 0  # ...for this many GETs
    throttle_bps: int | None = None  # CDN GET body speed
    corrupt: set[str] = field(default_factory=set)  # file names served with one byte flipped
    ignore_range: bool = False
    etag: str | None = None  # /resolve: this X-Linked-Etag (raw header value) instead of the SHA-256
    commit: str | None = None  # /resolve: this X-Repo-Commit instead of the repo's


@dataclass
class Logged:
    server: str  # "hub" | "cdn"
    method: str
    path: str
    range: str | None
    status: int
    body_bytes: int
    auth: str | None


class FakeHub:
    def __init__(self) -> None:
        self.repos: dict[str, FakeRepo] = {}
        self.faults = Faults()
        self.log: list[Logged] = []
        self._lock = threading.Lock()
        self._servers: list[ThreadingHTTPServer] = []
        self.url = self.cdn_url = ""
        self.in_flight = 0  # requests being handled: the log is complete when it is 0

    # --- setup -----------------------------------------------------------------------------
    def add_repo(self, repo_id: str, files: dict[str, bytes | Path], **kw) -> FakeRepo:
        data = {name: (Path(v).read_bytes() if isinstance(v, Path) else v) for name, v in files.items()}
        repo = FakeRepo(repo_id, data, **kw)
        self.repos[repo_id] = repo
        return repo

    def start(self) -> FakeHub:
        for role in ("hub", "cdn"):
            server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self, role))
            server.daemon_threads = True
            threading.Thread(target=server.serve_forever, daemon=True).start()
            self._servers.append(server)
        self.url = f"http://127.0.0.1:{self._servers[0].server_address[1]}"
        self.cdn_url = f"http://localhost:{self._servers[1].server_address[1]}"
        return self

    def stop(self) -> None:
        for server in self._servers:
            server.shutdown()
            server.server_close()

    def reset(self) -> None:
        self.wait_idle()  # a cancelled transfer may still be winding down on the server
        self.faults = Faults()
        with self._lock:
            self.log.clear()

    # --- what happened ---------------------------------------------------------------------
    def record(self, entry: Logged) -> None:
        with self._lock:
            self.log.append(entry)

    def wait_idle(self, timeout: float = 5.0) -> None:
        """Wait until every request has been handled and logged (a client may have its bytes
        before the server thread has written its log line)."""
        deadline = time.monotonic() + timeout
        while self.in_flight and time.monotonic() < deadline:
            time.sleep(0.01)

    def cdn_gets(self, data: bytes | None = None) -> list[Logged]:
        sha = hashlib.sha256(data).hexdigest() if data is not None else None
        self.wait_idle()
        with self._lock:
            return [e for e in self.log if e.server == "cdn" and e.method == "GET"
                    and (sha is None or e.path.startswith(f"/cdn/{sha}"))]

    def cdn_bytes(self, data: bytes | None = None) -> int:
        return sum(e.body_bytes for e in self.cdn_gets(data))

    def find_blob(self, sha: str) -> tuple[str, bytes] | None:
        for repo in self.repos.values():
            for name, data in repo.files.items():
                if hashlib.sha256(data).hexdigest() == sha:
                    return name, data
        return None


def _handler(hub: FakeHub, role: str) -> type[BaseHTTPRequestHandler]:
    class Handler(_Handler):
        pass

    Handler.hub, Handler.role = hub, role
    return Handler


_RESOLVE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<file>.+)$")
_API_REPO = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)(?:/(?P<rest>.*))?$")


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    hub: FakeHub
    role: str

    def log_message(self, format, *args) -> None:  # noqa: A002 - keep test output quiet
        pass

    # --- plumbing --------------------------------------------------------------------------
    def _send(self, status: int, body: bytes = b"", headers: dict | None = None,
              content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        sent = 0
        if self.command != "HEAD" and body:
            self.wfile.write(body)
            sent = len(body)
        self._log(status, sent)

    def _json(self, data, status: int = 200, headers: dict | None = None) -> None:
        self._send(status, json.dumps(data).encode(), headers)

    def _error(self, status: int, code: str | None = None, message: str = "error", headers: dict | None = None) -> None:
        extra = dict(headers or {})
        if code:
            extra["X-Error-Code"] = code
        extra["X-Error-Message"] = message
        self._json({"error": message}, status, extra)

    def _log(self, status: int, body_bytes: int) -> None:
        self.hub.record(Logged(self.role, self.command, self.path, self.headers.get("Range"),
                               status, body_bytes, self.headers.get("Authorization")))

    def _fault(self, kind: str) -> bool:
        status = self.hub.faults.status.get(kind)
        if status is None:
            return False
        self._error(status, None, f"fault {status}")
        return True

    # --- routing ---------------------------------------------------------------------------
    def do_HEAD(self) -> None:
        self._counted()

    def do_GET(self) -> None:
        self._counted()

    def do_POST(self) -> None:
        self._counted()

    def _counted(self) -> None:
        with self.hub._lock:
            self.hub.in_flight += 1
        try:
            self._route()
        finally:
            with self.hub._lock:
                self.hub.in_flight -= 1

    def _route(self) -> None:
        url = urlparse(self.path)
        path, query = unquote(url.path), parse_qs(url.query)
        if self.role == "cdn":
            return self._cdn(path)
        if path == "/":
            return None if self._fault("root") else self._send(200, b"fake hub", content_type="text/plain")
        if path == "/api/models":
            return self._search(query)
        if path == "/api/whoami-v2":
            return self._whoami()
        m = _API_REPO.match(path)
        if m:
            return self._api_repo(m["repo"], m["rest"] or "", query)
        m = _RESOLVE.match(path)
        if m:
            return self._resolve(m["repo"], m["rev"], m["file"])
        self._error(404, None, "no such route")

    # --- API -------------------------------------------------------------------------------
    def _search(self, query: dict) -> None:
        if self._fault("search"):
            return
        text = (query.get("search") or [""])[0].lower().replace(" ", "-")
        filters = query.get("filter", [])
        repos = [r for r in self.hub.repos.values()
                 if text in r.repo_id.lower() and all(f in r.tags for f in filters)]
        key = {"downloads": "downloads", "likes": "likes", "lastModified": "last_modified",
               "createdAt": "last_modified"}.get((query.get("sort") or ["downloads"])[0], "downloads")
        repos.sort(key=lambda r: getattr(r, key), reverse=True)
        limit = int((query.get("limit") or ["1000"])[0])
        self._json([r.summary() for r in repos[:limit]])

    def _whoami(self) -> None:
        if self._fault("whoami"):
            return
        if self.headers.get("Authorization") != f"Bearer {GOOD_TOKEN}":
            return self._error(401, None, "Invalid credentials in Authorization header")
        self._json({"type": "user", "name": "tester",
                    "auth": {"accessToken": {"displayName": "specula-tests", "role": "read"}}})

    def _api_repo(self, repo_id: str, rest: str, query: dict) -> None:
        repo = self.hub.repos.get(repo_id)
        if repo is None:
            return self._error(404, "RepoNotFound", "Repository not found")
        if rest in ("", "revision/main", f"revision/{repo.commit}"):
            if self._fault("model_info"):
                return
            return self._json(repo.model_info(blobs=bool(query.get("blobs"))))
        if rest.startswith("tree/"):
            if self._fault("tree"):
                return
            return self._json([repo.entry(n) for n in sorted(repo.files)])
        if rest.startswith("paths-info/") and self.command == "POST":
            if self._fault("paths_info"):
                return
            length = int(self.headers.get("Content-Length") or 0)
            form = parse_qs(self.rfile.read(length).decode())
            return self._json([repo.entry(p) for p in form.get("paths", []) if p in repo.files])
        self._error(404, None, "no such route")

    def _resolve(self, repo_id: str, rev: str, name: str) -> None:
        repo = self.hub.repos.get(repo_id)
        if repo is None:
            return self._error(404, "RepoNotFound", "Repository not found")
        if rev not in ("main", repo.commit):
            return self._error(404, "RevisionNotFound", "Invalid rev id")
        if repo.gated:
            auth = self.headers.get("Authorization")
            if auth is None:
                return self._error(401, "GatedRepo", f"Access to model {repo_id} is restricted.")
            if auth != f"Bearer {GOOD_TOKEN}":
                return self._error(403, "GatedRepo", f"Access to model {repo_id} is restricted "
                                                     "and you are not in the authorized list.")
        if self._fault("resolve"):
            return
        if name not in repo.files:
            return self._error(404, "EntryNotFound", "Entry not found", {"X-Repo-Commit": repo.commit})
        data = repo.files[name]
        headers = {"X-Repo-Commit": repo.commit, "ETag": f'"{git_oid(data)}"', "Accept-Ranges": "bytes"}
        if not repo.is_lfs(name):
            return self._send(200, data, headers, "application/octet-stream")
        sha = hashlib.sha256(data).hexdigest()
        headers.update({"X-Linked-Etag": f'"{sha}"', "X-Linked-Size": str(len(data)),
                        "Location": f"{self.hub.cdn_url}/cdn/{sha}?name={name}"})
        faults = self.hub.faults  # a hostile hub choosing the names the client writes under
        if faults.etag is not None:
            headers["X-Linked-Etag"] = faults.etag
        if faults.commit is not None:
            headers["X-Repo-Commit"] = faults.commit
        self._send(302, b"", headers)

    # --- CDN -------------------------------------------------------------------------------
    def _cdn(self, path: str) -> None:
        found = self.hub.find_blob(path.removeprefix("/cdn/")) if path.startswith("/cdn/") else None
        if found is None:
            return self._error(404, None, "no such blob")
        if self._fault("cdn"):
            return
        name, data = found
        faults = self.hub.faults
        if name in faults.corrupt:
            data = bytes([data[0] ^ 0xFF]) + data[1:] if len(data) < 64 else data[:-1] + bytes([data[-1] ^ 0xFF])
        start, end = 0, len(data)
        status = 200
        rng = self.headers.get("Range")
        m = re.match(r"bytes=(\d+)-(\d*)$", rng or "")
        if m and not faults.ignore_range:
            start = int(m[1])
            end = min(int(m[2]) + 1, len(data)) if m[2] else len(data)
            if start >= len(data):
                return self._error(416, None, "range not satisfiable",
                                   {"Content-Range": f"bytes */{len(data)}"})
            status = 206
        body = data[start:end]
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{len(data)}")
        self.end_headers()
        if self.command == "HEAD":
            return self._log(status, 0)
        self._log(status, self._write_body(body))

    def _write_body(self, body: bytes) -> int:
        """Write the body under the fault switches; returns the bytes actually sent."""
        faults = self.hub.faults
        limit = len(body)
        drop = faults.drop_after is not None and faults.drop_times > 0
        if drop:
            faults.drop_times -= 1
            limit = min(limit, faults.drop_after)
        sent = 0
        try:
            while sent < limit:
                piece = body[sent:min(limit, sent + _WRITE_PIECE)]
                self.wfile.write(piece)
                sent += len(piece)
                if faults.throttle_bps:
                    self.wfile.flush()
                    time.sleep(len(piece) / faults.throttle_bps)
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
            return sent
        if sent < len(body):
            self.close_connection = True  # the client sees the body end early
        return sent


# --- pytest fixtures (imported by the test_hub_* modules) --------------------------------------

import os  # noqa: E402

import pytest  # noqa: E402

REPO_BIG = "specula-test/Tiny-Llama-4L-GGUF"
REPO_MID = "specula-test/Tiny-Llama-2L-GGUF"
REPO_SMALL = "specula-test/Tiny-Llama-1L-GGUF"
REPO_FOREIGN = "specula-test/Tiny-Llama-Foreign-GGUF"
REPO_GATED = "specula-gated/Tiny-Llama-Gated-GGUF"
REPO_BROKEN = "specula-test/Broken-GGUF"
REPO_VOCAB = "specula-test/Big-Vocab-GGUF"
BIG_FILE = "Tiny-Llama-4L-F32.gguf"
SPLIT_FIRST = "Tiny-Llama-4L-Q8_0-00001-of-00002.gguf"


@pytest.fixture(scope="session")
def hub_files(tiny_paths, tmp_path_factory) -> dict[str, Path]:
    """Real GGUF files: `big` (4 layers, a few MiB: range reads must fetch far less), the tiny
    models, `small` (1 narrow layer, a good draft), `foreign` (another vocabulary)."""
    from tests.header_gguf import make_tokens, small_tensors, write_gguf
    from tests.tiny_gguf import VOCAB_SIZE, TinySpec, write_tiny_gguf

    folder = tmp_path_factory.mktemp("hub-files")
    big = write_tiny_gguf(folder / "big.gguf", TinySpec(hidden=128, intermediate=512, n_layers=4, seed=5))
    small = write_tiny_gguf(folder / "small.gguf",
                            TinySpec(hidden=32, n_heads=2, n_kv_heads=1, intermediate=64, n_layers=1, seed=7))
    foreign = write_gguf(folder / "foreign.gguf", tokens=make_tokens(VOCAB_SIZE, "zz"))
    # A header of ~0.6 MiB (40k tokens) in front of 5 MiB of weights: several range reads.
    vocab = write_gguf(folder / "vocab.gguf", tokens=make_tokens(40_000, "t"),
                       tensors=small_tensors(40_000))
    return {"big": big, "small": small, "foreign": foreign, "vocab": vocab,
            "mid": tiny_paths["llama-f32"], "q8": tiny_paths["llama-q8"]}


@pytest.fixture(scope="session")
def fake_hub(hub_files):
    hub = FakeHub()
    f = hub_files
    big = f["big"].read_bytes()
    hub.add_repo(REPO_BIG, {BIG_FILE: big, SPLIT_FIRST: f["q8"],
                            "Tiny-Llama-4L-Q8_0-00002-of-00002.gguf": b"\0" * 70_000,
                            "mmproj-Tiny-Llama-F16.gguf": f["small"], "README.md": b"# Tiny\n"},
                 downloads=500, likes=5, last_modified="2025-03-01T00:00:00.000Z")
    hub.add_repo(REPO_MID, {"Tiny-Llama-2L-F32.gguf": f["mid"], "Tiny-Llama-2L-Q8_0.gguf": f["q8"]},
                 downloads=900, likes=1, last_modified="2025-01-01T00:00:00.000Z")
    hub.add_repo(REPO_SMALL, {"Tiny-Llama-1L-F32.gguf": f["small"]},
                 downloads=100, likes=9, last_modified="2025-05-01T00:00:00.000Z")
    hub.add_repo(REPO_FOREIGN, {"Tiny-Llama-Foreign-F16.gguf": f["foreign"]}, downloads=50)
    hub.add_repo(REPO_GATED, {"Tiny-Llama-Gated-Q8_0.gguf": f["q8"]}, gated=True, downloads=10)
    hub.add_repo(REPO_VOCAB, {"Big-Vocab-F16.gguf": f["vocab"]}, downloads=2)
    hub.add_repo(REPO_BROKEN, {"Broken-Q4_0.gguf": b"this is not a GGUF file\n" * 100}, downloads=1)
    hub.add_repo("specula-test/tiny-llama-safetensors", {"model.safetensors": b"\0" * 100},
                 tags=["safetensors"], downloads=10_000)
    hub.start()
    yield hub
    hub.stop()


def hub_env(hub: FakeHub, home: Path) -> dict[str, str]:
    """Environment for a `specula` subprocess talking to the fake hub, with its own HF_HOME."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "SPECULA_FAKE_FREE_BYTES", "HF_HUB_CACHE")}
    env.update(HF_ENDPOINT=hub.url, HF_HOME=str(home), HF_HUB_OFFLINE="0",
               HF_HUB_DISABLE_TELEMETRY="1", HF_HUB_ETAG_TIMEOUT="5", HF_HUB_DOWNLOAD_TIMEOUT="5")
    return env


@pytest.fixture
def hub(fake_hub, tmp_path, monkeypatch) -> FakeHub:
    """The fake hub, for huggingface_hub in this process: it reads HF_ENDPOINT, HF_HOME and
    HF_HUB_OFFLINE once at import, so its constants are pointed here (and restored after)."""
    from huggingface_hub import constants, hf_api

    fake_hub.reset()
    home = tmp_path / "hf-home"
    for name, value in {
        "ENDPOINT": fake_hub.url,
        "HUGGINGFACE_CO_URL_TEMPLATE": fake_hub.url + "/{repo_id}/resolve/{revision}/{filename}",
        "HF_HUB_OFFLINE": False, "HF_HOME": str(home), "HF_HUB_CACHE": str(home / "hub"),
        "HF_TOKEN_PATH": str(home / "token"), "HF_STORED_TOKENS_PATH": str(home / "stored_tokens"),
        "HF_HUB_ETAG_TIMEOUT": 5, "HF_HUB_DOWNLOAD_TIMEOUT": 5,
    }.items():
        monkeypatch.setattr(constants, name, value)
    monkeypatch.setattr(hf_api.api, "endpoint", fake_hub.url)  # login()'s whoami uses this instance
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "SPECULA_FAKE_FREE_BYTES"):
        monkeypatch.delenv(name, raising=False)
    fake_hub.home = home
    return fake_hub
