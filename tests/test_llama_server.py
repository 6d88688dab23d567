"""llama.cpp's own server as Specula starts it and talks to it: found beside the environment,
started on loopback and stopped with its block, and every answer checked: a bad start or a bad
answer is one line, never a traceback."""

from __future__ import annotations

import http.server
import json
import os
import threading

import pytest

from app.engine.llama_server.client import ServerClient, ServerError, parse_completion
from app.engine.llama_server.process import LlamaServer, ServerStartError
from app.engine.llama_server.programs import SERVER, find_program

GOOD = {"tokens": [5, 6], "content": "hi", "timings": {"prompt_n": 3, "prompt_ms": 1.5, "predicted_n": 2,
                                                        "predicted_ms": 20.0, "draft_n": 4, "draft_n_accepted": 3}}


def test_a_good_answer_is_read_with_its_timings():
    reply = parse_completion(GOOD)
    assert reply.tokens == (5, 6) and reply.text == "hi"
    assert reply.decode_tps == pytest.approx(100.0) and reply.accept_rate == pytest.approx(0.75)


@pytest.mark.parametrize("answer", [
    [], "text", {"content": "x"}, {"tokens": ["a"]}, {"tokens": [-1]}, {"tokens": [True]},
    {**GOOD, "content": 5}, {**GOOD, "timings": []},
    {**GOOD, "timings": {"predicted_ms": float("nan")}}, {**GOOD, "timings": {"predicted_ms": -1}},
    {**GOOD, "timings": {"draft_n": 1.5}}, {**GOOD, "timings": {"draft_n": 10 ** 30}},
    {**GOOD, "timings": {"predicted_n": "7"}},
])
def test_a_bad_answer_is_one_line(answer):
    with pytest.raises(ServerError) as caught:
        parse_completion(answer)
    assert "\n" not in str(caught.value)


class _Standin(http.server.BaseHTTPRequestHandler):
    """A server on 127.0.0.1 that answers what the test asks of it."""

    reply: tuple[int, bytes] = (200, b"{}")

    def do_POST(self):  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        status, body = self.reply
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def standin():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Standin)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("status, body, says", [
    (200, b"not json \x1b[2J", "is not JSON: not json \\x1b[2J"),
    (200, b"\xff\xfe", "is not JSON"),
    (500, b"boom", "HTTP 500 boom"),
    (200, json.dumps({"tokens": "nope"}).encode(), "no list of token ids"),
])
def test_a_server_answering_garbage_is_one_line(standin, status, body, says):
    _Standin.reply = (status, body)
    with pytest.raises(ServerError) as caught:
        ServerClient(f"http://127.0.0.1:{standin.server_address[1]}", timeout_s=5).complete([1, 2], 4)
    assert says in str(caught.value) and "\n" not in str(caught.value) and "\x1b" not in str(caught.value)


def test_a_server_that_is_not_there_is_one_line(standin):
    port = standin.server_address[1]
    standin.shutdown()
    standin.server_close()
    with pytest.raises(ServerError, match="could not connect"):
        ServerClient(f"http://127.0.0.1:{port}", timeout_s=5).complete([1], 1)


def _require_server():
    if find_program(SERVER) is None:
        if os.environ.get("SPECULA_REQUIRE_LLAMA") == "1":
            pytest.fail("llama-server is required here (SPECULA_REQUIRE_LLAMA=1)")
        pytest.skip("llama-server is not built here")


def test_a_file_llama_server_refuses_is_one_line_and_no_process_is_left(tmp_path):
    _require_server()
    bad = tmp_path / "notes.gguf"
    bad.write_text("not a model\n" * 100)
    server = LlamaServer(bad, ["-t", "1"], start_timeout_s=60)
    with pytest.raises(ServerStartError) as caught:
        server.start()
    assert "\n" not in str(caught.value) and str(caught.value).startswith("llama-server stopped while starting")
    assert server._process is None


def test_llama_server_answers_greedy_on_loopback_and_stops_with_its_block(tiny_paths):
    _require_server()
    with LlamaServer(tiny_paths["llama-q8"], ["-t", "1"]) as server:
        assert server.url.startswith("http://127.0.0.1:")
        first = server.client.complete([1, 5, 9, 12], 6)
        again = server.client.complete([1, 5, 9, 12], 6)
        process = server._process
    assert first.tokens == again.tokens and 1 <= len(first.tokens) <= 6
    assert first.predicted_n == len(first.tokens) and first.prompt_n == 4
    assert process.poll() is not None  # stopped with the block
    with pytest.raises(ServerError):
        server.client.complete([1], 1)
