"""Random and mutated remote answers never raise anything but a one-line ServerError (issue 58,
item 8): a seeded generator mutates good server-sent event lines, llama-server and OpenAI chunks,
/completion answers and /metrics texts (bytes flipped, cut, repeated; escapes, NUL, bad UTF-8,
NaN, huge numbers, deep nesting, a key spliced in) and feeds them to the remote parsers: the
event-stream lines (EventLines, what RemoteHttp.stream_events reads with), loads_remote, both
clients' parse_chunk, parse_completion and the /metrics parser. Each message is one line with no
control character and no key, as its caller shows it. Seeded and bounded: a few seconds."""

from __future__ import annotations

import json
import random
import time
from typing import Any, Callable

from app.engine.errors import ServerError
from app.engine.llama_server.client import ServerClient, parse_completion
from app.engine.llama_server.client import parse_chunk as llama_chunk
from app.engine.remote.http import EventLines, RemoteHttp, loads_remote
from app.engine.remote.metrics import parse_spec_counters
from app.engine.remote.openai_client import parse_chunk as openai_chunk

SEED = 58
CASES = 2000  # a target's cases at most
TARGET_S = 1.5  # and its time at most
KEY = "sk-fuzzkey-0123456789"
HTTP = RemoteHttp("http://127.0.0.1:9", api_key=KEY)
LLAMA = ServerClient("http://127.0.0.1:9", api_key=KEY)

LLAMA_CHUNK = {"content": "hi", "tokens": [5], "stop": False, "tokens_predicted": 1,
               "timings": {"prompt_n": 3, "prompt_ms": 1.5, "predicted_n": 1, "predicted_ms": 2.0, "draft_n": 2,
                           "draft_n_accepted": 1}}
LLAMA_LAST = {**LLAMA_CHUNK, "stop": True, "stop_type": "limit", "content": ""}
OPENAI_CHUNK = {"id": "c1", "object": "chat.completion.chunk",
                "choices": [{"index": 0, "delta": {"content": "Hello"}, "text": "Hello", "finish_reason": None}]}
OPENAI_USAGE = {"id": "c1", "choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 4}}
OPENAI_ERROR = {"error": {"message": f"bad key {KEY}", "code": 401}}
METRICS = ('# TYPE vllm:spec_decode_num_drafts_total counter\n'
           'vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 12.0\n'
           'vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 36.0\n'
           'vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 20.0\n'
           'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 10.0\n'
           'llamacpp:spec_decode_num_draft_tokens_total 26\n'
           'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="1"} 2\n')
SNIPPETS = [b"\x1b]52;c;aGk=\x07", b"\x1b[2J", b"\x00", b"\xff\xfe", b"\xc3", b"\x9b", b"\r", b"\n", b"\n\n", b"NaN",
            b"-Infinity", b"1e999", b"-1", b"99999999999999999999999999", b"[" * 2000, b"{" * 50, b'"', b"\\",
            b"\\u0000", b"\\ud800", b"data:", b"error:", b"data: [DONE]", b":", b"null", b"true", b"[]", b"{}",
            b",", b"}", b"=", b'="', b"#", b" ", KEY.encode(), b"Bearer " + KEY.encode(), "é🔑".encode()]
TEXTS = ["", "hi", "\x1b[31m", "\x00", "\ud800", KEY, "NaN", "stop", "length", "eos", "x" * 300, "é🔑"]
NUMBERS = [0, -1, 1, 2**40, 2**63, 10**30, 1.5, -0.0, 1e308, float("nan"), float("inf"), True, False]



def _nested(depth: int) -> list:
    nested: list = []
    for _ in range(depth):
        nested = [nested]
    return nested


DEEP = [_nested(10), _nested(1500), _nested(100_000)]  # made once: a deep one costs milliseconds


def mutate(rng: random.Random, raw: bytes) -> bytes:
    """`raw` with a few random edits: a byte flipped, a snippet spliced in, a cut, a repeat."""
    data = bytearray(raw)
    for _ in range(rng.randrange(1, 4)):
        at = rng.randrange(len(data) + 1)
        kind = rng.randrange(5)
        if kind == 0 and data:
            data[min(at, len(data) - 1)] = rng.randrange(256)
        elif kind == 1:
            data[at:at] = rng.choice(SNIPPETS)
        elif kind == 2:
            del data[at:at + rng.randrange(1, 12)]
        elif kind == 3:
            data = data[:at]
        else:
            data[at:at] = data[max(0, at - 16):at] * rng.randrange(1, 4)
    return bytes(data)


def value(rng: random.Random, depth: int = 0) -> Any:
    """A random JSON-shaped value: every type, odd edges, now and then nested past any limit."""
    kind = rng.randrange(8 if depth < 3 else 4)
    if kind == 0:
        return None
    if kind == 1:
        return rng.choice(NUMBERS)
    if kind == 2:
        return rng.choice(TEXTS)
    if kind == 3:
        return [rng.randrange(-2, 50) for _ in range(rng.randrange(4))]
    if kind == 4:
        return [value(rng, depth + 1) for _ in range(rng.randrange(3))]
    if kind == 5:
        keys = list(LLAMA_CHUNK) + list(OPENAI_CHUNK["choices"][0]) + ["usage", "error", "message", "choices"]
        return {rng.choice(keys): value(rng, depth + 1) for _ in range(rng.randrange(4))}
    if kind == 6:
        return rng.choice(DEEP)
    return json.loads(json.dumps(rng.choice([LLAMA_CHUNK, LLAMA_LAST, OPENAI_CHUNK, OPENAI_USAGE, OPENAI_ERROR])))


def object_like(rng: random.Random) -> Any:
    """A good object with fields replaced by random values, or the JSON of mutated bytes."""
    good = rng.choice([LLAMA_CHUNK, LLAMA_LAST, OPENAI_CHUNK, OPENAI_USAGE, OPENAI_ERROR])
    if rng.random() < 0.4:
        try:
            return loads_remote(mutate(rng, json.dumps(good).encode()), "x")
        except ServerError:
            return value(rng)
    data = json.loads(json.dumps(good))
    for _ in range(rng.randrange(1, 3)):
        choices = data.get("choices") if isinstance(data, dict) else None
        target = choices[0] if isinstance(choices, list) and choices and rng.random() < 0.5 else data
        if isinstance(target, dict) and target:
            target[rng.choice(list(target))] = value(rng)
    return data


def check(shown: Callable[[str], str], call: Callable[[], Any]) -> None:
    """`call` returns, or raises a ServerError whose message, as its caller shows it, is one
    printable line without the key; anything else fails the test."""
    try:
        call()
    except ServerError as exc:
        message = shown(str(exc))
        assert message and message.isprintable() and KEY not in message, repr(message)


def fuzz(make: Callable[[random.Random], Callable[[], Any]], shown: Callable[[str], str] = HTTP.redact) -> int:
    rng = random.Random(SEED)
    deadline = time.monotonic() + TARGET_S
    n = 0
    while n < CASES and time.monotonic() < deadline:
        check(shown, make(rng))
        n += 1
    return n


def _event_stream(rng: random.Random) -> Callable[[], Any]:
    good = [b"data: " + json.dumps(rng.choice([LLAMA_CHUNK, OPENAI_CHUNK, OPENAI_USAGE])).encode() + b"\n", b"\n",
            b": keep-alive\n", b"event: ping\n", b"data: [DONE]\n"]
    lines = [mutate(rng, line) if rng.random() < 0.6 else line for line in rng.choices(good, k=rng.randrange(1, 12))]

    def run() -> None:
        events = EventLines("http://127.0.0.1:9/v1/chat/completions", HTTP.short)
        for line in lines:
            events.take(line)
    return run


def test_event_stream_lines():
    assert fuzz(_event_stream) >= 200


def test_llama_server_chunks_and_answers():
    def make(rng: random.Random) -> Callable[[], Any]:
        data = object_like(rng)

        def run() -> None:
            with LLAMA._redacted():  # as ServerClient.stream and .complete call them
                (llama_chunk if rng.random() < 0.5 else parse_completion)(data)
        return run
    assert fuzz(make) >= 200


def test_openai_chunks():
    def make(rng: random.Random) -> Callable[[], Any]:
        data, chat = object_like(rng), rng.random() < 0.5
        return lambda: openai_chunk(data, chat, HTTP.short)
    assert fuzz(make) >= 200


def test_json_answers():
    def make(rng: random.Random) -> Callable[[], Any]:
        try:
            raw = mutate(rng, json.dumps(object_like(rng)).encode())
        except (RecursionError, ValueError):  # a value nested too deeply to write: its bytes as a server sends them
            raw = rng.choice([b"[" * 100_000, b'{"a":' * 50_000, b"\xff", b""])
        return lambda: loads_remote(raw, "http://127.0.0.1:9/props", quote=HTTP.short)
    assert fuzz(make) >= 200


def test_metrics_texts():
    def make(rng: random.Random) -> Callable[[], Any]:
        raw = METRICS.encode()
        for _ in range(rng.randrange(1, 4)):
            raw = mutate(rng, raw)
        return lambda: parse_spec_counters(raw.decode("utf-8", "replace"))
    assert fuzz(make) >= 200  # spec_counters logs its message through redact, as here
