"""Stop works on a server that stalls: a streamed reply waiting on a server that sends nothing
more ends within a fraction of a second of the user's cancel, on llama-server's own API and on
OpenAI's, instead of after the read timeout (600 s): one line of nothing, no error."""

from __future__ import annotations

import http.server
import json
import threading
import time

import pytest

from app.engine.llama_server.client import ServerClient
from app.engine.remote.http import RemoteHttp


class _Stalls(http.server.BaseHTTPRequestHandler):
    """Streams one event, then sends nothing for a long while (a stalled or very slow server)."""

    release = threading.Event()

    def do_POST(self):  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        first = {"content": "a", "tokens": [5], "stop": False, "tokens_predicted": 1,
                 "choices": [{"index": 0, "delta": {"content": "a"}, "finish_reason": None}]}
        self.wfile.write(f"data: {json.dumps(first)}\n\n".encode())
        self.wfile.flush()
        self.release.wait(30)

    def log_message(self, *args):
        pass


@pytest.fixture
def stalling():
    _Stalls.release.clear()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Stalls)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    _Stalls.release.set()
    server.shutdown()
    server.server_close()


def _cancelled_after(seconds: float):
    at = time.monotonic() + seconds
    return lambda: time.monotonic() >= at


def test_a_llama_server_stream_stops_at_once_when_cancelled(stalling):
    started = time.monotonic()
    chunks = list(ServerClient(stalling, timeout_s=20).stream([1, 2], 8, {}, _cancelled_after(0.3)))
    assert len(chunks) == 1 and time.monotonic() - started < 3


def test_an_openai_stream_stops_at_once_when_cancelled(stalling):
    started = time.monotonic()
    events = list(RemoteHttp(stalling, timeout_s=20).stream_events("/v1/chat/completions", {}, _cancelled_after(0.3)))
    assert len(events) == 1 and time.monotonic() - started < 3
