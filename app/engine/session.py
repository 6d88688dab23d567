"""The reply engine's one seam: where a reply runs is decided once, in
app.engine.reply_engine.open_session(spec).

A front end (`specula run`, the window's model host, `specula serve`, Compare) describes what it
wants as a spec (a PairSpec: Specula's own loop in this process; a ServerSpec: llama-server
started here, or a server at a URL), opens it once, and from then on holds a `Session`:

    session = open_session(spec, progress, cancel)
    for event in session.reply(Prompt.chat(messages), settings, cancel): ...
    session.describe()  # Facts: what runs, where, how fast, how much memory
    session.close()

It never asks which kind it holds. The three kinds (app.engine.local_session.LocalSession in this
process; app.engine.llama_server.session.ServerSession for llama-server started here and for a
server at a URL) yield the same events (app.engine.events)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Protocol, Sequence

from app.engine.errors import Cancel
from app.engine.events import GenerationEvent

if TYPE_CHECKING:
    from app.engine.llama_server.spec import ServerEngine
    from app.engine.loop.speculative import DecodeSettings

Progress = Callable[[str, float], None]  # (what is happening, fraction done 0..1)
HERE, LLAMA_SERVER, AT_URL = "here", "llama-server", "url"  # where a session's replies run


@dataclass(frozen=True)
class Prompt:
    """What a reply answers: token ids (ours, for the engine's own tokenizer), a chat (the model's
    template applied by the engine; `plain`: its text continued, no roles) or raw text. `fit`:
    leave out the oldest turns of a chat that would not fit the context (the window's chat)."""

    ids: tuple[int, ...] | None = None
    messages: tuple[dict[str, str], ...] | None = None
    text: str | None = None
    plain: bool = False
    fit: bool = False

    @classmethod
    def chat(cls, messages: Sequence[dict[str, str]], system: str | None = None, plain: bool = False,
             fit: bool = False) -> "Prompt":
        head = [{"role": "system", "content": system}] if system else []
        return cls(messages=tuple(head + list(messages)), plain=plain, fit=fit)

    @classmethod
    def of_ids(cls, ids: Sequence[int]) -> "Prompt":
        return cls(ids=tuple(ids))

    def __len__(self) -> int:
        """The ids' count, 0 where the engine has not tokenized it here."""
        return len(self.ids) if self.ids is not None else 0


@dataclass(frozen=True)
class Weights:
    """How a loaded model holds its weights (the offload control's estimate reads it)."""

    path: str
    dtype: str
    gpu_layers: int
    bytes: int


@dataclass(frozen=True)
class Facts:
    """What an open session says about itself: what the window's plan line, loaded line and
    offload controls show, what `specula run` prints as its plan. Unknown values are None
    (a server at a URL tells neither its memory nor its context)."""

    where: str  # HERE, LLAMA_SERVER or AT_URL
    main_name: str
    main_path: str
    main_plan: str  # what runs the main model ("llama.cpp on CPU, Q4_K_M, 2 threads", or the engine line)
    drafter: str  # the drafter asked for: an n-gram kind, "model", "none", or llama-server's types
    drafter_name: str  # what drafts, as the summary names it
    load_s: float
    engine_line: str = ""  # beyond this process: where the reply runs and what drafts (no key)
    served_name: str | None = None  # a server speaking OpenAI's API: the model it serves, by its name
    main_plan_reason: str | None = None
    file_type: str | None = None  # the main model's header names its quantization (Q4_K_M)
    backend: str = LLAMA_SERVER
    backend_reason: str | None = None
    main_plain_tps: float | None = None  # plain decoding's rate as the step measured at load has it
    main_weights: Weights | None = None
    draft_name: str | None = None
    draft_path: str | None = None
    draft_plan: str | None = None
    draft_weights: Weights | None = None
    draft_text_level: bool = False
    ngram_entries: int | None = None  # the n-gram cache's learned sequences, where one learns
    memory_bytes: int = 0
    n_ctx: int = 0  # 0: not known
    n_ctx_train: int | None = None
    n_vocab: int | None = None
    architecture: str | None = None
    chat_template: bool = True
    rope_fix: Any = None
    rpc: tuple[str, ...] = ()
    main_kept: bool = False  # only the drafter changed: the main model stayed loaded
    swap_s: float = 0.0
    swap_error: str | None = None  # the drafter was to change and did not: why (the old pair runs)


class Session(Protocol):
    """An open reply engine. Not thread-safe: one reply at a time, from one thread."""

    def reply(self, prompt: Prompt, settings: DecodeSettings, cancel: Cancel | None = None
              ) -> Iterator[GenerationEvent]:
        """StepEvents as the reply streams, then one DoneEvent."""

    def tokenize(self, prompt: Prompt) -> tuple[Prompt, tuple[str, ...]]:
        """The prompt with the ids the engine will read (where it has them: a server speaking
        only OpenAI's API tokenizes for itself), and the stop strings its format adds.
        PromptError or ChatTemplateError where it cannot be taken."""

    def min_tokens(self, n_bytes: int) -> int:
        """The fewest tokens any text of `n_bytes` UTF-8 bytes can be (0: not known here)."""

    def describe(self) -> Facts: ...

    def plan_line(self) -> str:
        """One line: what runs the reply (no key, no password)."""

    def save_learned(self) -> None:
        """Write what an n-gram cache learned to its file (a failed write is a warning)."""

    def beside(self) -> "Session":
        """A session of its own on the same engine (the same weights or the same server), for
        the Local API server beside the window's chat: the two never share a cache or a reply."""

    def close(self) -> None: ...


@dataclass(frozen=True)
class ServerSpec:
    """A reply engine beyond this process: llama-server started here on `model` with `engine`'s
    flags, or the server at engine.url (`model` then None). `check`: a server at a URL is asked
    at open whether it answers with the key and has its model loaded."""

    engine: ServerEngine
    model: Path | None = None
    check: bool = True
    start_timeout_s: float | None = None


@dataclass(frozen=True)
class LocalOptions:
    """What the in-process engine needs beside the pair: the main model's context (None: the
    backend's default) and where the window keeps its n-gram caches (one per vocabulary, learned
    from every finished reply where `learns`)."""

    n_ctx: int | None = None
    ngram_dir: str | None = None
    learns: bool = False
