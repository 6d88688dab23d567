"""A server at a URL the user names never gets our key taken elsewhere, and never makes us show it
(issue 58 items 1 and 2): llama-server's client follows no redirect (to another port, to ftp://),
and the key and a URL's password appear in no error line, nor in what `specula serve --server`
tells its own clients."""

from __future__ import annotations

import http.server
import json
import threading

import httpx2
import pytest

from app.engine.llama_server.client import ServerClient, ServerError
from app.engine.llama_server.session import ServerSession
from app.engine.llama_server.spec import API_LLAMA, ServerEngine
from app.engine.loop.sampling import SamplingParams
from tests.engine.test_llama_server import _run
from tests.cli.test_server_cli import ServerProcess

KEY = "sk-remote-S3cretKey42"
PASSWORD = "S3CRETPW"
PROPS = {"build_info": "b0-standin", "default_generation_settings": {"n_ctx": 512}}


class _Sink(http.server.BaseHTTPRequestHandler):
    """Where a redirect points: records every request that reaches it, with its headers."""

    seen: list[dict[str, str]] = []

    def _any(self) -> None:
        _Sink.seen.append(dict(self.headers))
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    do_GET = do_POST = _any  # noqa: N815 - http.server's names

    def log_message(self, *args):
        pass


class _Hostile(http.server.BaseHTTPRequestHandler):
    """Answers /props as llama-server does, then each other request as `mode` says: a redirect
    to `target`, or a 400 that echoes the credentials it was sent."""

    mode = "redirect"
    target = ""

    def do_GET(self):  # noqa: N802
        if self.path == "/props":
            return self._send(200, json.dumps(PROPS).encode())
        self._misbehave()

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self._misbehave()

    def _misbehave(self) -> None:
        if self.mode == "redirect":
            self.send_response(302)
            self.send_header("Location", self.target + self.path)
            self.send_header("Content-Length", "0")
            return self.end_headers()
        said = f"your key {self.headers.get('Authorization')} is bad; also Bearer sk-another-KEY9999 is bad"
        self._send(400, json.dumps({"error": {"message": said}}).encode())

    def _send(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def _serve(handler) -> http.server.ThreadingHTTPServer:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def servers():
    sink, hostile = _serve(_Sink), _serve(_Hostile)
    _Sink.seen = []
    yield f"http://127.0.0.1:{hostile.server_address[1]}", f"http://127.0.0.1:{sink.server_address[1]}"
    for server in (sink, hostile):
        server.shutdown()
        server.server_close()


def _calls(client: ServerClient, session: ServerSession):
    """Every request the client and session make, each on its own."""
    greedy = SamplingParams(temperature=0.0)
    return {
        "complete": lambda: client.complete([1, 2], 4),
        "stream": lambda: list(client.stream([1, 2], 4, {})),
        "health": lambda: client.healthy(),
        "tokenize": lambda: client.tokenize("hi"),
        "apply-template": lambda: session.prompt_ids([{"role": "user", "content": "hi"}]),
        "chat reply": lambda: list(session.reply_to(4, greedy, messages=[{"role": "user", "content": "hi"}])),
    }


@pytest.mark.parametrize("where", ["another port", "ftp"])
def test_a_redirect_is_refused_in_one_line_and_the_key_goes_nowhere(servers, where):
    url, sink = servers
    _Hostile.mode, _Hostile.target = "redirect", sink if where == "another port" else "ftp://127.0.0.1:21"
    session = ServerSession(ServerEngine(url=url, api_key=KEY, api=API_LLAMA, timeout_s=5))
    for name, call in _calls(ServerClient(url, KEY, timeout_s=5), session).items():
        with pytest.raises(ServerError) as caught:
            call()
        said = str(caught.value)
        assert "HTTP 302" in said and "redirect" in said and KEY not in said and "\n" not in said, name
    assert _Sink.seen == []  # nothing reached the other port: neither the request nor the key


def test_the_key_a_server_echoes_back_is_never_shown(servers):
    url, _ = servers
    _Hostile.mode = "leak"
    session = ServerSession(ServerEngine(url=url, api_key=KEY, api=API_LLAMA, timeout_s=5))
    for name, call in _calls(ServerClient(url, KEY, timeout_s=5), session).items():
        if name == "health":
            continue  # /health reads no text
        with pytest.raises(ServerError) as caught:
            call()
        said = str(caught.value)
        assert "HTTP 400" in said and "your key Bearer <key>" in said, (name, said)
        assert KEY not in said and "sk-another-KEY9999" not in said, name


def test_a_password_in_the_url_is_shown_in_no_line(servers):
    url, _ = servers
    _Hostile.mode = "leak"
    port = url.rsplit(":", 1)[1]
    with_password = f"http://alice:{PASSWORD}@127.0.0.1:{port}"
    with pytest.raises(ServerError) as caught:
        ServerClient(with_password, KEY, timeout_s=5).complete([1], 1)
    assert PASSWORD not in str(caught.value) and "alice" not in str(caught.value)
    gone = f"http://alice:{PASSWORD}@127.0.0.1:9"
    with pytest.raises(ServerError) as caught:
        ServerClient(gone, timeout_s=5).complete([1], 1)
    assert "could not connect" in str(caught.value) and PASSWORD not in str(caught.value)


def test_run_on_a_url_with_a_password_and_a_key_shows_neither(capsys, servers, tmp_path):
    url, _ = servers
    _Hostile.mode = "leak"
    key_file = tmp_path / "key"
    key_file.write_text(KEY + "\n")
    with_password = url.replace("http://", f"http://alice:{PASSWORD}@")
    code, out, err = _run(capsys, "run", "-m", "x", "--server", with_password, "--api-key-file", str(key_file),
                          "--chat", "-p", "hi", "-n", "4")
    assert code == 1 and "HTTP 400" in err
    assert KEY not in out + err and PASSWORD not in out + err


def test_serve_relays_no_key_and_no_password_to_its_clients(servers, tmp_path):
    """`specula serve --server URL --server-api-key-file F`: the upstream's refusal reaches our
    client as a 502 with its reason, but without the key it echoed or the URL's password."""
    url, _ = servers
    _Hostile.mode = "leak"
    key_file = tmp_path / "key"
    key_file.write_text(KEY + "\n")
    with_password = url.replace("http://", f"http://alice:{PASSWORD}@")
    server = ServerProcess(["-m", "standin", "--server", with_password, "--server-api-key-file", str(key_file),
                            "--port", "0"])
    try:
        ours = server.wait_ready()
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        with httpx2.Client(base_url=ours, timeout=60) as client:
            answers = [client.post("/v1/chat/completions", json=body),
                       client.post("/v1/chat/completions", json={**body, "stream": True})]
    finally:
        server.stop()
    for answer in answers:
        assert answer.status_code == 502, answer.text
        assert "HTTP 400" in answer.text and "<key>" in answer.text
        assert KEY not in answer.text and PASSWORD not in answer.text and "sk-another" not in answer.text
    assert KEY not in "".join(server.lines) and PASSWORD not in "".join(server.lines)
