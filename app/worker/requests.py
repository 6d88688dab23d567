"""What the window asks the model host for, as plain frozen data (no Qt, no torch).

The UI builds these from its widgets and remembers them in QSettings and the history database
(GenSettings' `to_dict` / `from_dict`: app.engine.settings), and the host turns them into engine
calls on its own thread.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.engine.backends import AUTO
from app.engine.drafting.kinds import LEARNING, kind_title
from app.engine.settings import UNTIL_CONTEXT, GenSettings  # noqa: F401 - the window's settings are the engine's one shape

NONE, LOOKUP, MODEL = "none", "lookup", "model"  # the drafter kinds a user can pick
NGRAM_CACHE, LOOKUP_CACHE = "ngram-cache", "lookup+ngram-cache"  # learn from the user's chats
# Prompt lookup, the n-gram cache and llama.cpp's ngram-mod pool (which learns from every reply
# of the session): the best of the model-free drafters across `specula bench` on both demo
# models, first request and repeat (geometric mean over llama-server's best 1.06x SmolLM2, 1.14x
# Gemma; prompt lookup alone 0.89x, 1.00x), so the default a new user gets (issue 48 item 5).
DEFAULT_DRAFTER = LEARNING
KINDS = (NONE, LOOKUP, NGRAM_CACHE, LOOKUP_CACHE, LEARNING, MODEL)
# Where the model runs (the Model tab's "Where it runs"): Specula's own loop in this process,
# llama-server started here (llama.cpp's own engine and --spec-type), or a server at a URL.
HERE, LLAMA_SERVER, AT_URL = "here", "llama-server", "url"
RUNS_ON = (HERE, LLAMA_SERVER, AT_URL)
DRAFTER_TEXT = {NONE: "no drafting", **{kind: kind_title(kind) for kind in (LOOKUP, NGRAM_CACHE, LOOKUP_CACHE, LEARNING)}}  # a model is called by its name


@dataclass(frozen=True)
class PairChoice:
    """What the window's Model tab chose (remembered in its settings; engine_calls.engine_spec
    makes the engine's app.engine.pair_loader.PairSpec of it): a main model and how it is drafted for. gpu_layers follow llama.cpp's -ngl: None = all
    layers on the GPU when there is one, 0 = CPU only."""

    main_path: str
    drafter: str = NONE  # one of KINDS (MODEL: draft_path is the draft GGUF file)
    draft_path: str | None = None
    main_gpu_layers: int | None = None
    draft_gpu_layers: int | None = None
    dtype: str = "auto"  # torch: weights once loaded: auto (float32 on the CPU, bf16/fp16 on a GPU), ...
    backend: str = AUTO  # what runs the models (BACKEND_CHOICES): auto (llama.cpp where it runs here), llama.cpp, torch
    # The folder of the n-gram caches (one file per main vocabulary), beside the chat history;
    # None: an n-gram cache in memory only.
    ngram_dir: str | None = None
    runs_on: str = HERE  # one of RUNS_ON
    spec_type: str = "none"  # llama-server's --spec-type (LLAMA_SERVER); its draft-* types read draft_path
    server_url: str | None = None  # AT_URL: the server (main_path holds it too, for what shows it)
    rpc: str = ""  # LLAMA_SERVER: HOST:PORT,... of llama.cpp rpc-server workers the main model is split across
    # The file of stored API keys (app.engine.llama_server.keys): the key itself never travels in a
    # request, a signal or the settings; the worker reads it where it sends it.
    key_store: str | None = None

    @property
    def learns(self) -> bool:
        return self.runs_on == HERE and self.drafter in (NGRAM_CACHE, LOOKUP_CACHE, LEARNING)

    @property
    def on_server(self) -> bool:
        return self.runs_on != HERE

    def __post_init__(self) -> None:
        if self.runs_on not in RUNS_ON:
            raise ValueError(f"unknown place to run {self.runs_on!r}")
        if self.runs_on == AT_URL and not self.server_url:
            raise ValueError("a server at a URL was chosen but no URL given")
        if self.drafter not in KINDS:
            raise ValueError(f"unknown drafter {self.drafter!r}")
        if self.drafter == MODEL and not self.draft_path:
            raise ValueError("a draft model was chosen but no draft file given")


@dataclass(frozen=True)
class ChatRequest:
    """One reply to generate: the conversation before the user's message, then that message."""

    history: tuple[tuple[str, str], ...]  # (role, content), oldest first, no system prompt
    user_text: str
    system_prompt: str = ""
    settings: GenSettings = GenSettings()
    plain: bool = False  # plain completion: the model continues the conversation's text, no chat roles

    def messages(self) -> list[dict[str, str]]:
        return [{"role": role, "content": content} for role, content in self.history]
