"""The model a server serves: its names, prompts, per-request settings and replies, over one
reply engine (app.engine.session.Session) it never asks the kind of: Specula's own loop in this
process, llama-server started here, or a server at a URL.

In this process one main-model KV cache lives as long as the server, so a request that shares a
prefix with the previous one (the next turn of a chat, the same system prompt) evaluates only
what is new. A llama-server renders the chat with its own template and tokenizes it (exact ids,
its draft counts per chunk); a server that speaks only OpenAI's API gets the messages or the text
as they came (no ids: counts it does not report are 0, as its summary says).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

from app.engine.errors import Cancel, ChatTemplateError, PromptError, ServerError
from app.engine.events import GenerationEvent
from app.engine.loop.speculative import DecodeSettings
from app.engine.session import AT_URL, HERE, Prompt, Session
from app.engine.settings import UNKNOWN_CONTEXT_MAX_TOKENS, GenSettings
from app.hub.display import display_name
from app.server.errors import ApiError, bad_field, context_exceeded
from app.server.params import GenerationRequest

log = logging.getLogger(__name__)

GREEDY = GenSettings(temperature=0.0)  # a server made without defaults (tests) decodes greedily


@dataclass
class ServedModel:
    session: Session  # one reply at a time: the server's worker thread is its only caller
    model_id: str
    drafter_name: str
    defaults: GenSettings  # sampling and drafting from the command line or the window; max_tokens unused
    default_max_tokens: int | None = None  # when a request sets none; None: up to the context
    names: frozenset[str] = frozenset()  # the names GET /v1/models/{id} knows it by (requests take any)
    title: str = ""  # the model's name as the window and `specula inspect` show it (hub.display_name)
    n_ctx: int = 0  # 0: not known (OpenAI's API does not say)

    @classmethod
    def create(cls, session: Session, defaults: GenSettings = GREEDY, model_id: str | None = None,
               names: Sequence[str] = (), default_max_tokens: int | None = None) -> "ServedModel":
        """Around an open session; the model's id from `model_id`, the file, or what the server serves."""
        facts = session.describe()
        if facts.where != AT_URL:
            path = Path(facts.main_path)
            model_id = model_id or path.stem  # what clients send: kept as it was, names are added
            title = display_name(path, facts.file_type) if facts.where == HERE else path.name
            accepted = {model_id, path.stem, path.name, title, *names}
        else:  # a server at a URL: its own name for its model, where it says one
            served_name = facts.served_name
            model_id = model_id or served_name or "llama-server"
            title = model_id
            accepted = {model_id, *((served_name,) if served_name else ()), *names}
        return cls(session=session, model_id=model_id, drafter_name=facts.drafter_name, defaults=defaults,
                   default_max_tokens=default_max_tokens, names=frozenset(accepted), title=title, n_ctx=facts.n_ctx)

    def check_model(self, name: str | None) -> None:
        """404 unless `name` is one of this model's names (model lookups; completions take any)."""
        if name is not None and name not in self.names:
            raise ApiError(404, f"the model {name[:100]!r} does not exist; this server serves {self.model_id!r}",
                           "model_not_found", param="model")

    def describe(self, created: int) -> dict[str, Any]:
        """OpenAI's model object, plus what llama-server adds (aliases, meta) and the display name
        under "name", the field chat front ends (Open WebUI, LibreChat) show in place of the id."""
        facts = self.session.describe()
        known = {"n_ctx_train": facts.n_ctx_train, "n_vocab": facts.n_vocab, "architecture": facts.architecture,
                 "file": Path(facts.main_path).name if facts.where == HERE else None, "engine": facts.engine_line}
        meta = {"n_ctx": self.n_ctx or None, "drafter": self.drafter_name,
                **{key: value for key, value in known.items() if value}}
        return {
            "id": self.model_id, "object": "model", "created": created, "owned_by": "specula",
            "name": self.title or self.model_id, "aliases": sorted(self.names - {self.model_id}),
            "meta": meta,
        }

    def check_prompt_bytes(self, request: GenerationRequest) -> None:
        """400 when the prompt's text cannot fit the context whatever its tokens, from its length
        in bytes, before it is tokenized (a 1 MB prompt takes about a second of a core to
        tokenize; a flood of them was tokenized whole before being refused). A chat counts its
        longest message only (a template may leave a message out)."""
        if request.messages is not None:
            n_bytes = max(len(m["content"].encode("utf-8")) for m in request.messages)
        elif isinstance(request.prompt, str):
            n_bytes = len(request.prompt.encode("utf-8"))
        else:
            return  # token ids: counted as they are
        at_least = self.session.min_tokens(n_bytes)
        if self.n_ctx and at_least >= self.n_ctx:  # (max_tokens is checked once the prompt is counted exactly)
            raise context_exceeded(
                f"the prompt's {n_bytes} bytes are at least {at_least} tokens but the context holds "
                f"{self.n_ctx}; shorten it", _field(request))

    def prompt_ids(self, request: GenerationRequest) -> tuple[Prompt, tuple[str, ...]]:
        """The prompt as the engine reads it, and the stop strings its format adds (blocking:
        called from a pool thread). A server that cannot be reached or answers wrong is a 502
        with its one line."""
        if request.messages is not None:
            prompt = Prompt(messages=tuple(request.messages))
        elif isinstance(request.prompt, str):
            prompt = Prompt(text=request.prompt)  # as `specula run -p`
        else:
            prompt = Prompt.of_ids(request.prompt or ())
        try:
            return self.session.tokenize(prompt)
        except PromptError as exc:
            raise bad_field(exc.field, str(exc)) from None
        except ChatTemplateError as exc:  # the template's code failed: the file's fault
            raise bad_field("messages", str(exc)) from None
        except ServerError as exc:
            raise ApiError(502, str(exc), "upstream_error", error_type="server_error") from None

    def decode_settings(self, request: GenerationRequest, n_prompt: int, format_stops: tuple[str, ...]) -> DecodeSettings:
        """The request's settings over the server's defaults; 400 where the context is known and
        cannot fit it."""
        room = self.n_ctx - n_prompt if self.n_ctx and n_prompt else None
        if room is not None and room < 1:
            raise context_exceeded(f"the prompt has {n_prompt} tokens but the context holds {self.n_ctx}; "
                                   "shorten it", _field(request))
        max_tokens = request.max_tokens
        if max_tokens is not None and room is not None and max_tokens > room:
            raise context_exceeded(f"max_tokens {max_tokens} plus the prompt's {n_prompt} tokens exceed the "
                                   f"context of {self.n_ctx} tokens; ask for at most {room}", "max_tokens")
        if max_tokens is None:
            cap = room if room is not None else UNKNOWN_CONTEXT_MAX_TOKENS
            max_tokens = min(cap, self.default_max_tokens or cap)
        return request.decode_settings(self.defaults, max_tokens, format_stops)

    def generate(self, prompt: Prompt, settings: DecodeSettings, cancel: Cancel) -> Iterator[GenerationEvent]:
        """The reply's events (called from the worker thread only)."""
        return self.session.reply(prompt, settings, cancel)


def _field(request: GenerationRequest) -> str:
    return "messages" if request.messages is not None else "prompt"
