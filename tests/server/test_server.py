"""`specula serve`'s API on a real server: uvicorn on a free loopback port in this process, a tiny
real GGUF model (llama-f32, prompt lookup drafting), the official `openai` client for what users
do and raw HTTP (http.client) for what a broken or hostile client does."""

from __future__ import annotations

import http.client
import json
import re
import socket
import time
from urllib.parse import urlsplit

import openai
import pytest

from app.engine.drafting.drafters import PromptLookupDrafter
from app.engine.settings import GenSettings
from app.server.app import ServerConfig, create_app
from app.server.launch import BackgroundServer, bind_socket
from app.engine.local_session import LocalSession
from app.server.model import ServedModel
from app.server.params import GenerationRequest

MODEL = "llama-f32"
CODE = "def add(a, b):\n    return a + b\n\ndef add(a, b):\n"
# The server's defaults are the CLI's (llama-server's): sampling at temperature 0.8.
DEFAULTS = GenSettings()  # the command line's: temperature 0.8, top-k 40, top-p 0.95, min-p 0.05


@pytest.fixture(scope="module")
def server(tiny_loaded):
    served = ServedModel.create(LocalSession.around(tiny_loaded(MODEL), PromptLookupDrafter()), DEFAULTS)
    app = create_app(served, ServerConfig(max_waiting=4))
    with BackgroundServer(app, bind_socket("127.0.0.1", 0)) as running:
        yield running


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="not-needed", max_retries=0, timeout=60)


def raw(server, method: str, path: str, body: bytes | None = None, headers: dict | None = None):
    """(status, headers, parsed JSON body) over a fresh connection."""
    parts = urlsplit(server.url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        data = response.read()
        return response.status, dict(response.getheaders()), json.loads(data) if data else None
    finally:
        conn.close()


def post(server, path: str, payload, **kwargs):
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    return raw(server, "POST", path, body, {"Content-Type": "application/json", **kwargs})


def assert_error(result, status: int, code: str, param: str | None = None) -> dict:
    got_status, headers, body = result
    assert got_status == status, body
    assert headers["content-type"] == "application/json"
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == code, error
    assert "\n" not in error["message"] and "Traceback" not in error["message"]
    if param is not None:
        assert error["param"] == param, error
    return error


def metrics(server) -> dict[str, float]:
    parts = urlsplit(server.url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    return {name: float(value) for name, value in re.findall(r"^(\S+) (\S+)$", text, re.M)}


# ---------------------------------------------------------------------------------------------
# What clients do


def test_models_list_and_health(server, client):
    models = client.models.list().data
    assert [m.id for m in models] == [MODEL]
    assert models[0].model_extra["meta"]["n_ctx"] == 512
    assert client.models.retrieve(MODEL).id == MODEL
    assert raw(server, "GET", "/health")[2] == {"status": "ok"}
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")


def test_chat_streamed_equals_not_streamed_with_usage_and_timings(client):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hello."}]
    whole = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=24, temperature=0)
    choice = whole.choices[0]
    assert whole.object == "chat.completion" and whole.model == MODEL
    assert choice.message.role == "assistant" and choice.finish_reason in ("stop", "length")
    assert whole.usage.completion_tokens <= 24 and whole.usage.prompt_tokens > 10
    assert whole.usage.total_tokens == whole.usage.prompt_tokens + whole.usage.completion_tokens
    timings = whole.model_extra["timings"]
    assert timings["predicted_n"] == whole.usage.completion_tokens
    assert timings["predicted_per_second"] > 0 and timings["prompt_per_second"] >= 0
    assert 0 <= timings["draft_n_accepted"] <= timings["draft_n"]
    # One rule for the rate (issue 61 item 3): the steps after the first token, whose logits the
    # prompt pass gave, the end-of-generation step counted: `run --json`'s decode_tps and
    # llama-server's own predicted_per_second.
    steps = timings["predicted_n"] - 1 + int(choice.finish_reason == "stop")
    assert timings["predicted_per_second"] == pytest.approx(1000 * steps / timings["predicted_ms"], rel=1e-9)

    chunks = list(client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=24, temperature=0, stream=True,
        stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == choice.message.content
    finish = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finish) == 1 and finish[0].choices[0].finish_reason == choice.finish_reason
    assert finish[0].usage.completion_tokens == whole.usage.completion_tokens  # llama-server's way
    assert finish[0].model_extra["timings"]["predicted_n"] == whole.usage.completion_tokens
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    # The same conversation again: its prompt is served from the KV cache but the last token.
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == whole.usage.prompt_tokens - 1


def test_completions_streamed_and_not_and_lookup_drafts(client):
    whole = client.completions.create(model=MODEL, prompt=CODE, max_tokens=32, temperature=0)
    assert whole.object == "text_completion"
    assert whole.choices[0].finish_reason in ("stop", "length")
    stream = list(client.completions.create(model=MODEL, prompt=CODE, max_tokens=32, temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in stream) == whole.choices[0].text
    assert stream[-1].choices[0].finish_reason == whole.choices[0].finish_reason
    assert whole.model_extra["timings"]["draft_n"] > 0  # the prompt repeats: lookup finds drafts
    # The model can be named by its file name, or not at all.
    by_file = client.completions.create(model=MODEL + ".gguf", prompt=CODE, max_tokens=32, temperature=0)
    assert by_file.choices[0].text == whole.choices[0].text


def test_token_ids_prompt_and_max_tokens(client, tiny_loaded):
    ids = tiny_loaded(MODEL).tokenizer.encode(CODE)
    by_ids = client.completions.create(model=MODEL, prompt=ids, max_tokens=5, temperature=0)
    by_text = client.completions.create(model=MODEL, prompt=CODE, max_tokens=5, temperature=0)
    assert by_ids.choices[0].text == by_text.choices[0].text
    assert by_ids.usage.prompt_tokens == len(ids)
    assert by_text.usage.completion_tokens == 5 and by_text.choices[0].finish_reason == "length"
    newer = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                           max_completion_tokens=3, temperature=0)
    assert newer.usage.completion_tokens == 3


def test_seed_reproduces_sampling_and_defaults_sample(client):
    def sample(**kwargs) -> str:
        return client.completions.create(model=MODEL, prompt="Once", max_tokens=24, **kwargs).choices[0].text

    extras = {"top_k": 0, "min_p": 0.0}  # llama.cpp's fields, beyond OpenAI's
    seeded = {sample(temperature=1.0, top_p=1.0, seed=123, extra_body=extras) for _ in range(2)}
    assert len(seeded) == 1
    # No temperature given: the server's default (0.8, sampling), not greedy, so unseeded runs differ.
    greedy = sample(temperature=0)
    unseeded = {sample() for _ in range(4)}
    assert len(unseeded | {greedy}) > 1


def test_stop_strings_cut_the_text(client):
    full = client.completions.create(model=MODEL, prompt=CODE, max_tokens=32, temperature=0).choices[0].text
    cut_at = len(full) // 2
    stop = full[cut_at:cut_at + 2]
    assert len(stop) == 2
    result = client.completions.create(model=MODEL, prompt=CODE, max_tokens=32, temperature=0, stop=[stop, "zzz"])
    assert result.choices[0].text == full[: full.index(stop)]
    assert result.choices[0].finish_reason == "stop"
    streamed = client.completions.create(model=MODEL, prompt=CODE, max_tokens=32, temperature=0, stop=stop, stream=True)
    assert "".join(c.choices[0].text for c in streamed) == full[: full.index(stop)]


# ---------------------------------------------------------------------------------------------
# Bad requests: OpenAI-style JSON errors, the server unharmed


def test_malformed_json_and_wrong_types(server):
    path = "/v1/chat/completions"
    hello = [{"role": "user", "content": "hi"}]
    assert_error(post(server, path, b"{not json"), 400, "invalid_json")
    assert_error(post(server, path, b"\xff\xfe"), 400, "invalid_json")
    assert_error(post(server, path, b"[1, 2]"), 400, "invalid_json")
    assert_error(post(server, path, b'{"messages": [], "temperature": NaN}'), 400, "invalid_json")
    for payload, param in (
        ({"messages": "hi"}, "messages"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}, "messages[0].content"),
        ({"messages": hello, "max_tokens": "ten"}, "max_tokens"),
        ({"messages": hello, "max_tokens": 0}, "max_tokens"),
        ({"messages": hello, "temperature": "hot"}, "temperature"),
        ({"messages": hello, "temperature": -1}, "temperature"),
        ({"messages": hello, "top_p": 1.5}, "top_p"),
        ({"messages": hello, "top_k": 2.5}, "top_k"),
        ({"messages": hello, "seed": True}, "seed"),
        ({"messages": hello, "stream": "yes"}, "stream"),
        ({"messages": hello, "stop": 5}, "stop"),
        ({"messages": hello, "stop": ["a"] * 17}, "stop"),
        ({"messages": hello, "n": 2}, "n"),
        ({"messages": hello, "model": 7}, "model"),
        ({"messages": hello, "tools": [{"type": "function"}]}, "tools"),
        # Used to be 500s: an unhashable role, a number beyond float's range.
        ({"messages": [{"role": ["user"], "content": "hi"}]}, "messages[0].role"),
        ({"messages": [{"role": {"a": 1}, "content": "hi"}]}, "messages[0].role"),
        ({"messages": hello, "temperature": 10**400}, "temperature"),
        ({"messages": hello, "top_p": -(10**400)}, "top_p"),
        # Fields that would change the reply and that the server cannot honour (params.py).
        ({"messages": hello, "logit_bias": {"50256": -100}}, "logit_bias"),
        ({"messages": hello, "presence_penalty": 0.5}, "presence_penalty"),
        ({"messages": hello, "frequency_penalty": -1}, "frequency_penalty"),
        ({"messages": hello, "frequency_penalty": "x"}, "frequency_penalty"),
        ({"messages": hello, "tool_choice": "required"}, "tool_choice"),
        ({"messages": hello, "tool_choice": {"type": "function", "function": {"name": "f"}}}, "tool_choice"),
        ({"messages": hello, "top_logprobs": 3}, "top_logprobs"),
        ({"messages": hello, "functions": [{"name": "f"}]}, "functions"),
    ):
        assert_error(post(server, path, payload), 400, "invalid_value", param)
    # A lone surrogate (half a UTF-16 pair) is no text: the tokenizer failed on it (a 500).
    for payload in ({"messages": [{"role": "user", "content": "a\ud800b"}]},
                    {"messages": [{"role": "user", "content": [{"type": "text", "text": "\udfff"}]}]},
                    {"messages": hello, "stop": ["\ud800"]}, {"messages": hello, "model": "\ud800"}):
        assert_error(post(server, path, payload), 400, "invalid_value")
    assert_error(post(server, "/v1/completions", {"prompt": "a\ud800b"}), 400, "invalid_value")
    # Their neutral values are what many clients always send: accepted. top_p 0 and a temperature
    # too small to divide by used to be 500s; they mean greedy (the same text as temperature 0).
    neutral = {"logit_bias": {}, "presence_penalty": 0, "frequency_penalty": 0.0, "tool_choice": "auto",
               "top_logprobs": None, "logprobs": False}
    texts = set()
    for sampling in ({"temperature": 0}, {"temperature": 0.8, "top_p": 0}, {"temperature": 1e-40}, {"temperature": 5e-324}):
        status, _, body = post(server, path, {"messages": hello, "max_tokens": 4, **neutral, **sampling})
        assert status == 200, (sampling, body)
        texts.add(body["choices"][0]["message"]["content"])
    assert len(texts) == 1
    for payload in ({"prompt": ""}, {"prompt": 5}, {"prompt": ["a", "b"]}, {"prompt": [1, "x"]}):
        assert_error(post(server, "/v1/completions", payload), 400, "invalid_value", "prompt")
    assert_error(post(server, "/v1/completions", {"prompt": [10**6]}), 400, "invalid_value", "prompt")
    # Whole numbers written as floats (JavaScript clients) are integers.
    status, _, body = post(server, path, {"messages": hello, "max_tokens": 2.0, "temperature": 0})
    assert status == 200 and body["usage"]["completion_tokens"] <= 2


def test_context_limits(server, tiny_loaded):
    n_prompt = len(tiny_loaded(MODEL).tokenizer.encode(CODE))
    error = assert_error(post(server, "/v1/completions", {"prompt": CODE, "max_tokens": 512}),
                         400, "context_length_exceeded", "max_tokens")
    assert str(512 - n_prompt) in error["message"]
    status, _, body = post(server, "/v1/completions", {"prompt": CODE, "max_tokens": 512 - n_prompt, "temperature": 0})
    assert status == 200, body
    long_prompt = "word " * 600
    assert_error(post(server, "/v1/completions", {"prompt": long_prompt}), 400, "context_length_exceeded", "prompt")


def test_body_too_large_is_refused_while_reading(server):
    huge = b'{"prompt": "' + b"a" * (2 << 20) + b'"}'
    assert_error(post(server, "/v1/completions", huge), 413, "request_too_large")
    # No Content-Length at all (chunked): the limit holds as the body arrives.
    parts = urlsplit(server.url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    chunks = iter([b'{"prompt": "'] + [b"a" * 65536] * 40 + [b'"}'])
    conn.request("POST", "/v1/completions", body=chunks, encode_chunked=True,
                 headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    assert response.status == 413 and json.loads(response.read())["error"]["code"] == "request_too_large"
    conn.close()
    # A client that asks first (Expect: 100-continue) is answered before it sends anything.
    sock = socket.create_connection((parts.hostname, parts.port), timeout=30)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 2000000\r\n"
                 b"Content-Type: application/json\r\nExpect: 100-continue\r\n\r\n")
    assert sock.recv(4096).startswith(b"HTTP/1.1 413 ")
    sock.close()
    assert raw(server, "GET", "/health")[0] == 200


def test_any_model_name_is_the_served_model(server):
    """One model is served: a request naming another (a client set up for "gpt-4o") or the file
    gets it, as from llama-server and LM Studio; the reply names the model that answered."""
    hello = [{"role": "user", "content": "hi"}]
    served = raw(server, "GET", "/v1/models")[2]["data"][0]
    for name in ("gpt-4o", served["meta"]["file"], served["id"]):
        status, _, body = post(server, "/v1/chat/completions", {"model": name, "messages": hello, "max_tokens": 2})
        assert status == 200 and body["model"] == served["id"], (name, body)
    assert raw(server, "GET", f"/v1/models/{served['meta']['file']}")[0] == 200


def test_unknown_model_path_and_method(server):
    assert_error(raw(server, "GET", "/v1/models/gpt-4o"), 404, "model_not_found", "model")
    assert_error(raw(server, "GET", "/v1/nothing-here"), 404, "not_found")
    assert_error(raw(server, "GET", "/v1/chat/completions"), 405, "method_not_allowed")
    # RFC 9110: a 405 says which methods the resource allows.
    assert raw(server, "GET", "/v1/completions")[1]["allow"] == "POST"
    allow = raw(server, "POST", "/v1/models", b"{}", {"Content-Type": "application/json"})[1]["allow"]
    assert set(allow.split(", ")) == {"GET", "HEAD"}


def test_foreign_host_header_is_refused(server):
    """Without a key the server trusts only loopback Host names (no DNS rebinding from a web page)."""
    assert_error(raw(server, "GET", "/v1/models", headers={"Host": "attacker.example:8080"}), 403, "forbidden_host")
    for host in ("localhost:1", "127.0.0.1", "[::1]:80", "app.localhost"):
        assert raw(server, "GET", "/v1/models", headers={"Host": host})[0] == 200, host
    assert raw(server, "GET", "/health", headers={"Host": "attacker.example"})[0] == 200


# ---------------------------------------------------------------------------------------------
# A client that leaves cancels its generation at the next step


def test_disconnect_mid_stream_cancels_generation(server, client):
    prompt = "hello world"
    budget = 400
    full = client.completions.create(model=MODEL, prompt=prompt, max_tokens=budget, temperature=0)
    assert full.usage.completion_tokens == budget  # uncancelled, it runs to the end of the budget
    before = metrics(server)

    sock = send_raw(server, {"prompt": prompt, "max_tokens": budget, "temperature": 0, "stream": True})
    received = b""
    while b"data: " not in received:
        received += sock.recv(4096)
    sock.close()  # mid-stream

    after = wait_for(server, lambda m: m["specula:requests_cancelled_total"] > before["specula:requests_cancelled_total"])
    generated = after["llamacpp:tokens_predicted_total"] - before["llamacpp:tokens_predicted_total"]
    assert 1 <= generated < budget, generated  # stopped early (typically after a few tokens)
    assert after["llamacpp:requests_processing"] == 0

    # Not streamed: a client that gives up waiting cancels too.
    sock = send_raw(server, {"prompt": prompt, "max_tokens": budget, "temperature": 0})
    wait_for(server, lambda m: m["llamacpp:requests_processing"] == 1)
    sock.close()
    wait_for(server, lambda m: m["specula:requests_cancelled_total"] == after["specula:requests_cancelled_total"] + 1)
    # The server carries on; no model named is fine too.
    status, _, body = post(server, "/v1/completions", {"prompt": prompt, "max_tokens": 8, "temperature": 0})
    assert status == 200 and body["usage"]["completion_tokens"] == 8


def send_raw(server, payload: dict) -> socket.socket:
    """A completion request on a bare socket, left open for the caller to read or abandon."""
    parts = urlsplit(server.url)
    sock = socket.create_connection((parts.hostname, parts.port), timeout=30)
    body = json.dumps(payload).encode()
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    return sock


def wait_for(server, condition, timeout_s: float = 20.0) -> dict[str, float]:
    deadline = time.monotonic() + timeout_s
    while True:
        values = metrics(server)
        if condition(values):
            return values
        assert time.monotonic() < deadline, values
        time.sleep(0.02)


# ---------------------------------------------------------------------------------------------
# Prompt formats (no HTTP needed: the same ServedModel the server uses)


def test_chat_without_template_uses_fallback_frame_and_stop(tiny_loaded):
    served = ServedModel.create(LocalSession.around(tiny_loaded("llama-notemplate")), DEFAULTS)
    request = GenerationRequest(model=None, max_tokens=None, stream=False, include_usage=False, stop=("END",),
                                messages=({"role": "user", "content": "hello"},))
    ids, stops = served.prompt_ids(request)
    assert served.session.tokenizer.decode(list(ids.ids)) == "User: hello\nAssistant:"
    settings = served.decode_settings(request, len(ids), stops)
    assert settings.stop_strings == ("END", "\nUser:")
    assert settings.max_new_tokens == served.n_ctx - len(ids)  # no max_tokens: up to the context
    assert settings.sampling.temperature == 0.8  # the server's default


def test_models_list_names_the_model_as_the_library_does(tiny_paths, tmp_path):
    """One name for a model everywhere (issue 52 item 8): /v1/models keeps the id clients send
    (the file's stem, or --alias, or the built-in key) and adds the library's name under "name",
    the field chat front ends show, with llama-server's "aliases"; each of them finds the model."""
    import shutil

    from app.engine.loader import load_model

    snapshot = tmp_path / "models--someone--Tiny-Llama-GGUF" / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    cached = shutil.copy(tiny_paths["llama-q8"], snapshot / "tiny-llama.Q8_0.gguf")
    served = ServedModel.create(LocalSession.around(load_model(cached, device="cpu", dtype="float32")), DEFAULTS)
    with BackgroundServer(create_app(served, ServerConfig()), bind_socket("127.0.0.1", 0)) as running:
        client = openai.OpenAI(base_url=running.url + "/v1", api_key="not-needed", max_retries=0, timeout=60)
        [model] = client.models.list().data
        assert model.id == "tiny-llama.Q8_0"  # as before: what a client set up earlier sends
        assert model.model_extra["name"] == "someone/Tiny-Llama-GGUF (Q8_0)"
        assert "someone/Tiny-Llama-GGUF (Q8_0)" in model.model_extra["aliases"]
        for name in (model.id, model.model_extra["name"], "tiny-llama.Q8_0.gguf"):
            assert client.models.retrieve(name).id == model.id
        reply = client.chat.completions.create(model=model.id, messages=[{"role": "user", "content": "hi"}],
                                               max_tokens=2)
        assert reply.model == model.id


def test_the_servers_rate_is_run_jsons_decode_tps_for_the_same_reply():
    """timings.predicted_per_second of a reply is the decode_tps `specula run --json` prints for
    that reply's summary (RunSummary.to_dict), at an end-of-generation stop and at the limit."""
    from app.engine.events import RunSummary, StopReason
    from app.server.openai_format import timings as server_timings

    for stop in (StopReason.EOS, StopReason.MAX_TOKENS):
        summary = RunSummary(text="abc", tokens=(1, 2, 3, 4), stop_reason=stop, drafter="lookup", n_prompt=10,
                             n_prompt_evaluated=10, prompt_s=0.05, n_predicted=4, decode_s=0.2, ttft_s=0.06,
                             n_steps=2, n_drafted=6, n_accepted=3, accepted_by_position=(2, 1),
                             drafted_by_position=(2, 2))
        assert server_timings(summary)["predicted_per_second"] == pytest.approx(summary.to_dict()["decode_tps"])
