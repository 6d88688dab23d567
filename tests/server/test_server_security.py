"""What a hostile web page, a slow or greedy client, or another client of the same server can do
to `specula serve` (issue 16): a real uvicorn server on loopback with short limits, raw sockets
for what browsers and broken clients send, and the tiny real GGUF model."""

from __future__ import annotations

import http.client
import json
import socket
import time
from urllib.parse import urlsplit

import pytest

from app.engine.drafting.drafters import Drafter, PromptLookupDrafter
from app.engine.loop.sampling import SamplingParams
from app.engine.loop.speculative import DecodeSettings
from app.server.app import ServerConfig, create_app
from app.server.launch import BackgroundServer, bind_socket
from app.engine.local_session import LocalSession, cache_in_step
from app.engine.session import Prompt
from app.server.model import ServedModel
from tests.server.test_server import DEFAULTS, MODEL, assert_error, metrics, raw, wait_for

ALLOWED = "https://allowed.example"
EVIL = "https://evil.example"
HELLO = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "temperature": 0}
LIMIT_S = 1.0  # header and body deadlines of this module's server
MAX_CONNECTIONS = 8


@pytest.fixture(scope="module")
def server(tiny_loaded):
    # A long context so that one generation can keep the server busy for seconds; no waiting room.
    served = ServedModel.create(LocalSession.around(tiny_loaded(MODEL), PromptLookupDrafter(), n_ctx=4096), DEFAULTS)
    config = ServerConfig(max_waiting=0, body_timeout_s=LIMIT_S, cors_origins=(ALLOWED,))
    with BackgroundServer(create_app(served, config), bind_socket("127.0.0.1", 0),
                          header_timeout_s=LIMIT_S, max_connections=MAX_CONNECTIONS) as running:
        yield running


def address(server) -> tuple[str, int]:
    parts = urlsplit(server.url)
    return parts.hostname, parts.port


def post(server, path: str, payload, headers: dict, source: str | None = None):
    """(status, headers, JSON body) of one POST with exactly these headers."""
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    conn = http.client.HTTPConnection(*address(server), timeout=30,
                                      source_address=(source, 0) if source else None)
    try:
        conn.request("POST", path, body=body, headers=headers)
        response = conn.getresponse()
        data = response.read()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, json.loads(data) if data else None
    finally:
        conn.close()


JSON = {"Content-Type": "application/json"}


# ---------------------------------------------------------------------------------------------
# Item 4: web pages


def test_cross_site_simple_requests_are_refused(server):
    """A page elsewhere can POST a form or text/plain body without a preflight: both refused."""
    path = "/v1/chat/completions"
    body = json.dumps(HELLO).encode()
    for content_type in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"):
        assert_error(post(server, path, body, {"Content-Type": content_type}), 415, "unsupported_media_type")
        assert_error(post(server, path, body, {"Content-Type": content_type, "Origin": EVIL}), 403, "forbidden_origin")
    assert_error(post(server, path, body, {}), 415, "unsupported_media_type")
    assert post(server, path, body, {"Content-Type": "Application/JSON; charset=utf-8"})[0] == 200
    for origin in (EVIL, "null", "http://127.0.0.1.evil.example", "file://", "http://localhost.evil.example:80"):
        assert_error(post(server, path, body, {**JSON, "Origin": origin}), 403, "forbidden_origin")
        assert_error(raw(server, "GET", "/v1/models", headers={"Origin": origin}), 403, "forbidden_origin")
        assert_error(raw(server, "GET", "/health", headers={"Origin": origin}), 403, "forbidden_origin")


def test_loopback_and_allowed_origins_get_cors_headers(server):
    for origin in ("http://localhost:3000", "http://127.0.0.1:5173", "https://[::1]:8443", "http://localhost",
                   ALLOWED, ALLOWED.upper()):
        status, headers, body = post(server, "/v1/chat/completions", HELLO, {**JSON, "Origin": origin})
        assert status == 200, (origin, body)
        assert headers["access-control-allow-origin"] == origin and "Origin" in headers["vary"]
    status, headers, _ = raw(server, "GET", "/v1/models", headers={"Origin": ALLOWED})
    assert status == 200 and headers["access-control-allow-origin"] == ALLOWED
    # Requests without an Origin (curl, SDKs) get no CORS headers and are served as before.
    status, headers, _ = post(server, "/v1/chat/completions", HELLO, JSON)
    assert status == 200 and "access-control-allow-origin" not in headers


def test_preflights_are_answered_deliberately(server):
    asked = {"Access-Control-Request-Method": "POST",
             "Access-Control-Request-Headers": "authorization, content-type, x-stainless-os"}
    for origin in (ALLOWED, "http://localhost:8000"):
        status, headers, body = raw(server, "OPTIONS", "/v1/chat/completions", headers={"Origin": origin, **asked})
        assert status == 204 and body is None
        assert headers["access-control-allow-origin"] == origin
        assert "POST" in headers["access-control-allow-methods"]
        assert headers["access-control-allow-headers"] == asked["Access-Control-Request-Headers"]
        assert int(headers["access-control-max-age"]) > 0
    status, headers, _ = raw(server, "OPTIONS", "/v1/chat/completions", headers={"Origin": EVIL, **asked})
    assert status == 403 and "access-control-allow-origin" not in headers
    # Not a preflight (no Origin): the method is not allowed there, and the answer says which is.
    status, headers, _ = raw(server, "OPTIONS", "/v1/chat/completions")
    assert status == 405 and headers["allow"] == "POST"


# ---------------------------------------------------------------------------------------------
# Item 5: slow clients


def closed_within(sock: socket.socket, seconds: float, trickle: bytes = b"") -> tuple[bool, bytes]:
    """Send `trickle` a byte every 0.2 s until the server closes the connection or `seconds`
    pass; (closed, what the server sent)."""
    sock.settimeout(0.2)
    received = b""
    deadline = time.monotonic() + seconds
    sent = 0
    while time.monotonic() < deadline:
        try:
            if sent < len(trickle):
                sock.send(trickle[sent:sent + 1])
                sent += 1
            chunk = sock.recv(4096)
            if not chunk:
                return True, received
            received += chunk
        except socket.timeout:
            continue
        except (BrokenPipeError, ConnectionResetError):
            return True, received
    return False, received


def test_idle_and_trickled_headers_are_cut_off(server):
    started = time.monotonic()
    with socket.create_connection(address(server)) as idle:  # sends nothing at all
        assert closed_within(idle, 3 * LIMIT_S)[0]
    with socket.create_connection(address(server)) as slow:
        slow.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        assert closed_within(slow, 3 * LIMIT_S, trickle=b"X-Slow: " + b"a" * 100)[0]
    # A keep-alive connection gets the same deadline for its next request's headers.
    with socket.create_connection(address(server)) as kept:
        kept.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        time.sleep(0.1)
        first = kept.recv(4096)
        assert first.startswith(b"HTTP/1.1 200 ")
        kept.sendall(b"GET /health HTTP/1.1\r\n")
        closed, _ = closed_within(kept, 3 * LIMIT_S, trickle=b"X-Slow: " + b"a" * 100)
        assert closed
    assert time.monotonic() - started < 4 * 3 * LIMIT_S


def test_trickled_body_gets_408(server):
    with socket.create_connection(address(server)) as slow:
        slow.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100\r\n\r\n{")
        closed, received = closed_within(slow, 3 * LIMIT_S, trickle=b'"prompt": "' + b"a" * 80)
    assert closed and received.startswith(b"HTTP/1.1 408 "), received
    assert b'"request_timeout"' in received
    assert raw(server, "GET", "/health")[0] == 200


def test_connection_limit_then_recovery(server):
    """Idle connections beyond the limit cannot lock others out for longer than the header deadline."""
    idle = [socket.create_connection(address(server)) for _ in range(MAX_CONNECTIONS)]
    try:
        time.sleep(0.1)
        assert raw_status(server, "/health")[0] == 503  # uvicorn's answer past the limit
        # The header deadline closes the idle ones (we keep our ends open), and service resumes.
        deadline = time.monotonic() + 3 * LIMIT_S
        while raw_status(server, "/health")[0] != 200:
            assert time.monotonic() < deadline, "the idle connections were never closed"
            time.sleep(0.1)
    finally:
        for sock in idle:
            sock.close()


def raw_status(server, path: str):
    conn = http.client.HTTPConnection(*address(server), timeout=30)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.getheaders(), response.read()
    finally:
        conn.close()


def test_full_queue_answers_503_before_tokenizing(server):
    """With the one slot busy, a request is refused at once, before its prompt is tokenized:
    prompts that tokenizing would refuse (too long, a bad token id) get the 503, not their 400."""
    before = metrics(server)
    busy = socket.create_connection(address(server))
    body = json.dumps({"prompt": "hello world", "max_tokens": 3500, "temperature": 0, "stream": True}).encode()
    busy.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    try:
        wait_for(server, lambda m: m["llamacpp:requests_processing"] == 1)
        for prompt in ("word " * 5000, [10**6]):
            error = assert_error(post(server, "/v1/completions", {"prompt": prompt}, JSON), 503, "server_busy")
            assert error["type"] == "unavailable_error"
    finally:
        busy.close()  # cancels the long generation
    after = wait_for(server, lambda m: m["llamacpp:requests_processing"] == 0)
    assert after["specula:requests_rejected_total"] - before["specula:requests_rejected_total"] == 2


# ---------------------------------------------------------------------------------------------
# Item 10: the prompt cache tells a client only about its own prompts


def cached(server, prompt: str, source: str) -> tuple[int, int]:
    status, _, body = post(server, "/v1/completions", {"prompt": prompt, "max_tokens": 1, "temperature": 0},
                           JSON, source=source)
    assert status == 200, body
    return body["usage"]["prompt_tokens_details"]["cached_tokens"], body["timings"]["cache_n"]


def test_cached_tokens_are_reported_only_for_the_same_clients_cache(server, tiny_loaded):
    """Client B (another loopback address) sending A's prompt must not learn that A sent it."""
    secret = "The launch code is 1234 and the vault opens at noon."
    n = len(tiny_loaded(MODEL).tokenizer.encode(secret))
    cached(server, "x", "127.0.0.3")  # whoever ran before, the cache is now a third client's
    before = metrics(server)["llamacpp:prompt_tokens_total"]
    assert cached(server, secret, "127.0.0.1") == (0, 0)
    assert cached(server, secret, "127.0.0.1") == (n - 1, n - 1)  # its own prefix: reported
    assert cached(server, secret, "127.0.0.2") == (0, 0)  # another client: not
    assert cached(server, secret, "127.0.0.2") == (n - 1, n - 1)
    assert cached(server, secret + " More.", "127.0.0.1") == (0, 0)  # B used the cache last
    # /metrics counts what clients were told, or it would leak the same fact.
    assert metrics(server)["llamacpp:prompt_tokens_total"] - before == n + 1 + n + 1 + len(
        tiny_loaded(MODEL).tokenizer.encode(secret + " More."))


# ---------------------------------------------------------------------------------------------
# Item 7: a failed generation keeps a cache that is still in step


class FailingDrafter(Drafter):
    name = "failing"

    def propose(self, context, max_tokens):
        raise RuntimeError("the drafter broke")


def test_a_failed_generation_keeps_the_kv_cache(tiny_loaded):
    served = ServedModel.create(LocalSession.around(tiny_loaded(MODEL)), DEFAULTS)
    settings = DecodeSettings(max_new_tokens=4, sampling=SamplingParams(temperature=0.0))
    prompt = tiny_loaded(MODEL).tokenizer.encode("def add(a, b):\n    return a + b\n")
    list(served.generate(Prompt.of_ids(prompt), settings, lambda: False))
    served.session.new_drafter = FailingDrafter  # fails after the prompt's forward, between steps
    with pytest.raises(RuntimeError):
        list(served.generate(Prompt.of_ids(prompt + prompt[:3]), settings, lambda: False))
    assert cache_in_step(served.session.kv) and served.session.kv.ids[: len(prompt)] == prompt
    served.session.new_drafter = lambda: PromptLookupDrafter()
    summary = list(served.generate(Prompt.of_ids(prompt), settings, lambda: False))[-1].summary
    assert summary.n_prompt_evaluated == 1  # the cache survived: only the last token re-evaluated


# ---------------------------------------------------------------------------------------------
# Item 11: API keys are compared as UTF-8 bytes, stripped the same way on both sides


@pytest.fixture(scope="module")
def keyed(tiny_loaded):
    served = ServedModel.create(LocalSession.around(tiny_loaded(MODEL)), DEFAULTS)
    app = create_app(served, ServerConfig(api_key=" clé-ключ-🔑\n"))  # as pasted into the window
    with BackgroundServer(app, bind_socket("127.0.0.1", 0)) as running:
        yield running


def test_non_latin1_key_matches_and_spaces_do_not_matter(keyed):
    key = "clé-ключ-🔑".encode()
    for value in (b"Bearer " + key, b"bearer " + key, b"Bearer   " + key + b"  "):
        assert raw(keyed, "GET", "/v1/models", headers={"Authorization": value})[0] == 200, value
    for value in (b"Bearer " + key[:-1], b"Bearer", b"",
                  b"Basic " + key, b"Bearer " + key + b"x", "Bearer clé".encode("latin-1")):
        assert_error(raw(keyed, "GET", "/v1/models", headers={"Authorization": value}), 401, "invalid_api_key")
