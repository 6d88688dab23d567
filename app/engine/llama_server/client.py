"""A small HTTP client for llama-server's native API (/health, /completion) on token ids, with
every field of its answers checked: a server that answers garbage is one line, never a traceback.

Standard library only: the requests are few and on loopback (or a URL the user gave), so a
connection per request costs nothing that matters next to a model's reply."""

from __future__ import annotations

import http.client
import json
import math
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

from app.engine.streams import cut_when_cancelled
from app.engine.errors import ServerError, SpeculaError  # noqa: F401 - ServerError is read from here too

_MAX_ANSWER_BYTES = 64 * 1024 * 1024
_MAX_EVENT_BYTES = 4 * 1024 * 1024  # one streamed chunk: a token or a few, and the timings


@dataclass(frozen=True)
class ServerReply:
    """One /completion answer: the generated token ids and text, and the server's own timings
    (its decode rate, and the drafted and accepted counts of its speculation)."""

    tokens: tuple[int, ...]
    text: str
    prompt_n: int
    prompt_ms: float
    predicted_n: int
    predicted_ms: float
    draft_n: int
    draft_n_accepted: int
    stop_type: str = ""  # "eos", "limit" (n_predict), "word" (a stop string); "" where not said

    @property
    def decode_tps(self) -> float | None:
        """llama-server's own predicted_per_second (server_slot_stats::n_gen_tps): its decode steps
        (every generated token but the first, which the prompt's logits gave, the EOS step counted)
        over the time from the first token to the last, as our decode_rate counts ours."""
        steps = self.predicted_n - 1
        return steps / self.predicted_ms * 1000.0 if steps > 0 and self.predicted_ms > 0 else None

    @property
    def accept_rate(self) -> float | None:
        return self.draft_n_accepted / self.draft_n if self.draft_n else None


@dataclass(frozen=True)
class StreamChunk:
    """One streamed /completion chunk: its tokens and text, whether it is the last, and the
    server's cumulative drafted/accepted counts so far (timings_per_token)."""

    tokens: tuple[int, ...]
    text: str
    stop: bool
    draft_n: int
    draft_n_accepted: int
    final: ServerReply | None = None  # the last chunk's whole timings
    # Tokens generated so far: llama-server holds back a token whose text ends inside a UTF-8
    # character and streams it with the next, whose chunk names only its own token id.
    n_decoded: int = 0


class ServerClient:
    def __init__(self, base_url: str, api_key: str | None = None, timeout_s: float = 600.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.timeout_s = timeout_s

    def healthy(self, timeout_s: float = 5.0) -> bool:
        """True once the model is loaded (llama-server answers 503 while loading)."""
        try:
            self._request("GET", "/health", None, timeout_s)
        except ServerError as exc:
            if "HTTP 503" in str(exc):
                return False
            raise
        return True

    def complete(self, prompt_ids: Sequence[int], n_predict: int, greedy: bool = True, seed: int = 0,
                 extra: dict[str, Any] | None = None) -> ServerReply:
        """One reply to `prompt_ids` (exactly these ids: no template, no BOS added), at most
        n_predict tokens, stopping at the model's end of generation. Greedy: top-k 1, the only
        sampler, as llama-server documents for deterministic output."""
        body: dict[str, Any] = {"prompt": [int(t) for t in prompt_ids], "n_predict": int(n_predict),
                                "cache_prompt": False, "return_tokens": True, "seed": seed, "stream": False}
        if greedy:
            body.update(temperature=0.0, top_k=1, samplers=["top_k"])
        body.update(extra or {})
        return parse_completion(self._request("POST", "/completion", body, self.timeout_s))

    def tokenize(self, text: str) -> list[int]:
        """The model's tokens for `text`, special tokens parsed and BOS added as the model asks."""
        answer = self._request("POST", "/tokenize", {"content": text, "add_special": True}, self.timeout_s)
        tokens = answer.get("tokens") if isinstance(answer, dict) else None
        if not _token_ids(tokens):
            raise ServerError(f"{self.base_url}/tokenize: the answer has no list of token ids")
        return tokens

    def props(self) -> Any:
        """llama-server's /props (its build, context and default settings), as it answers them."""
        return self._request("GET", "/props", None, self.timeout_s)

    def apply_template(self, messages: list[dict[str, str]]) -> str:
        """The prompt the model's chat template makes of `messages` (llama-server's /apply-template)."""
        answer = self._request("POST", "/apply-template", {"messages": messages}, self.timeout_s)
        prompt = answer.get("prompt") if isinstance(answer, dict) else None
        if not isinstance(prompt, str):
            raise ServerError(f"{self.base_url}/apply-template: the answer has no prompt text")
        return prompt

    def stream(self, prompt_ids: Sequence[int], n_predict: int, sampling: dict[str, Any],
               cancelled: Callable[[], bool] | None = None) -> Iterator[StreamChunk]:
        """A reply streamed chunk by chunk (server-sent events), each with the server's drafted
        and accepted counts so far. `sampling`: llama-server's fields (temperature, top_k, ...).
        Stops reading (and closes the connection, which stops the server's generation) once
        `cancelled()` says so."""
        body = {"prompt": [int(t) for t in prompt_ids], "n_predict": int(n_predict), "cache_prompt": True,
                "return_tokens": True, "stream": True, "timings_per_token": True, **sampling}
        url = urllib.parse.urlsplit(self.base_url)
        connection_type = http.client.HTTPSConnection if url.scheme == "https" else http.client.HTTPConnection
        connection = connection_type(url.hostname, url.port, timeout=self.timeout_s)
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        where = f"{self.base_url}/completion"
        with cut_when_cancelled(connection, cancelled) as watch:
            try:
                connection.request("POST", url.path.rstrip("/") + "/completion", json.dumps(body), headers)
                watch.sock = connection.sock
                answer = connection.getresponse()
                if answer.status != 200:
                    raise ServerError(f"{where}: HTTP {answer.status} {_short(answer.read(2048))}")
                for data in _events(answer, where):
                    chunk = parse_chunk(data)
                    yield chunk
                    if chunk.stop or (cancelled is not None and cancelled()):
                        return
                if watch.fired:
                    return
                raise ServerError(f"{where}: the stream ended before the reply did")
            except (OSError, http.client.HTTPException) as exc:
                if watch.fired:  # the user's Stop cut a read that waited on the server
                    return
                raise ServerError(f"{where}: the connection failed ({exc})") from None
            finally:
                connection.close()

    def _request(self, method: str, path: str, body: dict | None, timeout_s: float) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base_url + path, data=data, method=method)
        request.add_header("Content-Type", "application/json")
        if self.api_key:
            request.add_header("Authorization", f"Bearer {self.api_key}")
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as answer:
                raw = answer.read(_MAX_ANSWER_BYTES + 1)
        except urllib.error.HTTPError as exc:
            raise ServerError(f"{self.base_url}{path}: HTTP {exc.code} {_short(exc.read(2048))}") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise ServerError(f"{self.base_url}{path}: could not connect ({reason})") from None
        if len(raw) > _MAX_ANSWER_BYTES:
            raise ServerError(f"{self.base_url}{path}: the answer is larger than {_MAX_ANSWER_BYTES >> 20} MiB")
        try:
            return json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            raise ServerError(f"{self.base_url}{path}: the answer is not JSON: {_short(raw)}") from None


def parse_completion(answer: Any) -> ServerReply:
    """A ServerReply from /completion's JSON, every field checked for type and range."""
    tokens, text, timings = _reply_fields(answer, "answer", None)
    stop_type = answer.get("stop_type", "")
    return ServerReply(tuple(tokens), text,
                       _count(timings, "prompt_n"), _duration(timings, "prompt_ms"),
                       _count(timings, "predicted_n"), _duration(timings, "predicted_ms"),
                       _count(timings, "draft_n"), _count(timings, "draft_n_accepted"),
                       stop_type if isinstance(stop_type, str) else "")


def _events(answer, where: str) -> Iterator[Any]:
    """The JSON objects of a server-sent event stream ("data: {...}" lines)."""
    while True:
        line = answer.readline(_MAX_EVENT_BYTES + 1)
        if not line:
            return
        if len(line) > _MAX_EVENT_BYTES:
            raise ServerError(f"{where}: a streamed chunk is larger than {_MAX_EVENT_BYTES >> 20} MiB")
        line = line.strip()
        if not line.startswith(b"data:"):
            if line.startswith(b"error:"):
                raise ServerError(f"{where}: {_short(line)}")
            continue
        payload = line[5:].strip()
        if payload == b"[DONE]":
            return
        try:
            yield json.loads(payload.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            raise ServerError(f"{where}: a streamed chunk is not JSON: {_short(payload)}") from None


def parse_chunk(data: Any) -> StreamChunk:
    """A StreamChunk from one streamed JSON object, every field checked."""
    if isinstance(data, dict) and "error" in data:
        raise ServerError(f"llama-server: {_short(json.dumps(data['error']).encode())}")
    tokens, text, timings = _reply_fields(data, "streamed chunk", [])
    stop = data.get("stop", False)
    if not isinstance(stop, bool):
        raise ServerError("llama-server's streamed chunk has a stop that is not true or false")
    final = parse_completion({**data, "tokens": tokens}) if stop else None
    return StreamChunk(tuple(tokens), text, stop, _count(timings, "draft_n"), _count(timings, "draft_n_accepted"),
                       final, _count(data, "tokens_predicted", "chunk's "))


def _reply_fields(answer: Any, what: str, no_tokens: list | None) -> tuple[list[int], str, dict]:
    """(token ids, text, timings) of an answer or a streamed chunk, each checked for its type;
    `no_tokens`: what a missing token list means (None: an error)."""
    if not isinstance(answer, dict):
        raise ServerError(f"llama-server's {what} is not a JSON object")
    tokens = answer.get("tokens", no_tokens)
    if not _token_ids(tokens):
        raise ServerError(f"llama-server's {what} has no list of token ids (is it llama-server, with return_tokens?)")
    text = answer.get("content", "")
    if not isinstance(text, str):
        raise ServerError(f"llama-server's {what} has a content that is not text")
    timings = answer.get("timings", {})
    if not isinstance(timings, dict):
        raise ServerError(f"llama-server's {what} has timings that are not an object")
    return tokens, text, timings


def _token_ids(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value)


def _count(fields: dict, key: str, where: str = "timings.") -> int:
    value = fields.get(key, 0)
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 1 << 40:
        raise ServerError(f"llama-server's {where}{key} is not a count: {_short(str(value).encode())}")
    return value


def _duration(timings: dict, key: str) -> float:
    value = timings.get(key, 0.0)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ServerError(f"llama-server's timings.{key} is not a duration: {_short(str(value).encode())}")
    return float(value)


def _short(raw: bytes, limit: int = 160) -> str:
    """Up to `limit` characters of a remote answer, control characters escaped."""
    text = raw.decode("utf-8", "replace")
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return text[:limit] + ("..." if len(text) > limit else "")
