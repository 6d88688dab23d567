"""The model a server serves when it runs beyond this process: llama-server (started here by
`specula serve --engine llama-server` or by the window, or at a URL) or any server speaking
OpenAI's API, reached through the engine's ServerSession (app.engine.llama_server.session).

`ServedServer` answers what app.py and worker.py ask of a ServedModel (names, the prompt, the
request's settings, the reply's events), so the same routes, admission rules, key check and
OpenAI formatting serve it: the seam is the `Served` protocol below. A llama-server renders the
chat with its own template and tokenizes it (exact ids, its draft counts per chunk); a server that
speaks only OpenAI's API gets the messages or the text as they came (no ids: counts it does not
report are 0, as its summary says).

The session here never starts or stops a llama-server: it talks to one that runs (its URL), so
the window's chat and API requests share the process but never a session object (a session is
one reply at a time, from one thread)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Protocol

from app.engine.events import GenerationEvent
from app.engine.loop.speculative import DecodeSettings
from app.engine.settings import GenSettings
from app.server.errors import ApiError, bad_field, context_exceeded
from app.server.params import GenerationRequest
from app.engine.errors import Cancel

log = logging.getLogger(__name__)

# max_tokens where a request sets none and the server's context is not known (OpenAI's API
# does not say it): llama-server's own default for n_predict is unbounded, which a remote
# server may refuse.
UNKNOWN_CONTEXT_MAX_TOKENS = 2048


class Served(Protocol):
    """What the HTTP app and its worker ask of the model they serve (ServedModel, ServedServer)."""

    model_id: str
    drafter_name: str
    title: str

    @property
    def n_ctx(self) -> int: ...

    def check_model(self, name: str | None) -> None: ...

    def describe(self, created: int) -> dict[str, Any]: ...

    def check_prompt_bytes(self, request: GenerationRequest) -> None: ...

    def prompt_ids(self, request: GenerationRequest) -> tuple[Any, tuple[str, ...]]: ...

    def decode_settings(self, request: GenerationRequest, n_prompt: int,
                        format_stops: tuple[str, ...]) -> DecodeSettings: ...

    def generate(self, prompt: Any, settings: DecodeSettings, cancel: Cancel) -> Iterator[GenerationEvent]: ...


@dataclass(frozen=True)
class ServerPrompt:
    """A request's prompt for the server: token ids (llama-server), or the messages or text
    (a server speaking only OpenAI's API). Its length is the ids' count, 0 where unknown."""

    ids: tuple[int, ...] | None = None
    messages: tuple[dict[str, str], ...] | None = None
    text: str | None = None

    def __len__(self) -> int:
        return len(self.ids) if self.ids is not None else 0


@dataclass
class ServedServer:
    session: Any  # an open ServerSession on a running server
    model_id: str
    drafter_name: str
    defaults: GenSettings  # sampling and drafting from the command line or the window; max_tokens unused
    n_ctx: int = 0  # 0: not known (OpenAI's API does not say)
    default_max_tokens: int | None = None
    title: str = ""
    engine_line: str = ""  # ServerSession.describe(): where replies run (no key, no password)
    names: frozenset[str] = field(default_factory=frozenset)

    @classmethod
    def create(cls, session: Any, defaults: GenSettings, drafter_name: str, model: Path | None = None,
               model_id: str | None = None, default_max_tokens: int | None = None,
               engine_line: str | None = None) -> "ServedServer":
        """Around an open session; the model's id from `model_id`, the file, or what the server serves."""
        openai = session.speaks_openai
        served_name = session.openai_model if openai else None
        model_id = model_id or (model.stem if model else None) or served_name or "llama-server"
        names = {model_id, *((model.stem, model.name) if model else ()), *((served_name,) if served_name else ())}
        n_ctx = 0 if openai else server_context(session)
        return cls(session=session, model_id=model_id, drafter_name=drafter_name, defaults=defaults, n_ctx=n_ctx,
                   default_max_tokens=default_max_tokens, title=model.name if model else model_id,
                   engine_line=engine_line or session.describe(), names=frozenset(names))

    def check_model(self, name: str | None) -> None:
        if name is not None and name not in self.names:
            raise ApiError(404, f"the model {name[:100]!r} does not exist; this server serves {self.model_id!r}",
                           "model_not_found", param="model")

    def describe(self, created: int) -> dict[str, Any]:
        return {
            "id": self.model_id, "object": "model", "created": created, "owned_by": "specula",
            "name": self.title or self.model_id, "aliases": sorted(self.names - {self.model_id}),
            "meta": {"n_ctx": self.n_ctx or None, "drafter": self.drafter_name, "engine": self.engine_line},
        }

    def check_prompt_bytes(self, request: GenerationRequest) -> None:
        """The server counts its own tokens (the body's size limit still holds)."""

    def prompt_ids(self, request: GenerationRequest) -> tuple[ServerPrompt, tuple[str, ...]]:
        """The prompt as the server takes it (blocking: called from a pool thread); a server that
        cannot be reached or answers wrong is a 502 with its one line."""
        from app.engine.llama_server.client import ServerError

        try:
            return self._prompt(request)
        except ServerError as exc:
            raise ApiError(502, str(exc), "upstream_error", error_type="server_error") from None

    def _prompt(self, request: GenerationRequest) -> tuple[ServerPrompt, tuple[str, ...]]:
        if self.session.speaks_openai:
            if request.messages is None and not isinstance(request.prompt, str):
                raise bad_field("prompt", "this server speaks OpenAI's API: it takes text, not token ids")
            messages = tuple(request.messages) if request.messages is not None else None
            return ServerPrompt(messages=messages, text=request.prompt if messages is None else None), ()
        if request.messages is not None:
            ids = self.session.prompt_ids(list(request.messages))  # the server's own template
        elif isinstance(request.prompt, str):
            ids = self.session.prompt_ids(text=request.prompt)
        else:
            ids = list(request.prompt or ())
        if not ids:
            raise bad_field("messages" if request.messages is not None else "prompt", "the prompt is empty")
        return ServerPrompt(ids=tuple(ids)), ()

    def decode_settings(self, request: GenerationRequest, n_prompt: int, format_stops: tuple[str, ...]) -> DecodeSettings:
        """The request's settings over the defaults; 400 where the context is known and too small."""
        room = self.n_ctx - n_prompt if self.n_ctx and n_prompt else None
        if room is not None and room < 1:
            raise context_exceeded(f"the prompt has {n_prompt} tokens but the context holds {self.n_ctx}; "
                                   "shorten it", "messages" if request.messages is not None else "prompt")
        max_tokens = request.max_tokens
        if max_tokens is not None and room is not None and max_tokens > room:
            raise context_exceeded(f"max_tokens {max_tokens} plus the prompt's {n_prompt} tokens exceed the "
                                   f"context of {self.n_ctx} tokens; ask for at most {room}", "max_tokens")
        if max_tokens is None:
            cap = room if room is not None else UNKNOWN_CONTEXT_MAX_TOKENS
            max_tokens = min(cap, self.default_max_tokens or cap)
        return request.decode_settings(self.defaults, max_tokens, format_stops)

    def generate(self, prompt: ServerPrompt, settings: DecodeSettings, cancel: Cancel) -> Iterator[GenerationEvent]:
        """The reply's events, as the server streams them (its timings and draft counts)."""
        if prompt.ids is not None:
            yield from self.session.reply(prompt.ids, settings.max_new_tokens, settings.sampling,
                                          settings.stop_strings, cancel)
            return
        messages = list(prompt.messages) if prompt.messages is not None else None
        yield from self.session.reply_to(settings.max_new_tokens, settings.sampling, messages=messages,
                                         text=prompt.text, stop_strings=settings.stop_strings, cancelled=cancel)


def server_context(session: Any) -> int:
    """The context llama-server holds (its /props), 0 where it does not say."""
    try:
        props = session.open().props()
    except Exception as exc:  # a server without /props serves all the same: the context is then unknown
        log.info("the server's context is not known: %s", exc)
        return 0
    settings = props.get("default_generation_settings") if isinstance(props, dict) else None
    n_ctx = settings.get("n_ctx") if isinstance(settings, dict) else None
    return n_ctx if isinstance(n_ctx, int) and n_ctx > 0 else 0


def session_beside(session: Any) -> Any:
    """A session of its own on the server `session` talks to (the llama-server it started, or
    the one at its URL, with the same key): it never starts or stops one."""
    from app.engine.llama_server.session import API_LLAMA, ServerEngine, ServerSession

    engine = session.engine
    if not engine.url:
        client = session.open()
        engine = ServerEngine(url=client.base_url, api=API_LLAMA, timeout_s=engine.timeout_s)
    beside = ServerSession(engine)
    beside.speaks_openai  # connects now (reads /props or /v1/models), not on the first request
    return beside
