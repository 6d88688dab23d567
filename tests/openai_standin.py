"""A stand-in for a server speaking OpenAI's API on 127.0.0.1 (vLLM's shape: /v1/models, streamed
chat and text completions with usage, and /metrics with vLLM's speculative counters, which each
reply advances), made to answer garbage, cut a stream off, stall or send a huge chunk on demand."""

from __future__ import annotations

import http.server
import json
import threading
import time

REPLY = ["Hello", ",", " world", "!"]
DRAFTED_PER_REPLY, ACCEPTED_PER_REPLY, STEPS_PER_REPLY = 6, 4, 2


class Standin(http.server.BaseHTTPRequestHandler):
    mode = "good"  # good, garbage, cutoff, slow, huge, error, no-metrics, not-utf8, bad-usage, models-garbage,
    # models-cutoff, models-slow
    key: str | None = None
    replies = 0
    seen: list[dict] = []

    def do_GET(self):  # noqa: N802 - http.server's name
        if not self._authorised():
            return
        if self.path == "/v1/models" and self.mode in ("models-cutoff", "models-slow"):  # promises 1000 bytes
            self.send_response(200)
            self.send_header("Content-Length", "1000")
            self.end_headers()
            self.wfile.write(b'{"data": [')
            self.wfile.flush()
            return time.sleep(3 if self.mode == "models-slow" else 0)
        if self.path == "/v1/models":
            body = b"[1, 2" if self.mode == "models-garbage" else json.dumps(
                {"object": "list", "data": [{"id": "org/tiny-model", "object": "model"}]}).encode()
            return self._send(200, body, "application/json")
        if self.path == "/metrics" and self.mode != "no-metrics":
            return self._send(200, self._metrics().encode(), "text/plain; version=0.0.4")
        self._send(404, b'{"detail":"Not Found"}', "application/json")

    def do_POST(self):  # noqa: N802
        if not self._authorised():
            return
        Standin.seen.append(json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0)))))
        if self.path not in ("/v1/chat/completions", "/v1/completions"):
            return self._send(404, b"{}", "application/json")
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        chat = self.path == "/v1/chat/completions"
        for i, piece in enumerate(REPLY):
            if self.mode == "cutoff" and i == 2:
                return self.wfile.flush()  # the connection closes mid-reply
            if self.mode == "slow" and i == 1:
                time.sleep(3)
            self._event(_chunk(piece, None, chat))
        self._misbehave()
        Standin.replies += 1
        self._event(_chunk("", "stop", chat))
        usage = {"prompt_tokens": 7, "completion_tokens": len(REPLY), "total_tokens": 7 + len(REPLY)}
        if self.mode == "bad-usage":
            usage["completion_tokens"] = -4
        self._event({"id": "c1", "object": "chat.completion.chunk", "choices": [], "usage": usage})
        self.wfile.write(b"data: [DONE]\n\n")

    def _misbehave(self) -> None:
        if self.mode == "garbage":
            self.wfile.write(b"data: {not json\x1b[2J\n\n")
        elif self.mode == "huge":
            self.wfile.write(b"data: " + b"x" * (5 * 1024 * 1024) + b"\n\n")
        elif self.mode == "error":
            self._event({"error": {"message": "the engine died", "code": 500}})
        elif self.mode == "not-utf8":
            self.wfile.write(b'data: {"choices": [{"delta": {"content": "\xff\xfe"}}]}\n\n')

    def _metrics(self) -> str:
        n = Standin.replies
        series = '{engine="0",model_name="org/tiny-model"}'
        return (f"# TYPE vllm:spec_decode_num_drafts_total counter\n"
                f"vllm:spec_decode_num_drafts_total{series} {n * STEPS_PER_REPLY}.0\n"
                f"# TYPE vllm:spec_decode_num_draft_tokens_total counter\n"
                f"vllm:spec_decode_num_draft_tokens_total{series} {n * DRAFTED_PER_REPLY}.0\n"
                f"# TYPE vllm:spec_decode_num_accepted_tokens_total counter\n"
                f"vllm:spec_decode_num_accepted_tokens_total{series} {n * ACCEPTED_PER_REPLY}.0\n"
                f"# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter\n"
                f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="org/tiny-model",position="0"}} {n * 2}.0\n'
                f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="org/tiny-model",position="1"}} {n * 2}.0\n'
                f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="org/tiny-model",position="2"}} 0.0\n')

    def _authorised(self) -> bool:
        if self.key and self.headers.get("Authorization") != f"Bearer {self.key}":
            self._send(401, json.dumps({"error": f"bad key {self.headers.get('Authorization')}"}).encode(),
                       "application/json")
            return False
        return True

    def _event(self, data: dict) -> None:
        self.wfile.write(f"data: {json.dumps(data)}\n\n".encode())
        self.wfile.flush()

    def _send(self, status: int, body: bytes, kind: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def _chunk(text: str, finish: str | None, chat: bool) -> dict:
    choice = {"index": 0, "finish_reason": finish}
    choice.update({"delta": {"content": text}} if chat else {"text": text})
    return {"id": "c1", "object": "chat.completion.chunk" if chat else "text_completion", "choices": [choice]}


class _Quiet(http.server.ThreadingHTTPServer):
    """A client that hangs up mid-answer is what some tests do: not an error to print (which
    capsys would read as the command's own stderr)."""

    def handle_error(self, request, client_address) -> None:
        import sys

        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class StandinServer:
    """The stand-in, on a free port of 127.0.0.1, for one `with` block."""

    def __init__(self, mode: str = "good", key: str | None = None) -> None:
        Standin.mode, Standin.key, Standin.replies, Standin.seen = mode, key, 0, []
        self.server = _Quiet(("127.0.0.1", 0), Standin)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> "StandinServer":
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
