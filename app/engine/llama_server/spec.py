"""What runs a reply beyond this process, as plain data: llama-server started here (a model, a
draft, llama.cpp's --spec-type, threads, offload, RPC workers) or a server at a URL. The CLI's
flags and the window's Model tab build a ServerEngine; app.engine.llama_server.session runs it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from app.engine.remote.http import RemoteHttp

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
