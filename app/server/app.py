"""The OpenAI-compatible HTTP API as a Starlette application.

Why Starlette (and uvicorn to serve it): it is the small, well-kept ASGI toolkit under FastAPI,
giving routing, JSON and streaming responses and a real HTTP stack, and nothing we would have to
work around. FastAPI/pydantic would add a schema and dependency-injection layer that this handful
of endpoints does not need; the request checks are plain Python in params.py with OpenAI-style
400s. The engine never runs on the event loop: see worker.py.

Endpoints: GET /health (no key needed), GET /v1/models[/{id}], POST /v1/chat/completions,
POST /v1/completions (also without the /v1 prefix, as llama-server), GET /metrics (Prometheus).
The completions serve the one model whatever `model` a request names; GET /v1/models/{id} knows
it by its id, its file's name and stem and the aliases it was given.

What a request must pass, in order (AccessGuard, then the handler), is the server's policy, so
`specula serve` and the window's server both get it: a web page's Origin (origin.py), the Host
name or the API key, Content-Type: application/json on POSTs, the body's size and read time, the
prompt's length in bytes against the context, a place in the queue (counted from then on); only
then is the prompt tokenized, one at a time. SECURITY.md says why.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import time
from dataclasses import dataclass
from typing import AsyncIterator, Callable

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers, MutableHeaders
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.engine.events import DoneEvent, RunSummary, StepEvent
from app.server.errors import AUTHENTICATION, ApiError, error_body, internal_error, not_found
from app.server.model import ServedModel
from app.server.openai_format import Reply, sse
from app.server.origin import OriginPolicy, check_any_origin_has_key, is_loopback_name
from app.server.params import GenerationRequest, parse_chat, parse_completion, parse_json
from app.server.worker import Job, ModelWorker

log = logging.getLogger(__name__)

OPEN_PATHS = frozenset({"/health", "/v1/health"})  # answered without the API key
DRAIN_FACTOR = 8  # read (and drop) up to this many times the limit so the client gets our 413


@dataclass(frozen=True)
class ServerConfig:
    api_key: str | None = None  # surrounding whitespace is stripped, as from the header
    max_waiting: int = 8  # requests that may wait while one generates; more get 503
    max_body_bytes: int = 1 << 20
    cors_origins: tuple[str, ...] = ()  # web page origins allowed besides loopback ones; "*": all
    # A body must arrive whole within this (1 MiB at 20 KB/s); a trickling client gets 408.
    body_timeout_s: float = 60.0


def api_key_bytes(key: str | None) -> bytes | None:
    """The key as the guard compares it: stripped as the header's value is, UTF-8 bytes (the
    header arrives as bytes; Starlette's latin-1 str of it never equals a non-latin-1 key)."""
    if key is None:
        return None
    stripped = key.strip()
    if not stripped:
        raise ValueError("the API key is empty")
    return stripped.encode("utf-8")


def create_app(served: ServedModel, config: ServerConfig = ServerConfig()) -> Starlette:
    """The ASGI app; its worker thread starts now and stops with the app's lifespan. ValueError
    for a config that would serve every web page without a key."""
    check_any_origin_has_key(config.cors_origins, config.api_key)
    worker = ModelWorker(served, config.max_waiting)
    api = Api(served, worker, config)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        worker.close()

    routes = [
        Route("/health", api.health), Route("/v1/health", api.health),
        Route("/v1/models", api.models), Route("/models", api.models),
        Route("/v1/models/{model_id:path}", api.model),
        Route("/v1/chat/completions", api.chat, methods=["POST"]),
        Route("/chat/completions", api.chat, methods=["POST"]),
        Route("/v1/completions", api.completions, methods=["POST"]),
        Route("/completions", api.completions, methods=["POST"]),
        Route("/metrics", api.metrics),
    ]
    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={ApiError: _api_error, HTTPException: _http_error, Exception: _unexpected},
    )
    app.add_middleware(AccessGuard, api_key=config.api_key, origins=OriginPolicy(config.cors_origins))
    app.state.worker = worker
    app.state.served = served
    return app


class Api:
    def __init__(self, served: ServedModel, worker: ModelWorker, config: ServerConfig) -> None:
        self.served = served
        self.worker = worker
        self.config = config
        self.created = int(time.time())
        self._tokenizing = asyncio.Semaphore(1)

    async def health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [self.served.describe(self.created)]})

    async def model(self, request: Request) -> Response:
        self.served.check_model(request.path_params["model_id"])
        return JSONResponse(self.served.describe(self.created))

    async def metrics(self, request: Request) -> Response:
        text = self.worker.stats.prometheus(self.worker.processing, self.worker.waiting)
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    async def chat(self, request: Request) -> Response:
        return await self._complete(request, parse_chat, chat=True)

    async def completions(self, request: Request) -> Response:
        return await self._complete(request, parse_completion, chat=False)

    async def _complete(self, request: Request, parse: Callable[[dict], GenerationRequest], chat: bool) -> Response:
        require_json(request.headers)
        body = await read_body(request, self.config.max_body_bytes, self.config.body_timeout_s)
        wanted = parse(parse_json(body))
        # One model is served, so any `model` a client names means it (a client configured for
        # "gpt-4o", or naming the file): as llama-server and LM Studio do with one model loaded.
        # Replies name the model that answered.
        del body
        self.served.check_prompt_bytes(wanted)  # a prompt that cannot fit: 400 before tokenizing it
        # The request's place in the queue is taken before its prompt is tokenized: a full queue
        # answers 503 at once, and at most 1 + max_waiting prompts are held and tokenized.
        admission = self.worker.admit()
        try:
            # Tokenizing a long prompt takes a while: off the event loop, one at a time (the
            # tokenizer is serialized anyway; no pool threads each holding a prompt).
            async with self._tokenizing:
                ids, format_stops = await run_in_threadpool(self.served.prompt_ids, wanted)
            settings = self.served.decode_settings(wanted, len(ids), format_stops)
            job = self.worker.submit(ids, settings, client=client_of(request), admission=admission)
        finally:
            self.worker.release(admission)  # refused (or cancelled): its place is free again
        reply = Reply(chat=chat, model=self.served.model_id, drafter=self.served.drafter_name)
        if wanted.stream:
            return EventStreamResponse(stream_chunks(job, reply, wanted.include_usage), job)
        summary = await wait_for_summary(job, request.receive)
        return JSONResponse(reply.full(summary))


def client_of(request: Request) -> str:
    """Who sent a request, for the cached-tokens rule (worker.py): its network address."""
    return request.client.host if request.client else ""


def require_json(headers: Headers) -> None:
    """415 unless the body is declared JSON: a web page can send a form or text/plain POST
    cross-site without a preflight, but not an application/json one."""
    media_type = headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media_type != "application/json":
        raise ApiError(415, "the request body must be JSON, sent with Content-Type: application/json",
                       "unsupported_media_type")


async def read_body(request: Request, limit: int, timeout_s: float = 60.0) -> bytes:
    """The body, refused with 413 once more than `limit` bytes arrive (whatever Content-Length
    says), and with 408 when it has not all arrived within `timeout_s` (a client that trickles
    a byte now and then would otherwise hold its connection and this task forever)."""
    try:
        async with asyncio.timeout(timeout_s):
            return await _read_limited(request, limit)
    except TimeoutError:
        raise ApiError(408, f"the request body did not arrive within {timeout_s:g} s", "request_timeout",
                       headers={"Connection": "close"}) from None


async def _read_limited(request: Request, limit: int) -> bytes:
    """A declared size over the limit is refused before the body is read."""
    declared = request.headers.get("content-length", "")
    try:
        if declared.isdigit() and int(declared) > limit:
            # A body on its way is read and dropped (a bounded amount) so the client gets our 413
            # rather than a reset; one that waits for "100 Continue" has sent nothing yet.
            waiting = "100-continue" in request.headers.get("expect", "").lower()
            if not waiting and int(declared) <= DRAIN_FACTOR * limit:
                await _drain(request, DRAIN_FACTOR * limit)
            raise _too_large(limit)
        chunks: list[bytes] = []
        size = 0
        async with contextlib.aclosing(request.stream()) as stream:
            async for chunk in stream:
                size += len(chunk)
                if size > DRAIN_FACTOR * limit:
                    break
                if size <= limit:
                    chunks.append(chunk)
        if size > limit:
            raise _too_large(limit)
        return b"".join(chunks)
    except ClientDisconnect:
        raise ApiError(400, "the client disconnected while sending the request", "client_disconnected") from None


async def _drain(request: Request, budget: int) -> None:
    async with contextlib.aclosing(request.stream()) as stream:
        async for chunk in stream:
            budget -= len(chunk)
            if budget < 0:
                return


def _too_large(limit: int) -> ApiError:
    return ApiError(413, f"the request body is larger than the limit of {limit} bytes", "request_too_large",
                    headers={"Connection": "close"})


async def _cancel_on_disconnect(receive: Receive, job: Job) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    log.info("client disconnected: cancelling its generation")
    job.cancel()


async def wait_for_summary(job: Job, receive: Receive) -> RunSummary:
    watcher = asyncio.create_task(_cancel_on_disconnect(receive, job))
    try:
        async for event in job.events():
            if isinstance(event, DoneEvent):
                return event.summary
        raise RuntimeError("a generation ended without its DoneEvent")
    finally:
        watcher.cancel()
        job.cancel()  # a no-op after the end; otherwise (this task cancelled) stop the generation


async def stream_chunks(job: Job, reply: Reply, include_usage: bool) -> AsyncIterator[bytes]:
    if reply.chat:
        yield reply.chunk(first=True)
    try:
        async for event in job.events():
            if isinstance(event, StepEvent):
                if event.text:
                    yield reply.chunk(event.text)
            else:
                yield reply.last_chunks(event.summary, include_usage)
    except ApiError as exc:  # the headers are sent: the error travels as an event, as llama-server does
        yield sse(exc.body())


class EventStreamResponse(StreamingResponse):
    """Server-sent events that cancel their job when the client disconnects (checked by the engine
    between steps) or when the response ends any other way."""

    def __init__(self, chunks: AsyncIterator[bytes], job: Job) -> None:
        super().__init__(chunks, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.job = job

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        watcher = asyncio.create_task(_cancel_on_disconnect(receive, self.job))
        try:
            await self.stream_response(send)
        except OSError:
            log.info("client went away mid-stream")
        finally:
            watcher.cancel()
            self.job.cancel()


class AccessGuard:
    """Who may use the server, before any endpoint runs (so every way of starting it has it):

    1. a web page's Origin must be loopback or allowed (origin.py), on every path; allowed
       origins' preflights are answered here and their responses get CORS headers;
    2. then, on every path but /health: the API key (constant-time compare of UTF-8 bytes), or,
       without a key (the server then only listens on loopback), a loopback Host name (DNS
       rebinding: a web page must not reach the local server through a name it controls)."""

    def __init__(self, app: ASGIApp, api_key: str | None, origins: OriginPolicy = OriginPolicy()) -> None:
        self.app = app
        self.api_key = api_key_bytes(api_key)
        self.origins = origins

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        origin = headers.get("origin")
        if origin is not None:
            if not self.origins.allows(origin):
                await self.origins.refusal(origin)(scope, receive, send)
                return
            if self.origins.is_preflight(scope["method"], headers):
                await self.origins.preflight(headers)(scope, receive, send)
                return
            send = _with_cors(send, origin)
        refusal = None if scope["path"] in OPEN_PATHS else self._refusal(scope, headers)
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _refusal(self, scope: Scope, headers: Headers) -> Response | None:
        if self.api_key is None:
            if _is_loopback_host(headers.get("host", "")):
                return None
            return ApiError(403, "this server only answers requests addressed to localhost", "forbidden_host").response()
        given = _raw_header(scope, b"authorization")
        scheme, _, token = given.partition(b" ")
        if scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self.api_key):
            return None
        message = "invalid API key" if token else "an API key is required (Authorization: Bearer KEY)"
        return JSONResponse(error_body(message, AUTHENTICATION, "invalid_api_key"), status_code=401,
                            headers={"WWW-Authenticate": "Bearer"})


def _raw_header(scope: Scope, name: bytes) -> bytes:
    """A header's value as the client sent its bytes (the first, if repeated)."""
    for key, value in scope["headers"]:
        if key.lower() == name:
            return value
    return b""


def _with_cors(send: Send, origin: str) -> Send:
    async def send_with_cors(message: Message) -> None:
        if message["type"] == "http.response.start":
            OriginPolicy.add_cors_headers(MutableHeaders(scope=message), origin)
        await send(message)

    return send_with_cors


def _is_loopback_host(host: str) -> bool:
    """The Host header (name, name:port, [v6] or [v6]:port) names this machine's loopback."""
    if host.startswith("["):
        name = host[1:].split("]", 1)[0]
    elif host.count(":") == 1:
        name = host.split(":", 1)[0]
    else:
        name = host
    return is_loopback_name(name)


async def _api_error(request: Request, exc: ApiError) -> Response:
    return exc.response()


async def _http_error(request: Request, exc: HTTPException) -> Response:
    if exc.status_code == 404:
        return not_found(f"no such endpoint: {request.method} {request.url.path[:200]}").response()
    if exc.status_code == 405:  # Starlette's exception names the allowed methods in its Allow header
        return ApiError(405, f"{request.method} is not allowed on {request.url.path[:200]}", "method_not_allowed",
                        headers=dict(exc.headers or {})).response()
    return ApiError(exc.status_code, str(exc.detail), "http_error").response()


async def _unexpected(request: Request, exc: Exception) -> Response:
    # Starlette logs the traceback (server side) after this response is sent.
    return internal_error().response()
