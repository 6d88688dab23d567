"""Hostile servers on 127.0.0.1 (issue 58, items 3, 5 and 7): a reply that never ends stops at
max_new_tokens as a "limit" stop with its connection closed and its text bounded; keep-alive
lines forever are one line; a /metrics of a million labels is refused within ~2 s and the reply
goes on with its counts unknown; JSON nested 100,000 deep is one line, never a RecursionError;
a server's model names and reply reach the terminal with their control characters escaped."""

from __future__ import annotations

import http.server
import json
import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterator

import pytest

from app.engine.errors import ServerError
from app.engine.llama_server.client import ServerClient
from app.engine.llama_server.client import parse_chunk as llama_chunk
from app.engine.llama_server.engine import generate_on_server
from app.engine.events import UNKNOWN_DRAFTS, DoneEvent, StepEvent, StopReason
from app.engine.loop.sampling import SamplingParams
from app.engine.remote.engine import generate_on_openai
from app.engine.remote.metrics import parse_spec_counters
from app.engine.remote.openai_client import OpenAIClient
from app.engine.remote.openai_client import parse_chunk as openai_chunk
from tests.engine.test_llama_server import _run

ENDLESS = 200_000  # "forever", bounded: the code before this fix read all of it (or ran out of memory)
GREEDY = SamplingParams(temperature=0.0)
DEEP = b"[" * 100_000
VLLM_COUNTERS = ("vllm:spec_decode_num_draft_tokens_total 4\n"
                 "vllm:spec_decode_num_accepted_tokens_total 2\n")


class _Hostile(http.server.BaseHTTPRequestHandler):
    """Answers as the test's class attributes say: `line(i)` is the stream's i-th line (None ends
    it without [DONE]); `cut` is set once a write finds the client gone."""

    models: list[str] = ["org/m"]
    models_body: bytes | None = None
    metrics: bytes | None = None
    line: Callable[[int], bytes | None] = staticmethod(lambda i: None)
    cut: threading.Event

    def do_GET(self):  # noqa: N802 - http.server's name
        if self.path == "/v1/models":
            body = self.models_body or json.dumps({"data": [{"id": m} for m in self.models]}).encode()
            return self._send(200, body)
        if self.path == "/metrics" and self.metrics is not None:
            return self._send(200, self.metrics)
        self._send(404, b"{}")

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.path == "/tokenize":
            return self._send(200, DEEP)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        try:
            for i in range(ENDLESS):
                line = self.line(i)
                if line is None:
                    break
                self.wfile.write(line)
            self.wfile.flush()
        except OSError:  # the client closed the connection: what a bounded reply does
            self.cut.set()

    def _send(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


class _Quiet(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address) -> None:
        pass  # a client that hangs up is what these tests make happen


@contextmanager
def hostile(**attrs) -> Iterator[tuple[str, type]]:
    handler = type("Handler", (_Hostile,), {"cut": threading.Event(), **{
        k: staticmethod(v) if callable(v) else v for k, v in attrs.items()}})
    server = _Quiet(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", handler
    finally:
        server.shutdown()
        server.server_close()


def _event(data: object) -> bytes:
    return b"data: " + json.dumps(data).encode() + b"\n\n"


def _choice(text: str | None, finish: str | None = None) -> bytes:
    """A chunk of a chat reply and of a text completion at once (delta.content and text)."""
    delta = {} if text is None else {"content": text}
    return _event({"choices": [{"index": 0, "delta": delta, "text": text, "finish_reason": finish}]})


def _openai_text(i: int) -> bytes:
    return _choice("tok ")


def _openai_empty(i: int) -> bytes:
    return _choice(None)


def _llama_token(i: int) -> bytes:
    return _event({"content": "ab", "tokens": [i % 100], "stop": False, "tokens_predicted": i + 1,
                   "timings": {"draft_n": 0, "draft_n_accepted": 0}})


def _llama_text_only(i: int) -> bytes:  # text without token ids or a count: the text bound stops it
    return _event({"content": "x" * 1000, "stop": False})


def _llama_nothing(i: int) -> bytes:  # chunks with nothing in them, forever
    return _event({"content": "", "tokens": [], "stop": False})


def _reply(events: list) -> tuple[str, object]:
    text = "".join(e.text for e in events if isinstance(e, StepEvent))
    return text, next(e.summary for e in events if isinstance(e, DoneEvent))


@pytest.mark.parametrize("line, text", [(_openai_text, "tok " * 8), (_openai_empty, "")])
def test_an_endless_openai_reply_ends_at_max_tokens_with_its_connection_closed(line, text):
    with hostile(line=line) as (url, handler):
        started = time.monotonic()
        events = list(generate_on_openai(OpenAIClient(url, timeout_s=10), "org/m", 8, GREEDY, "x", prompt="hi"))
        assert time.monotonic() - started < 5
        assert handler.cut.wait(5)  # we closed it: the server's next writes failed
    got, summary = _reply(events)
    assert got == text and summary.stop_reason == StopReason.MAX_TOKENS and summary.n_predicted <= 8


@pytest.mark.parametrize("line, most_chars", [(_llama_token, 16), (_llama_text_only, 8 * 256 + 4096),
                                              (_llama_nothing, 0)])
def test_an_endless_llama_server_reply_ends_at_max_tokens(line, most_chars):
    with hostile(line=line) as (url, handler):
        started = time.monotonic()
        events = list(generate_on_server(ServerClient(url, timeout_s=10), [1, 2], 8, GREEDY, "x"))
        assert time.monotonic() - started < 5
        assert handler.cut.wait(5)
    text, summary = _reply(events)
    assert len(text) <= most_chars and summary.stop_reason == StopReason.MAX_TOKENS
    assert len(summary.tokens) <= 8 and summary.n_predicted <= 8


def test_keep_alive_lines_forever_are_one_line():
    with hostile(line=lambda i: b": keep-alive " + b"." * 200 + b"\n\n") as (url, handler):
        with pytest.raises(ServerError) as caught:
            list(generate_on_server(ServerClient(url, timeout_s=10), [1, 2], 8, GREEDY, "x"))
        assert handler.cut.wait(5)  # well before the stand-in's ENDLESS lines ran out
    assert "without data" in str(caught.value) and "\n" not in str(caught.value)


def test_a_million_labels_are_refused_within_seconds():
    labels = ",".join(f'l{i}="{i}"' for i in range(1_000_000))
    for name in ("vllm:spec_decode_num_draft_tokens_total", "unrelated"):
        started = time.monotonic()
        with pytest.raises(ServerError) as caught:
            parse_spec_counters(f"{name}{{{labels}}} 1\n" + VLLM_COUNTERS)
        assert time.monotonic() - started < 2 and "\n" not in str(caught.value)
    few = ",".join(f'l{i}="{i}"' for i in range(100))  # short, but more labels than any exporter's
    with pytest.raises(ServerError, match="more than 64 labels"):
        parse_spec_counters(f"unrelated{{{few}}} 1\n" + VLLM_COUNTERS)


@pytest.mark.parametrize("metrics", [
    ("vllm:spec_decode_num_draft_tokens_total NaN\nvllm:spec_decode_num_accepted_tokens_total 1\n").encode(),
    ("x{" + ",".join(f'a{i}="1"' for i in range(1_000_000)) + "} 1\n" + VLLM_COUNTERS).encode(),  # 11 MB
])
def test_a_metrics_that_cannot_be_read_leaves_the_counts_unknown_and_the_reply_goes_on(metrics):
    lines = [_openai_text(0), _choice(None, "stop"), b"data: [DONE]\n\n"]
    with hostile(line=lambda i: lines[i] if i < len(lines) else None, metrics=metrics) as (url, _):
        started = time.monotonic()
        events = list(generate_on_openai(OpenAIClient(url, timeout_s=10), "org/m", 8, GREEDY, "x", prompt="hi"))
        assert time.monotonic() - started < 5
    text, summary = _reply(events)
    assert text == "tok " and summary.stop_reason == StopReason.EOS
    assert set(UNKNOWN_DRAFTS) <= set(summary.unknown)


def _one_line(exc: BaseException) -> str:
    assert isinstance(exc, ServerError) and "\n" not in str(exc) and "\x1b" not in str(exc)
    return str(exc)


def test_json_nested_100000_deep_is_one_line():
    with hostile(models_body=DEEP, line=lambda i: b"data: " + DEEP + b"\n\n" if i == 0 else None) as (url, _):
        with pytest.raises(ServerError) as models:
            OpenAIClient(url, timeout_s=10).model_ids()
        with pytest.raises(ServerError) as posted:
            ServerClient(url, timeout_s=10).tokenize("hi")
        with pytest.raises(ServerError) as streamed:
            list(generate_on_openai(OpenAIClient(url, timeout_s=10), "org/m", 8, GREEDY, "x", prompt="hi"))
    assert "nested too deeply" in _one_line(models.value) and "/v1/models" in str(models.value)
    assert "nested too deeply" in _one_line(posted.value) and "/tokenize" in str(posted.value)
    assert "nested too deeply" in _one_line(streamed.value)


def test_an_error_nested_past_the_recursion_limit_is_one_line():
    deep: list = []
    for _ in range(100_000):
        deep = [deep]
    for parse, data in ((llama_chunk, {"error": deep}), (lambda d: openai_chunk(d, True, str),
                                                         {"error": {"message": deep}})):
        with pytest.raises(ServerError) as caught:
            parse(data)
        assert "nested too deeply" in _one_line(caught.value)


def test_a_deep_json_server_is_one_line_from_the_command_line(capsys):
    with hostile(models_body=DEEP) as (url, _):
        code, out, err = _run(capsys, "run", "-m", "x", "--server", url, "-p", "hi", "-n", "4")
    assert code == 1 and len(err.strip().splitlines()) == 1 and "Traceback" not in err


ESCAPES = "\x1b]52;c;aGFja2Vk\x07\x1b[2J\x9b31m\r"


def test_a_servers_model_names_and_reply_reach_the_terminal_escaped(capsys):
    lines = [_choice(f"one{ESCAPES}\n\ttwo"), _choice(None, "stop"), b"data: [DONE]\n\n"]
    with hostile(models=[f"org/m{ESCAPES}"], line=lambda i: lines[i] if i < len(lines) else None) as (url, _):
        code, out, err = _run(capsys, "run", "-m", "x", "--server", url, "-p", "hi", "-n", "4", "--json")
    assert code == 0, err
    assert not any(c in out + err for c in "\x1b\x07\x9b\r")
    assert "one\\x1b]52;c;aGFja2Vk\\x07" in out and "\n\ttwo" in out  # shown, newline and tab kept
    assert json.loads(out.strip().splitlines()[-1])["text"] == f"one{ESCAPES}\n\ttwo"  # --json: the same text
    assert "org/m\\x1b]52" in err  # the plan line names the model, escaped
    with hostile(models=[f"a{ESCAPES}", f"b{ESCAPES}"]) as (url, _):
        code, out, err = _run(capsys, "run", "-m", "x", "--server", url, "-p", "hi", "-n", "4")
    assert code == 1 and "serves 2 models" in err and not any(c in err for c in "\x1b\x07\x9b\r")
