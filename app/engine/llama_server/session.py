"""The reply engine beyond this process (app.engine.session's Session): llama-server started here
or a server already running at a URL: llama-server (its native API: exact token ids, per-step
counts) or any other speaking OpenAI's API (app.engine.remote).

`ServerEngine` (app.engine.llama_server.spec) says what to run; `ServerSession` runs it: it starts llama-server on first use, restarts it if it died (an RPC worker
that went away aborts llama-server, never Specula), and streams each reply as our loop's events
(app.engine.llama_server.engine), so charts, stats and history read one shape."""

from __future__ import annotations

import functools
import logging
import time
from pathlib import Path
from typing import Callable, Iterator, Sequence

from app.engine.llama_server.client import ServerClient, ServerError
from app.engine.llama_server.engine import generate_on_server
from app.engine.llama_server.process import LlamaServer
from app.engine.llama_server.spec import API_AUTO, API_LLAMA, ServerEngine
from app.engine.errors import Cancel, PromptError
from app.engine.events import GenerationEvent
from app.engine.loop.chat import plain_text
from app.engine.loop.speculative import DecodeSettings
from app.engine.session import AT_URL, LLAMA_SERVER, Facts, Progress, Prompt, ServerSpec
from app.engine.loop.sampling import SamplingParams
from app.engine.remote.engine import generate_on_openai
from app.engine.remote.http import HttpStatusError, RemoteHttp
from app.engine.remote.openai_client import OpenAIClient

log = logging.getLogger(__name__)


class ServerSession:
    """A llama-server for as long as the session is open (started here and stopped on close, or
    the one at the engine's URL). Not thread-safe: one reply at a time, from one thread."""

    def __init__(self, engine: ServerEngine, model: Path | str | None = None,
                 start_timeout_s: float | None = None) -> None:
        self.engine = engine
        self.model = Path(model) if model is not None else None
        self._start_timeout_s = start_timeout_s
        self._server: LlamaServer | None = None
        self._client: ServerClient | None = None
        self._openai: OpenAIClient | None = None  # a server at the URL that is not llama-server
        self._openai_model: str | None = None
        self._facts: Facts | None = None

    @functools.cached_property
    def model_info(self):
        """The header of the model llama-server runs here (read once: the template check at each
        start and the facts read it; a read that fails is tried again where asked again)."""
        from app.engine.gguf.info import read_gguf_info

        return read_gguf_info(self.model)

    def __enter__(self) -> "ServerSession":
        self.speaks_openai if self.engine.url else self.open()  # connected (or started) here
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def open(self, cancelled: Callable[[], bool] | None = None) -> ServerClient:
        """The client, starting llama-server (again, if it stopped) where this session runs one;
        `cancelled()` true stops a start under way (LoadCancelled)."""
        if self.engine.url:
            if self._client is None and self._openai is None:
                self._connect()
            if self._openai is not None:
                raise ServerError(f"{self._openai.shown_url} speaks OpenAI's API, not llama-server's: "
                                  "it takes chat messages or text, never token ids")
            return self._client
        if self._server is not None and not self._server.running():
            log.info("llama-server stopped (%s); starting it again", self._server.log_tail())
            self._server.stop()
            self._server = None
        if self._server is None:
            if self.model is None:
                raise ServerError("llama-server needs a model file")
            _check_template(self)
            _check_draft(self)
            kwargs = {} if self._start_timeout_s is None else {"start_timeout_s": self._start_timeout_s}
            server = LlamaServer(self.model, self.engine.flags(), **kwargs)
            server.start(cancelled)
            self._server = server
        return self._server.client

    @property
    def speaks_openai(self) -> bool:
        """True where the server at the URL is answered through OpenAI's API (no token ids)."""
        if self.engine.url and self._client is None and self._openai is None:
            self._connect()
        return self._openai is not None

    @property
    def openai_model(self) -> str | None:
        """The model asked for on a server speaking OpenAI's API (None for llama-server's own)."""
        return self._openai_model if self.speaks_openai else None

    def _connect(self) -> None:
        """The client for the server at the URL: llama-server's native one where it answers
        /props as llama-server does (or the engine names it), else OpenAI's."""
        engine = self.engine
        native = engine.api == API_LLAMA or (engine.api == API_AUTO and _is_llama_server(engine))
        if native:
            self._client = ServerClient(engine.url, engine.api_key, engine.timeout_s)
            return
        client = OpenAIClient(engine.url, engine.api_key, engine.timeout_s)
        self._openai_model = client.choose_model(engine.model_name)
        self._openai = client

    def plan_line(self) -> str:
        """One line for the plan: where the reply runs, and through which API."""
        if self.speaks_openai:
            return (f"the server at {self._openai.shown_url} through OpenAI's API (model {self._openai_model}; "
                    "its speculation, counted from its /metrics where it has them)")
        return self.engine.describe(self.model)

    def reply_to(self, max_new_tokens: int, sampling: SamplingParams, messages: list[dict[str, str]] | None = None,
                 text: str | None = None, stop_strings: Sequence[str] = (),
                 cancelled: Callable[[], bool] | None = None) -> Iterator[GenerationEvent]:
        """The reply to a chat (`messages`, the model's template applied by the server) or to raw
        `text`, whichever API the server speaks."""
        if self.speaks_openai:
            yield from generate_on_openai(self._openai, self._openai_model, max_new_tokens, sampling,
                                          "the server at its URL", messages, text, tuple(stop_strings), cancelled)
            return
        ids = self.prompt_ids(messages) if messages is not None else self.prompt_ids(text=text)
        yield from self.reply_ids(ids, max_new_tokens, sampling, stop_strings, cancelled)

    # -- the reply engine's seam (app.engine.session.Session) ------------------------------------

    def reply(self, prompt: Prompt, settings: DecodeSettings, cancel: Cancel | None = None
              ) -> Iterator[GenerationEvent]:
        """The reply to `prompt`: our ids as they are (llama-server on our file), a chat rendered
        by the server's own template (its text where `plain`), or raw text. llama-server started
        here is started again first if it died (a lost RPC worker aborts it)."""
        if not self.engine.url:
            self.open(cancel)
        extra = {"ignore_eos": True} if settings.stop_token_ids == () else None
        try:
            if prompt.ids is not None:
                yield from self.reply_ids(prompt.ids, settings.max_new_tokens, settings.sampling,
                                          settings.stop_strings, cancel, extra)
                return
            chat = ({"text": plain_text(list(prompt.messages))} if prompt.plain else
                    {"messages": list(prompt.messages)}) if prompt.messages is not None else {"text": prompt.text}
            yield from self.reply_to(settings.max_new_tokens, settings.sampling, stop_strings=settings.stop_strings,
                                     cancelled=cancel, **chat)
        except ServerError as exc:
            if self.engine.rpc and str(exc).startswith("llama-server stopped mid-reply"):
                raise ServerError(f"{exc} (an RPC worker went away? check them: the next reply starts "
                                  "llama-server again)") from None
            raise

    def tokenize(self, prompt: Prompt) -> tuple[Prompt, tuple[str, ...]]:
        """llama-server's own ids (its template, its tokenizer); a server speaking only OpenAI's
        API gets the messages or the text as they came (no ids)."""
        field = "messages" if prompt.messages is not None else "prompt"
        if self.speaks_openai:
            if prompt.ids is not None:
                raise PromptError("this server speaks OpenAI's API: it takes text, not token ids")
            return prompt, ()
        if prompt.ids is not None:
            ids = list(prompt.ids)
        elif prompt.messages is not None:
            ids = self.prompt_ids(list(prompt.messages))
        else:
            ids = self.prompt_ids(text=prompt.text)
        if not ids:
            raise PromptError("the prompt is empty", field)
        return Prompt.of_ids(ids), ()

    def min_tokens(self, n_bytes: int) -> int:
        """The server counts its own tokens (the body's size limit still holds)."""
        return 0

    def describe(self) -> Facts:
        return self._facts or server_facts(self, 0.0)

    def save_learned(self) -> None:
        """No n-gram cache of ours learns from a server's replies."""

    def beside(self) -> "ServerSession":
        """A session of its own on the server this one talks to (the llama-server it started, or
        the one at its URL, with the same key): it never starts or stops one."""
        engine = self.engine
        if not engine.url:
            engine = ServerEngine(url=self.open().base_url, api=API_LLAMA, timeout_s=engine.timeout_s)
        beside = ServerSession(engine)
        beside.speaks_openai  # connects now (reads /props or /v1/models), not on the first request
        beside._facts = self.describe()
        return beside

    def close(self) -> None:
        self._openai = None
        server, self._server, self._client = self._server, None, None
        if server is not None:
            server.stop()

    def prompt_ids(self, messages: list[dict[str, str]] | None = None, text: str | None = None) -> list[int]:
        """Token ids of a chat (the model's template, as llama-server renders it) or of raw text."""
        client = self.open()
        prompt = client.apply_template(messages) if messages is not None else (text or "")
        return client.tokenize(prompt)

    def reply_ids(self, ids: Sequence[int], max_new_tokens: int, sampling: SamplingParams,
              stop_strings: Sequence[str] = (), cancelled: Callable[[], bool] | None = None,
              extra: dict | None = None) -> Iterator[GenerationEvent]:
        """The reply's events (StepEvents, then the DoneEvent). A server that died mid-reply is a
        ServerError naming what its log said (an RPC worker gone, out of memory)."""
        client = self.open()
        try:
            yield from generate_on_server(client, ids, max_new_tokens, sampling, self.engine.drafter_label,
                                          stop_strings, cancelled, extra)
        except ServerError as exc:
            if self._server is not None and not self._server.running(grace_s=1.0):
                raise ServerError(f"llama-server stopped mid-reply: {self._server.log_tail()}") from None
            raise exc from None


def _check_template(session: ServerSession) -> None:
    """ChatTemplateError (one line) where the model's chat template passes our bounds:
    llama-server renders it at start and on each chat with none (a bomb ran 75 s and 2.3 GB)."""
    from app.engine.errors import ChatTemplateError
    from app.engine.loop.template_guard import unbounded_reason

    model = session.model
    try:
        template = session.model_info.metadata.get("tokenizer.chat_template")
    except Exception as exc:  # noqa: BLE001 - llama-server reads the file itself and says what is wrong
        log.info("the chat template of %s was not read before llama-server: %s", model.name, exc)
        return
    why = unbounded_reason(template) if isinstance(template, str) and template.strip() else None
    if why:
        raise ChatTemplateError(f"the chat template of {model.name} is refused before llama-server runs it: {why}")


def _check_draft(session: ServerSession) -> None:
    """IncompatibleDraftError (one line) where llama-server would drop the draft model: llama.cpp
    drafts token by token only, and a draft of another vocabulary ran without a draft, saying so
    only in llama-server's log. A header that cannot be read is left to llama-server to report."""
    from app.engine.gguf.info import read_gguf_info
    from app.engine.llama_server.drafts import check_server_draft, uses_draft_model

    engine = session.engine
    if engine.draft is None or not uses_draft_model(engine.types):
        return
    try:
        main, draft = session.model_info, read_gguf_info(engine.draft)
    except Exception as exc:  # noqa: BLE001 - llama-server reads the files itself and says what is wrong
        log.info("the draft of %s was not checked before llama-server: %s", session.model.name, exc)
        return
    check_server_draft(main, draft)


def _is_llama_server(engine: ServerEngine) -> bool:
    """True where GET /props answers as llama-server does (its build and generation settings);
    an HTTP error or another answer means another server. Not reachable at all: a ServerError."""
    http = RemoteHttp(engine.url, engine.api_key, min(engine.timeout_s, 30.0))
    try:
        props = http.get_json("/props")
    except HttpStatusError as exc:
        if exc.status in (401, 403):  # a refused key is refused on every path: say so now
            raise
        return False
    except ServerError as exc:
        if "is not JSON" in str(exc):
            return False
        raise
    return (isinstance(props, dict) and isinstance(props.get("build_info"), str)
            and isinstance(props.get("default_generation_settings"), dict))


def open_server(spec: ServerSpec, progress: Progress | None = None, cancel: Cancel | None = None) -> ServerSession:
    """Start llama-server (or reach the server at the URL and, with spec.check, see it answers
    with the key): the session replies run on. A failed start is one line."""
    started = time.monotonic()
    engine = spec.engine
    session = ServerSession(engine, None if engine.url else spec.model, spec.start_timeout_s)
    if progress is not None:
        progress("checking the server" if engine.url else "starting llama-server", 0.1)
    try:
        if not engine.url:
            session.open(cancel)
        elif spec.check:
            _check_answers(session)
        else:
            session.speaks_openai  # connects: reads /props or /v1/models
    except BaseException:
        session.close()
        raise
    if progress is not None:
        progress("ready", 1.0)
    session._facts = server_facts(session, time.monotonic() - started)
    return session


def _check_answers(session: ServerSession) -> None:
    """The server at the URL answers: a llama-server has its model loaded (/health) and takes
    the key (/tokenize asks for it); any other (OpenAI's API) listed its models with the key."""
    if session.speaks_openai:  # connecting read /v1/models, which needs the key
        return
    client = session.open()
    if not client.healthy(timeout_s=10.0):
        raise ServerError(f"{client.shown_url} is still loading its model: try Load again in a moment")
    client.tokenize("hi")


def server_facts(session: ServerSession, load_s: float) -> Facts:
    """What a session beyond this process says about itself: the model's file and template where
    llama-server runs it here; at a URL its name is the URL (OpenAI's API tells no context)."""
    engine, line = session.engine, session.plan_line()
    template, n_ctx = True, 0 if session.speaks_openai else server_context(session)
    if session.model is not None:
        template = bool(session.model_info.has_chat_template)
        name, path, where = session.model.name, str(session.model), LLAMA_SERVER
    else:
        shown = RemoteHttp(engine.url).shown_url
        name, path, where = shown, shown, AT_URL
    return Facts(where=where, main_name=name, main_path=path, main_plan=line, engine_line=line,
                 backend_reason=line, drafter=",".join(engine.types) or "none", drafter_name=engine.drafter_label,
                 draft_name=engine.draft.name if engine.draft else None,
                 draft_path=str(engine.draft) if engine.draft else None, rpc=tuple(engine.rpc), load_s=load_s,
                 n_ctx=n_ctx, chat_template=template, served_name=session.openai_model if engine.url else None)


def server_context(session: ServerSession) -> int:
    """The context llama-server holds (its /props), 0 where it does not say."""
    try:
        props = session.open().props()
    except Exception as exc:  # a server without /props serves all the same: the context is then unknown
        log.info("the server's context is not known: %s", exc)
        return 0
    settings = props.get("default_generation_settings") if isinstance(props, dict) else None
    n_ctx = settings.get("n_ctx") if isinstance(settings, dict) else None
    return n_ctx if isinstance(n_ctx, int) and n_ctx > 0 else 0
