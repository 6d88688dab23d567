"""The server's admission rule and the llama-server fields it cannot honour (issue 42, items 6
and 12), on a real server: uvicorn on a loopback port, the tiny llama-f32 model, raw HTTP.

Admission: a request takes its place in the queue before its prompt is tokenized (a flood of
long prompts used to be tokenized whole, every one of them, before any was refused), and a
prompt whose bytes alone cannot fit the context is refused without being tokenized."""

from __future__ import annotations

import http.client
import json
import threading
from urllib.parse import urlsplit

import pytest

from app.engine.drafting.drafters import PromptLookupDrafter
from app.engine.settings import GenSettings
from app.server.app import ServerConfig, create_app
from app.server.launch import BackgroundServer, bind_socket
from app.engine.local_session import LocalSession
from app.server.model import ServedModel

N_CTX = 4096
HELLO = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def server(tiny_loaded):
    served = ServedModel.create(LocalSession.around(tiny_loaded("llama-f32"), PromptLookupDrafter(), n_ctx=N_CTX),
                                GenSettings(temperature=0.0))
    app = create_app(served, ServerConfig(max_waiting=1))
    with BackgroundServer(app, bind_socket("127.0.0.1", 0)) as running:
        yield running


def post(server, path: str, payload) -> tuple[int, dict, dict]:
    parts = urlsplit(server.url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=120)
    try:
        conn.request("POST", path, body=json.dumps(payload).encode(), headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), json.loads(response.read())
    finally:
        conn.close()


def words(n_bytes: int) -> str:
    return ("The quick brown fox jumps over the lazy dog. " * (n_bytes // 45 + 1))[:n_bytes]


def test_a_prompt_whose_bytes_cannot_fit_the_context_is_refused_before_tokenizing(server, tiny_loaded):
    # 900 KB: however the tiny vocabulary's longest token (24 bytes) tokenizes it, far more than
    # 4096 tokens. The answer says so from the byte count, not from a count of tokens.
    for path, payload in (("/v1/chat/completions", {"messages": [{"role": "user", "content": words(900_000)}]}),
                          ("/v1/completions", {"prompt": words(900_000)})):
        status, _, body = post(server, path, payload)
        assert status == 400 and body["error"]["code"] == "context_length_exceeded", body
        assert "bytes" in body["error"]["message"], body
    # Near the bound it is tokenized and counted exactly, as before.
    status, _, body = post(server, "/v1/completions", {"prompt": words(20_000)})
    assert status == 400 and body["error"]["code"] == "context_length_exceeded", body
    assert "the prompt has" in body["error"]["message"] and "tokens" in body["error"]["message"]


def test_a_flood_of_long_prompts_is_refused_503_without_tokenizing_each(server):
    # Eight at once, each of them tokenized for a while (and then over the context): one may
    # run and one wait (max_waiting=1) while their prompts are tokenized, the rest get 503 at
    # once. Before, none was counted until tokenized: all eight were tokenized, none got 503.
    results: list[tuple[int, dict, dict]] = []
    start = threading.Barrier(8)

    def one() -> None:
        start.wait()
        results.append(post(server, "/v1/chat/completions",
                            {"messages": [{"role": "user", "content": words(250_000)}], "max_tokens": 1}))

    threads = [threading.Thread(target=one) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    statuses = sorted(status for status, _, _ in results)
    busy = [(headers, body) for status, headers, body in results if status == 503]
    assert busy, statuses
    assert all(body["error"]["code"] == "server_busy" and headers.get("retry-after") for headers, body in busy)
    assert set(statuses) <= {400, 503}, statuses
    # Every place was given back, refused or not: a short request is served.
    status, _, body = post(server, "/v1/chat/completions", {"messages": HELLO, "max_tokens": 2})
    assert status == 200, body


# llama-server's fields that change the reply: a 400 naming the field unless at its neutral value.
NOT_HONOURED = [
    ("grammar", 'root ::= "yes" | "no"'), ("json_schema", {"type": "object"}), ("json_schema", {}),
    ("repeat_penalty", 1.1), ("repeat_penalty", "x"), ("typical_p", 0.5), ("mirostat", 2), ("n_probs", 5),
    ("dry_multiplier", 0.8), ("xtc_probability", 0.5), ("dynatemp_range", 0.5), ("ignore_eos", True),
]
NEUTRAL = {"grammar": "", "json_schema": None, "repeat_penalty": 1.0, "typical_p": 1, "mirostat": 0,
           "n_probs": 0, "dry_multiplier": 0, "xtc_probability": 0.0, "dynatemp_range": 0, "ignore_eos": False}


@pytest.mark.parametrize("field,value", NOT_HONOURED)
def test_llama_server_fields_we_cannot_honour_are_400(server, field, value):
    for path, base in (("/v1/chat/completions", {"messages": HELLO}), ("/v1/completions", {"prompt": "hi"})):
        status, _, body = post(server, path, {**base, "max_tokens": 1, field: value})
        assert status == 400, (path, field, body)
        assert body["error"]["param"] == field and "\n" not in body["error"]["message"], body


def test_their_neutral_values_are_accepted(server):
    status, _, body = post(server, "/v1/chat/completions", {"messages": HELLO, "max_tokens": 2, **NEUTRAL})
    assert status == 200, body
