"""An engine beyond this process, as one object the CLI, the window's worker, Compare and the
Local API server share: llama-server started here (a model, a draft, llama.cpp's --spec-type,
threads, offload, RPC workers) or a server already running at a URL: llama-server (its native
API: exact token ids, per-step counts) or any other speaking OpenAI's API (app.engine.remote).

`ServerEngine` says what to run (plain data, built from flags or from the window's Model tab);
`ServerSession` runs it: it starts llama-server on first use, restarts it if it died (an RPC worker
that went away aborts llama-server, never Specula), and streams each reply as our loop's events
(app.engine.llama_server.engine), so charts, stats and history read one shape."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Sequence

from app.engine.llama_server.client import ServerClient, ServerError
from app.engine.llama_server.engine import generate_on_server
from app.engine.llama_server.process import LlamaServer
from app.engine.events import GenerationEvent
from app.engine.loop.sampling import SamplingParams
from app.engine.remote.engine import generate_on_openai
from app.engine.remote.http import HttpStatusError, RemoteHttp
from app.engine.remote.openai_client import OpenAIClient

log = logging.getLogger(__name__)

# Every --spec-type llama-server knows (common/speculative.cpp), in its own order.
LLAMA_SPEC_TYPES = ("none", "draft-simple", "draft-eagle3", "draft-mtp", "draft-dflash", "draft-dspark",
                    "ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")
DRAFT_MODEL_TYPES = ("draft-simple", "draft-eagle3", "draft-dflash", "draft-dspark")  # these read -md
# How to speak to a server at a URL: found out (llama-server answers /props), or named.
API_AUTO, API_LLAMA, API_OPENAI = "auto", "llama-server", "openai"
SERVER_APIS = (API_AUTO, API_LLAMA, API_OPENAI)


@dataclass(frozen=True)
class ServerEngine:
    """What runs a reply beyond this process. `url` set: a server someone else runs (its model
    and speculation; the other fields are not used); else llama-server started here on 127.0.0.1
    with these values (llama.cpp's defaults where left at None / 0 / ())."""

    url: str | None = None
    api_key: str | None = field(default=None, repr=False)  # never logged, never shown
    api: str = API_AUTO  # with url: one of SERVER_APIS
    model_name: str | None = None  # with url and OpenAI's API: the model asked for (else the one served)
    timeout_s: float = 600.0  # with url: the longest wait for any answer or streamed chunk
    spec_types: tuple[str, ...] = ()
    draft: Path | None = None
    rpc: tuple[str, ...] = ()  # HOST:PORT of rpc-server workers the main model is split across
    threads: int = 0
    ctx_size: int = 0
    n_gpu_layers: int | None = None
    n_gpu_layers_draft: int | None = None
    ctx_size_draft: int = 0
    flash_attn: str = "auto"
    spec_values: tuple[tuple[str, str], ...] = ()  # further llama-server flags: (--spec-draft-n-max, "16"), ...

    @property
    def types(self) -> tuple[str, ...]:
        """The --spec-type list llama-server gets: draft-simple where only a draft is named."""
        named = tuple(t for t in self.spec_types if t != "none")
        return named or (("draft-simple",) if self.draft else ())

    def flags(self) -> list[str]:
        """llama-server's flags for this engine (after -m MODEL)."""
        flags = ["-fa", self.flash_attn]
        if self.threads:
            flags += ["-t", str(self.threads), "-tb", str(self.threads)]
        if self.ctx_size:
            flags += ["-c", str(self.ctx_size)]
        if self.rpc:
            flags += ["--rpc", ",".join(self.rpc)]
        if self.n_gpu_layers is not None or self.rpc:  # with workers: every layer offloaded to them
            flags += ["-ngl", str(999 if self.n_gpu_layers is None else self.n_gpu_layers)]
        if self.draft:
            flags += ["-md", str(self.draft)]
            if self.n_gpu_layers_draft is not None:
                flags += ["-ngld", str(self.n_gpu_layers_draft)]
            if self.ctx_size_draft:
                flags += ["-cd", str(self.ctx_size_draft)]
        if self.types:
            flags += ["--spec-type", ",".join(self.types)]
        for flag, value in self.spec_values:
            flags += [flag, value]
        return flags

    def describe(self, model: Path | None = None) -> str:
        """One line for the plan and the stats: where the reply runs and what drafts."""
        if self.url:
            return f"the llama-server at {RemoteHttp(self.url).shown_url} (its model and speculation)"
        types = ",".join(self.types) or "none"
        workers = f", split across RPC workers {','.join(self.rpc)}" if self.rpc else ""
        on = f" on {model.name}" if model else ""
        return f"llama-server (llama.cpp's own engine, --spec-type {types}){on}{workers}"

    @property
    def drafter_label(self) -> str:
        return "llama-server at its URL" if self.url else f"llama-server {','.join(self.types) or 'none'}"


def check_url(url: str) -> str:
    """An http:// or https:// URL with a host, without its trailing slash; ValueError otherwise."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        shown = parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl()  # never a password
        raise ValueError(f"{shown!r} is not an http:// or https:// URL")
    return url.rstrip("/")


def check_rpc_endpoints(value: str | Sequence[str]) -> tuple[str, ...]:
    """HOST:PORT,... checked; ValueError (one line) for anything else."""
    items = value.split(",") if isinstance(value, str) else list(value)
    endpoints = tuple(v.strip() for v in items if v.strip())
    for endpoint in endpoints:
        host, _, port = endpoint.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"{endpoint!r} is not HOST:PORT")
    if not endpoints:
        raise ValueError("needs HOST:PORT")
    return endpoints


LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


def off_loopback(endpoints: Sequence[str]) -> list[str]:
    """The endpoints whose host is not this machine's loopback (llama.cpp's warning applies)."""
    return [e for e in endpoints if e.rpartition(":")[0].strip("[]") not in LOOPBACK_HOSTS]


RPC_WARNING = ("llama.cpp's RPC has no authentication and is not secure: never expose an RPC worker to an open "
               "network (llama.cpp's rpc-server says the same)")


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
            _check_template(self.model)
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

    def describe(self) -> str:
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
        yield from self.reply(ids, max_new_tokens, sampling, stop_strings, cancelled)

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

    def reply(self, ids: Sequence[int], max_new_tokens: int, sampling: SamplingParams,
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


def _check_template(model: Path) -> None:
    """ChatTemplateError (one line) where the model's chat template passes our bounds:
    llama-server renders it at start and on each chat with none (a bomb ran 75 s and 2.3 GB)."""
    from app.engine.errors import ChatTemplateError
    from app.engine.gguf.info import read_gguf_info
    from app.engine.loop.template_guard import unbounded_reason

    try:
        template = read_gguf_info(model).metadata.get("tokenizer.chat_template")
    except Exception as exc:  # noqa: BLE001 - llama-server reads the file itself and says what is wrong
        log.info("the chat template of %s was not read before llama-server: %s", model.name, exc)
        return
    why = unbounded_reason(template) if isinstance(template, str) and template.strip() else None
    if why:
        raise ChatTemplateError(f"the chat template of {model.name} is refused before llama-server runs it: {why}")


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
