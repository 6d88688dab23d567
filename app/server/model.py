"""The model a server serves: its names, prompts, per-request settings and generation.

One main-model KV cache lives as long as the server, so a request that shares a prefix with the
previous one (the next turn of a chat, the same system prompt) evaluates only what is new:
generate() syncs the cache to each prompt by longest common prefix. A draft model's cache is
kept the same way; each request gets a fresh drafter object around it.
"""

from __future__ import annotations

import functools
import logging
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

from app.engine.loop.chat import FALLBACK_STOPS, has_chat_template, render_prompt
from app.engine.drafting.drafters import Drafter, NoDrafter
from app.engine.errors import Cancel, ChatTemplateError
from app.engine.events import GenerationEvent
from app.engine.seam import KVModelLike as KVModel
from app.engine.loader import LoadedModel
from app.engine.loop.speculative import DecodeSettings, generate
from app.engine.settings import GenSettings
from app.hub.display import display_name
from app.server.errors import ApiError, bad_field, context_exceeded
from app.server.params import GenerationRequest

log = logging.getLogger(__name__)

GREEDY = GenSettings(temperature=0.0)  # a server made without defaults (tests) decodes greedily
NORMALIZED_SHRINK = 3  # NFC composes at most 3 code points of 3 bytes into one of 3 (Hangul)


def drafter_factory(prototype: Drafter | None) -> Callable[[], Drafter]:
    """Fresh drafter state per request (Drafter.fresh); a draft model's KV cache is shared."""
    return (prototype or NoDrafter()).fresh


@dataclass
class ServedModel:
    loaded: LoadedModel
    model_id: str
    kv: KVModel
    new_drafter: Callable[[], Drafter]
    drafter_name: str
    defaults: GenSettings  # sampling and drafting from the command line or the window; max_tokens unused
    default_max_tokens: int | None = None  # when a request sets none; None: up to the context
    names: frozenset[str] = frozenset()  # the names GET /v1/models/{id} knows it by (requests take any)
    title: str = ""  # the model's name as the window and `specula inspect` show it (hub.display_name)
    _tokenizer_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def create(
        cls,
        loaded: LoadedModel,
        drafter: Drafter | None = None,
        defaults: GenSettings = GREEDY,
        n_ctx: int | None = None,
        model_id: str | None = None,
        names: Sequence[str] = (),
        default_max_tokens: int | None = None,
    ) -> ServedModel:
        model_id = model_id or loaded.path.stem  # what clients send: kept as it was, names are added
        title = display_name(loaded.path, loaded.info.file_type)
        accepted = {model_id, loaded.path.stem, loaded.path.name, title, *names}
        return cls(
            loaded=loaded, model_id=model_id, kv=loaded.kv_model(n_ctx),
            new_drafter=drafter_factory(drafter), drafter_name=(drafter or NoDrafter()).name,
            defaults=defaults, default_max_tokens=default_max_tokens, names=frozenset(accepted),
            title=title,
        )

    @property
    def tokenizer(self):
        return self.loaded.tokenizer

    @property
    def n_ctx(self) -> int:
        return self.kv.n_ctx

    def check_model(self, name: str | None) -> None:
        """404 unless `name` is one of this model's names (model lookups; completions take any)."""
        if name is not None and name not in self.names:
            raise ApiError(404, f"the model {name[:100]!r} does not exist; this server serves {self.model_id!r}",
                           "model_not_found", param="model")

    def describe(self, created: int) -> dict[str, Any]:
        """OpenAI's model object, plus what llama-server adds (aliases, meta) and the display name
        under "name", the field chat front ends (Open WebUI, LibreChat) show in place of the id."""
        info = self.loaded.info
        return {
            "id": self.model_id, "object": "model", "created": created, "owned_by": "specula",
            "name": self.title or self.model_id, "aliases": sorted(self.names - {self.model_id}),
            "meta": {"n_ctx": self.n_ctx, "n_ctx_train": info.context_length, "n_vocab": self.kv.vocab_size,
                     "architecture": info.architecture, "drafter": self.drafter_name,
                     "file": self.loaded.path.name},
        }

    # -- prompts (called from a thread pool: tokenizer calls are serialized by the lock) --------

    def prompt_ids(self, request: GenerationRequest) -> tuple[list[int], tuple[str, ...]]:
        """Token ids of the request's prompt, and stop strings the prompt format adds."""
        with self._tokenizer_lock:
            if request.messages is not None:
                ids, stops = self._chat_ids(list(request.messages))
            elif isinstance(request.prompt, str):
                ids, stops = self.tokenizer.encode(request.prompt), ()  # as `specula run -p`
            else:
                ids, stops = self._checked_token_ids(request.prompt or ()), ()
        if not ids:
            raise bad_field("messages" if request.messages is not None else "prompt", "the prompt is empty")
        return ids, stops

    def check_prompt_bytes(self, request: GenerationRequest) -> None:
        """400 when the prompt's text cannot fit the context whatever its tokens, from its length
        in bytes, before it is tokenized (a 1 MB prompt takes about a second of a core to
        tokenize; a flood of them was tokenized whole before being refused): no token decodes
        to more than `max_token_bytes`, and normalization (NFC) shortens a text at most
        NORMALIZED_SHRINK times, so a text of B bytes is at least B / (that product) tokens.
        A chat counts its longest message only (a template may leave a message out)."""
        if request.messages is not None:
            n_bytes = max(len(m["content"].encode("utf-8")) for m in request.messages)
        elif isinstance(request.prompt, str):
            n_bytes = len(request.prompt.encode("utf-8"))
        else:
            return  # token ids: counted as they are
        at_least = -(-n_bytes // (self.max_token_bytes * NORMALIZED_SHRINK))
        if at_least >= self.n_ctx:  # (max_tokens is checked once the prompt is counted exactly)
            raise context_exceeded(
                f"the prompt's {n_bytes} bytes are at least {at_least} tokens but the context holds "
                f"{self.n_ctx}; shorten it", "messages" if request.messages is not None else "prompt")

    @functools.cached_property
    def max_token_bytes(self) -> int:
        """The longest token text of the vocabulary in UTF-8 bytes: at least what any token
        decodes to (a byte-level BPE character is one byte, SentencePiece's "\u2581" one space,
        "<0x41>" one byte)."""
        tokens = self.loaded.info.tokens()
        return max((len(t.encode("utf-8", "surrogatepass")) for t in tokens), default=1) or 1

    def _chat_ids(self, messages: list[dict[str, str]]) -> tuple[list[int], tuple[str, ...]]:
        try:
            ids = render_prompt(self.tokenizer, messages)
        except ChatTemplateError as exc:  # the template's code failed (chat._render): the file's fault
            raise bad_field("messages", str(exc)) from None
        # A model without a template gets a "User:/Assistant:" frame that needs its own stop.
        return ids, () if has_chat_template(self.tokenizer) else FALLBACK_STOPS

    def _checked_token_ids(self, ids: Sequence[int]) -> list[int]:
        bad = [t for t in ids if not 0 <= t < self.kv.vocab_size]
        if bad:
            raise bad_field("prompt", f"token id {bad[0]} is outside the vocabulary (0..{self.kv.vocab_size - 1})")
        return list(ids)

    def decode_settings(self, request: GenerationRequest, n_prompt: int, format_stops: tuple[str, ...]) -> DecodeSettings:
        """The request's settings over the server's defaults; 400 when it cannot fit the context."""
        param = "messages" if request.messages is not None else "prompt"
        room = self.n_ctx - n_prompt
        if room < 1:
            raise context_exceeded(
                f"the prompt has {n_prompt} tokens but the context holds {self.n_ctx}; shorten it", param)
        max_tokens = request.max_tokens
        if max_tokens is not None and max_tokens > room:
            raise context_exceeded(
                f"max_tokens {max_tokens} plus the prompt's {n_prompt} tokens exceed the context of "
                f"{self.n_ctx} tokens; ask for at most {room}", "max_tokens")
        if max_tokens is None:
            max_tokens = min(room, self.default_max_tokens or room)
        return request.decode_settings(self.defaults, max_tokens, format_stops)

    # -- generation (called from the worker thread only) ----------------------------------------

    def generate(self, prompt_ids: list[int], settings: DecodeSettings, cancel: Cancel) -> Iterator[GenerationEvent]:
        drafter = self.new_drafter()
        try:
            yield from generate(self.kv, self.tokenizer, prompt_ids, drafter, settings, cancel)
        except Exception:
            # A forward that failed half-way may leave a cache out of step with its ids: only then
            # is it dropped. Any other failure keeps it, so one bad request does not cost every
            # client its cached prefix.
            draft_kv = getattr(drafter, "draft", None)
            for kv in (self.kv, draft_kv if hasattr(draft_kv, "ids") else None):
                if kv is not None and not cache_in_step(kv):
                    log.warning("a generation failed mid-forward: its KV cache is dropped")
                    kv.reset()
            raise


def cache_in_step(kv: KVModel) -> bool:
    """Every layer of the cache holds exactly the positions of kv.ids (KVModel extends ids only
    after a forward succeeds, so a forward that failed part-way leaves some layer longer).
    A backend that can tell itself (llama.cpp's LlamaKV.in_step) is asked."""
    if hasattr(kv, "in_step"):
        return kv.in_step()
    try:
        layers = len(getattr(kv.cache, "layers", ()))
        return all(kv.cache.get_seq_length(i) == len(kv.ids) for i in range(layers))
    except Exception:  # a cache we cannot read is not one we can trust
        return False
