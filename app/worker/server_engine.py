"""The window's replies beyond this process, on the model host's thread: llama-server started here
(llama.cpp's own engine and --spec-type, RPC workers) or a llama-server at a URL, through the
engine's one ServerSession, so that the chat, the stats line and the charts read the same events
as from Specula's own loop.

A ServerPair stands where engine_calls.LoadedPair stands for the in-process engine: the host
loads one, replies on it and drops it (which stops the llama-server it started)."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from app.engine.errors import Cancel
from app.worker.requests import AT_URL, MODEL, ChatRequest, PairChoice

log = logging.getLogger(__name__)

Progress = Callable[[str, float], None]


@dataclass
class ServerPair:
    """An open ServerSession (app.engine.llama_server.session) and what the window shows of it."""

    session: Any
    spec: PairChoice
    facts: dict[str, Any] = field(default_factory=dict)
    drafter: Any = None  # none here: the Local API server serves through the session (worker.serving)

    def reset_state(self) -> None:
        """After a failed reply: nothing to reset here (the session starts llama-server again
        on the next reply if it died)."""

    def save_cache(self) -> None:
        """No n-gram cache learns from a server's replies."""

    def close(self) -> None:
        self.session.close()


def server_engine_of(spec: PairChoice):
    """The window's choice as the engine's ServerEngine (the key read from its store here, where
    it is sent: it never travels in the request or a signal)."""
    from app.engine.llama_server.keys import read_key
    from app.engine.llama_server.session import ServerEngine, check_rpc_endpoints

    if spec.runs_on == AT_URL:
        key = read_key(spec.key_store, spec.server_url) if spec.key_store else None
        return ServerEngine(url=spec.server_url, api_key=key)
    types = () if spec.spec_type == "none" else (spec.spec_type,)
    draft = Path(spec.draft_path) if spec.drafter == MODEL and spec.draft_path else None
    rpc = check_rpc_endpoints(spec.rpc) if spec.rpc.strip() else ()
    # With workers every layer goes to them (llama.cpp's -ngl counts RPC devices as GPUs): the Model
    # tab's offload, 0 on a computer without a GPU, would keep the whole model here.
    layers = None if rpc else spec.main_gpu_layers
    return ServerEngine(spec_types=types, draft=draft, rpc=rpc, n_gpu_layers=layers,
                        n_gpu_layers_draft=spec.draft_gpu_layers if draft else None)


def load_server(spec: PairChoice, progress: Progress, cancel: Cancel) -> ServerPair:
    """Start llama-server (or reach the server at the URL and check it answers, with the key)
    and return the pair the chat replies on. A failed start is one line (ServerSession's)."""
    from app.engine.llama_server.session import ServerSession

    started = time.monotonic()
    try:
        engine = server_engine_of(spec)
    except ValueError as exc:
        from app.engine.errors import SpeculaError

        raise SpeculaError(f"RPC workers: {exc}") from None
    model = None if engine.url else Path(spec.main_path)
    session = ServerSession(engine, model)
    progress("checking the server" if engine.url else "starting llama-server", 0.1)
    try:
        if engine.url:
            _check_url(session)
        else:
            session.open(cancel)
    except BaseException:
        session.close()
        raise
    progress("ready", 1.0)
    pair = ServerPair(session, spec)
    pair.facts = server_facts(spec, session, model, time.monotonic() - started)
    return pair


def _check_url(session) -> None:
    """The server answers: a llama-server has its model loaded (/health) and takes the key
    (/tokenize asks for it); any other (OpenAI's API) listed its models with the key."""
    from app.engine.llama_server.client import ServerError

    if session.speaks_openai:  # connecting read /v1/models, which needs the key
        return
    client = session.open()
    if not client.healthy(timeout_s=10.0):
        raise ServerError(f"{client.shown_url} is still loading its model: try Load again in a moment")
    client.tokenize("hi")


def server_facts(spec: PairChoice, session, model: Path | None, load_s: float) -> dict[str, Any]:
    """What the window shows about the engine (the keys of engine_calls.pair_facts it reads)."""
    engine = session.engine
    line = session.describe()
    if model is not None:
        from app.engine.gguf.info import read_gguf_info

        info = read_gguf_info(model)
        name, template = model.name, bool(info.has_chat_template)
    else:
        name, template = spec.server_url, True
    draft = Path(spec.draft_path).name if engine.draft else None
    return {
        "runs_on": spec.runs_on, "engine_line": line, "main_name": name, "main_path": spec.main_path,
        "main_plan": line, "main_plan_reason": None, "backend": "llama-server", "backend_reason": line,
        "main_plain_tps": None, "main_weights": None, "draft_name": draft,
        "draft_path": str(engine.draft) if engine.draft else None, "draft_plan": None, "draft_weights": None,
        "drafter": spec.drafter, "drafter_name": engine.drafter_label, "spec_type": spec.spec_type,
        "rpc": list(engine.rpc), "draft_text_level": False, "ngram_entries": None, "load_s": load_s,
        "memory_bytes": 0, "n_ctx": 0, "chat_template": template, "rope_fix": None,
    }


def reply_events(pair: ServerPair, request: ChatRequest, cancel: Cancel) -> Iterator[Any]:
    """The reply's events (StepEvents, then the DoneEvent) from the server: the conversation
    rendered by the server's own chat template (plain text for a base model)."""
    from app.engine.llama_server.client import ServerError
    from app.engine.loop.chat import plain_text

    settings = request.settings.decode_settings()
    head = [{"role": "system", "content": request.system_prompt}] if request.system_prompt else []
    messages = head + request.messages() + [{"role": "user", "content": request.user_text}]
    session = pair.session
    if not session.engine.url:
        session.open(cancel)  # starts llama-server again if it died (a lost RPC worker aborts it)
    chat = {"text": plain_text(messages)} if request.plain else {"messages": messages}
    try:
        yield from session.reply_to(settings.max_new_tokens, settings.sampling, stop_strings=settings.stop_strings,
                                    cancelled=cancel, **chat)
    except ServerError as exc:
        if session.engine.rpc and str(exc).startswith("llama-server stopped mid-reply"):
            raise ServerError(f"{exc} (an RPC worker went away? check them: the next reply starts "
                              "llama-server again)") from None
        raise
