"""Compare's rows that run beyond this process: llama-server started here with llama.cpp's own
--spec-type list (the peer every speed claim is measured against), or a server at a URL.

llama-server gets the very prompt ids the in-process rows decode (the same file, so the same
tokenizer), a fresh server per round (its ngram-mod pool learns across requests, as our n-gram
cache does within a round) and the same warm-up; its rates and draft counts are its own
`timings`. A server at a URL renders and tokenizes the prompts itself (its model may differ)."""

from __future__ import annotations

from pathlib import Path

from app.compare.results import LLAMA_SERVER, CompareRequest, ConfigSpec
from app.engine.llama_server.session import ServerEngine, ServerSession


def open_session(request: CompareRequest, config: ConfigSpec) -> ServerSession:
    """The session one row group runs on, not started yet (its first reply starts it)."""
    if config.drafter == LLAMA_SERVER:
        types = tuple(t for t in config.server_types.split(",") if t)
        draft = Path(config.draft_path) if config.draft_path else None
        engine = ServerEngine(spec_types=types, draft=draft, ctx_size=request.ctx_size, rpc=request.rpc,
                              n_gpu_layers=request.n_gpu_layers, n_gpu_layers_draft=request.n_gpu_layers_draft)
        return ServerSession(engine, request.main_path)
    return ServerSession(ServerEngine(url=config.server_url, api_key=request.api_key))


def row_prompt_ids(session: ServerSession, config: ConfigSpec, ours: list[int], text: str) -> list[int]:
    """Our ids for llama-server on our file; the server's own for a server at a URL."""
    if config.drafter == LLAMA_SERVER:
        return ours
    return session.prompt_ids([{"role": "user", "content": text}])


def extra_fields(ignore_eos: bool) -> dict:
    return {"ignore_eos": True} if ignore_eos else {}
