"""OpenAI's API as vLLM, SGLang, Ollama, LM Studio, llama-server and Specula's own server speak
it: /v1/models, and /v1/chat/completions or /v1/completions streamed as server-sent events, each
chunk checked (types, sizes, UTF-8) before anything of it is used."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from app.engine.errors import ServerError, quoted
from app.engine.remote.http import HttpStatusError, RemoteHttp, error_message
from app.engine.remote.metrics import SpecCounters, parse_spec_counters

log = logging.getLogger(__name__)

_MAX_COUNT = 1 << 40
_MAX_MODELS = 10_000
_MAX_ID_CHARS = 1024


@dataclass(frozen=True)
class ChatChunk:
    """One streamed chunk: its text delta, the finish reason once given, and usage where sent."""

    text: str
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


class OpenAIClient:
    """One server at `base_url` (without /v1: it is added here)."""

    def __init__(self, base_url: str, api_key: str | None = None, timeout_s: float = 600.0) -> None:
        self.http = RemoteHttp(base_url, api_key, timeout_s)

    @property
    def shown_url(self) -> str:
        return self.http.shown_url

    def model_ids(self) -> list[str]:
        """The ids /v1/models lists."""
        answer = self.http.get_json("/v1/models")
        data = answer.get("data") if isinstance(answer, dict) else None
        if not isinstance(data, list) or len(data) > _MAX_MODELS:
            raise ServerError(f"{self.http.where('/v1/models')}: the answer has no list of models (data)")
        ids = [m.get("id") if isinstance(m, dict) else None for m in data]
        if not all(isinstance(i, str) and 0 < len(i) <= _MAX_ID_CHARS for i in ids):
            raise ServerError(f"{self.http.where('/v1/models')}: a model has no id that is text")
        return ids

    def choose_model(self, wanted: str | None) -> str:
        """`wanted` where the server serves it, else the one model it serves; a ServerError
        naming what it serves where neither holds."""
        ids = self.model_ids()
        if wanted and wanted in ids:
            return wanted
        if len(ids) == 1:
            if wanted:
                log.info("%s serves %s, not %s: using it", self.shown_url, self.http.short(ids[0]),
                         quoted(wanted))
            return ids[0]
        # the ids are the server's text: escaped, for they reach a terminal
        served = ", ".join(self.http.short(i, 80) for i in ids[:8]) + (", ..." if len(ids) > 8 else "") \
            if ids else "none"
        raise ServerError(f"{self.shown_url} serves {len(ids)} models ({served}): name one with -m")

    def spec_counters(self) -> SpecCounters | None:
        """The server's speculative counters now; None where it has no /metrics or none there,
        and where its /metrics cannot be read (not the format, NaN, too large or slow to parse):
        counts are extras, so the reply goes on with them unknown."""
        try:
            text = self.http.get_text("/metrics", timeout_s=min(self.http.timeout_s, 30.0))
        except HttpStatusError:
            return None  # no /metrics here (404), or not enabled (llama-server without --metrics: 501)
        except ServerError as exc:
            log.warning("%s: counts unknown: %s", self.http.where("/metrics"), exc)
            return None
        try:
            return parse_spec_counters(text)
        except ServerError as exc:
            log.warning("%s: counts unknown: %s", self.http.where("/metrics"), self.http.redact(str(exc)))
            return None

    def stream(self, model: str, max_tokens: int, sampling: dict[str, Any],
               messages: list[dict[str, str]] | None = None, prompt: str | None = None,
               cancelled: Callable[[], bool] | None = None) -> Iterator[ChatChunk]:
        """The reply's chunks: a chat reply to `messages`, else a text completion of `prompt`.
        The last chunk has a finish reason (usage follows it where the server sends usage)."""
        body: dict[str, Any] = {"model": model, "max_tokens": int(max_tokens), "stream": True,
                                "stream_options": {"include_usage": True}, **sampling}
        path = "/v1/chat/completions" if messages is not None else "/v1/completions"
        body.update({"messages": messages} if messages is not None else {"prompt": prompt or ""})
        chat = messages is not None
        for data in self.http.stream_events(path, body, cancelled):
            try:
                chunk = parse_chunk(data, chat, self.http.short)
            except ServerError as exc:
                raise ServerError(f"{self.http.where(path)}: {exc}") from None
            yield chunk


def parse_chunk(data: Any, chat: bool, short: Callable[[bytes | str], str]) -> ChatChunk:
    """A ChatChunk from one streamed object (chat.completion.chunk or text_completion), checked."""
    if not isinstance(data, dict):
        raise ServerError("a streamed chunk is not a JSON object")
    if "error" in data:
        # not str(): that of a JSON value nested near the recursion limit raises RecursionError
        raise ServerError(f"the server failed mid-reply: {short(error_message(data['error']))}")
    choices = data.get("choices", [])
    if not isinstance(choices, list):
        raise ServerError("a streamed chunk's choices is not a list")
    prompt_tokens, completion_tokens = _usage(data.get("usage"))
    if not choices:  # the usage-only chunk that stream_options.include_usage asks for
        return ChatChunk("", None, prompt_tokens, completion_tokens)
    choice = choices[0]
    if not isinstance(choice, dict):
        raise ServerError("a streamed chunk's choice is not an object")
    text = _text_of(choice, chat)
    finish = choice.get("finish_reason")
    if finish is not None and not (isinstance(finish, str) and len(finish) <= 64):
        raise ServerError("a streamed chunk's finish_reason is not a short text")
    return ChatChunk(text, finish, prompt_tokens, completion_tokens)


def _text_of(choice: dict, chat: bool) -> str:
    if chat:
        delta = choice.get("delta", {})
        if not isinstance(delta, dict):
            raise ServerError("a streamed chunk's delta is not an object")
        text = delta.get("content")
    else:
        text = choice.get("text")
    if text is not None and not isinstance(text, str):
        raise ServerError("a streamed chunk's content is not text")
    return text or ""


def _usage(usage: Any) -> tuple[int | None, int | None]:
    if usage is None:
        return None, None
    if not isinstance(usage, dict):
        raise ServerError("a streamed chunk's usage is not an object")
    counts = []
    for key in ("prompt_tokens", "completion_tokens"):
        value = usage.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < _MAX_COUNT):
            raise ServerError(f"a streamed chunk's usage.{key} is not a count")
        counts.append(value)
    return counts[0], counts[1]
