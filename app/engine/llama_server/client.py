"""A small client for llama-server's native API (/health, /completion) on token ids, with every
field of its answers checked: a server that answers garbage is one line, never a traceback.

Its HTTP is app.engine.remote.http's, the one client for servers: sizes capped, no redirect
followed, keys and passwords never in a message."""

from __future__ import annotations

import math
from contextlib import closing, contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

from app.engine.errors import ServerError, SpeculaError, quoted  # noqa: F401 - ServerError is read from here too
from app.engine.remote.http import HttpStatusError, RemoteHttp, error_message


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
    """llama-server's native API at `base_url`, over the one HTTP client for servers the user
    names (app.engine.remote.http): no redirect is followed, and no message holds the key or
    the URL's password."""

    def __init__(self, base_url: str, api_key: str | None = None, timeout_s: float = 600.0) -> None:
        self.base_url = base_url.rstrip("/")  # as given: may hold a password, never shown
        self.http = RemoteHttp(self.base_url, api_key, timeout_s)
        self.shown_url = self.http.shown_url
        self.timeout_s = timeout_s

    def healthy(self, timeout_s: float = 5.0) -> bool:
        """True once the model is loaded (llama-server answers 503 while loading)."""
        try:
            self.http.get_bytes("/health", timeout_s)
        except HttpStatusError as exc:
            if exc.status == 503:
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
        answer = self.http.post_json("/completion", body)
        with self._redacted():
            return parse_completion(answer)

    def tokenize(self, text: str) -> list[int]:
        """The model's tokens for `text`, special tokens parsed and BOS added as the model asks."""
        answer = self.http.post_json("/tokenize", {"content": text, "add_special": True})
        tokens = answer.get("tokens") if isinstance(answer, dict) else None
        if not _token_ids(tokens):
            raise ServerError(f"{self.http.where('/tokenize')}: the answer has no list of token ids")
        return tokens

    def props(self) -> Any:
        """llama-server's /props (its build, context and default settings), as it answers them."""
        return self.http.get_json("/props")

    def apply_template(self, messages: list[dict[str, str]]) -> str:
        """The prompt the model's chat template makes of `messages` (llama-server's /apply-template)."""
        answer = self.http.post_json("/apply-template", {"messages": messages})
        prompt = answer.get("prompt") if isinstance(answer, dict) else None
        if not isinstance(prompt, str):
            raise ServerError(f"{self.http.where('/apply-template')}: the answer has no prompt text")
        return prompt

    def stream(self, prompt_ids: Sequence[int], n_predict: int, sampling: dict[str, Any],
               cancelled: Callable[[], bool] | None = None) -> Iterator[StreamChunk]:
        """A reply streamed chunk by chunk (server-sent events), each with the server's drafted
        and accepted counts so far. `sampling`: llama-server's fields (temperature, top_k, ...).
        Stops reading (and closes the connection, which stops the server's generation) once
        `cancelled()` says so."""
        body = {"prompt": [int(t) for t in prompt_ids], "n_predict": int(n_predict), "cache_prompt": True,
                "return_tokens": True, "stream": True, "timings_per_token": True, **sampling}
        with closing(self.http.stream_events("/completion", body, cancelled)) as events:
            for data in events:
                with self._redacted():
                    chunk = parse_chunk(data)
                yield chunk
                if chunk.stop:
                    return

    @contextmanager
    def _redacted(self) -> Iterator[None]:
        """A parse error quotes the server's own fields: without our key or anything key-shaped."""
        try:
            yield
        except ServerError as exc:
            raise ServerError(self.http.redact(str(exc))) from None


def parse_completion(answer: Any) -> ServerReply:
    """A ServerReply from /completion's JSON, every field checked for type and range."""
    tokens, text, timings = _reply_fields(answer, "answer", None)
    stop_type = answer.get("stop_type", "")
    return ServerReply(tuple(tokens), text,
                       _count(timings, "prompt_n"), _duration(timings, "prompt_ms"),
                       _count(timings, "predicted_n"), _duration(timings, "predicted_ms"),
                       _count(timings, "draft_n"), _count(timings, "draft_n_accepted"),
                       stop_type if isinstance(stop_type, str) else "")


def parse_chunk(data: Any) -> StreamChunk:
    """A StreamChunk from one streamed JSON object, every field checked."""
    if isinstance(data, dict) and "error" in data:
        raise ServerError(f"llama-server: {quoted(error_message(data['error']))}")
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
        raise ServerError(f"llama-server's {where}{key} is not a count: {quoted(_text_of(value))}")
    return value


def _duration(timings: dict, key: str) -> float:
    value = timings.get(key, 0.0)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ServerError(f"llama-server's timings.{key} is not a duration: {quoted(_text_of(value))}")
    return float(value)


def _text_of(value: Any) -> str:
    """A field's value for a message: its repr where that is cheap, else its type (the repr of
    JSON nested a thousand deep recurses past Python's limit)."""
    if isinstance(value, (str, int, float, bool)) or value is None:
        return str(value)[:200]
    return f"a JSON {type(value).__name__}"
