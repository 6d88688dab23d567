"""The reply engine in this process: Specula's own loop, drafters and schedule on a loaded pair.

One main-model KV cache lives as long as the session, so a reply that shares a prefix with the
previous one (the next turn of a chat, the same system prompt) evaluates only what is new: the
loop syncs the cache to each prompt by longest common prefix. Each reply gets fresh drafter
state around the pair's shared parts (a draft model's KV cache, a learned n-gram cache).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from dataclasses import replace
from typing import Iterator

from app.engine.errors import Cancel, PromptError
from app.engine.events import GenerationEvent
from app.engine.loop.chat import chat_prompt_ids, fitted_prompt_ids, format_stops
from app.engine.loop.speculative import DecodeSettings, generate
from app.engine.pair_loader import LoadedPair, PairSpec, load_draft_for, load_pair, part_progress
from app.engine.seam import Drafter, KVModelLike
from app.engine.session import HERE, Facts, LocalOptions, Progress, Prompt, Weights

log = logging.getLogger(__name__)

NORMALIZED_SHRINK = 3  # NFC composes at most 3 code points of 3 bytes into one of 3 (Hangul)


def open_local(spec: PairSpec, progress: Progress | None = None, cancel: Cancel | None = None,
               options: LocalOptions = LocalOptions()) -> "LocalSession":
    """Check the pair, load it and open its n-gram cache (-lcd's file, or the window's folder)."""
    pair = load_pair(spec, progress, cancel, open_cache=_cache_opener(spec, options))
    if progress is not None:
        progress("ready", 1.0)
    return LocalSession(pair, options)


def _cache_opener(spec: PairSpec, options: LocalOptions):
    """How the pair's n-gram cache is opened: the window's folder (one cache per vocabulary,
    learning whatever drafts), else the spec's -lcd file."""
    if not options.learns and not options.ngram_dir:
        return None

    def open_window_cache(main):
        from app.engine.drafting.factory import open_cache
        from app.engine.drafting.ngram_cache import NgramCacheError

        try:
            return open_cache(main, options.ngram_dir)
        except NgramCacheError as exc:  # a file renamed by hand: the app still starts
            log.warning("%s; starting with an empty n-gram cache", exc)
            return open_cache(main, None)

    return open_window_cache


class LocalSession:
    """A loaded pair, its main model's KV cache (kept across replies) and its drafter."""

    def __init__(self, pair: LoadedPair, options: LocalOptions = LocalOptions(),
                 kv: KVModelLike | None = None) -> None:
        self.pair = pair
        self.options = options
        self.kv = kv if kv is not None else pair.main.kv_model(options.n_ctx)
        self._tokenizer_lock = threading.Lock()
        self._facts: Facts | None = None  # made when asked: Compare opens a session per reply

    @classmethod
    def around(cls, main, drafter: Drafter | None = None, n_ctx: int | None = None) -> "LocalSession":
        """A session on a model loaded already (app.engine.loader.LoadedModel) drafted for by
        `drafter` (None: plain decoding)."""
        from app.engine.seam import NoDrafter

        pair = LoadedPair(PairSpec(main.path), main, None, None, None, drafter or NoDrafter())
        return cls(pair, LocalOptions(n_ctx=n_ctx))

    @property
    def tokenizer(self):
        return self.pair.main.tokenizer

    def new_drafter(self) -> Drafter:
        """Fresh per-reply state of the pair's drafter, teaching the window's n-gram cache every
        finished reply whatever drafts (it is warm the day it is chosen)."""
        from app.engine.drafting.ngram_drafters import learning_into

        fresh = self.pair.drafter.fresh()
        return learning_into(fresh, self.pair.cache) if self.options.ngram_dir or self.options.learns else fresh

    def reply(self, prompt: Prompt, settings: DecodeSettings, cancel: Cancel | None = None
              ) -> Iterator[GenerationEvent]:
        ids, stops = self.prompt_ids(prompt)
        if stops:
            settings = replace(settings, stop_strings=tuple(settings.stop_strings) + stops)
        drafter = self.new_drafter()
        try:
            yield from generate(self.kv, self.tokenizer, ids, drafter, settings, cancel)
        except Exception:
            self._drop_caches_out_of_step(drafter)
            raise

    def tokenize(self, prompt: Prompt) -> tuple[Prompt, tuple[str, ...]]:
        """The prompt's ids (thread-safe: the Local API server tokenizes in a pool while a reply
        runs); token ids are checked against the vocabulary."""
        field = "messages" if prompt.messages is not None else "prompt"
        if prompt.ids is not None:
            bad = [t for t in prompt.ids if not 0 <= t < self.kv.vocab_size]
            if bad:
                raise PromptError(f"token id {bad[0]} is outside the vocabulary (0..{self.kv.vocab_size - 1})")
        with self._tokenizer_lock:
            ids, stops = self.prompt_ids(prompt)
        if not ids:
            raise PromptError("the prompt is empty", field)
        return Prompt.of_ids(ids), stops

    def min_tokens(self, n_bytes: int) -> int:
        """No token decodes to more than max_token_bytes, and normalization (NFC) shortens a text
        at most NORMALIZED_SHRINK times, so a text of B bytes is at least B / (their product) tokens."""
        return -(-n_bytes // (self.max_token_bytes * NORMALIZED_SHRINK))

    @functools.cached_property
    def max_token_bytes(self) -> int:
        """The longest token text of the vocabulary in UTF-8 bytes: at least what any token
        decodes to (a byte-level BPE character is one byte, SentencePiece's "\u2581" one space,
        "<0x41>" one byte)."""
        tokens = self.pair.main.info.tokens()
        return max((len(t.encode("utf-8", "surrogatepass")) for t in tokens), default=1) or 1

    def prompt_ids(self, prompt: Prompt) -> tuple[list[int], tuple[str, ...]]:
        """The prompt's token ids, and the stop strings its format adds (a model without a chat
        template answers in a "User:/Assistant:" frame that needs its own stop)."""
        if prompt.ids is not None:
            return list(prompt.ids), ()
        if prompt.messages is None:
            return self.tokenizer.encode(prompt.text or ""), ()
        messages = list(prompt.messages)
        stops = format_stops(self.tokenizer, prompt.plain)
        if prompt.fit:  # the oldest turns left out where the chat would not fit
            return fitted_prompt_ids(self.tokenizer, self.kv.n_ctx, messages, prompt.plain), stops
        return chat_prompt_ids(self.tokenizer, messages, prompt.plain), stops

    def _drop_caches_out_of_step(self, drafter: Drafter) -> None:
        """A forward that failed half-way may leave a cache out of step with its ids: only then
        is it dropped. Any other failure keeps it, so one bad request does not cost every
        client its cached prefix."""
        draft_kv = getattr(drafter, "draft", None)
        for kv in (self.kv, draft_kv if hasattr(draft_kv, "ids") else None):
            if kv is not None and not cache_in_step(kv):
                log.warning("a generation failed mid-forward: its KV cache is dropped")
                kv.reset()

    def describe(self) -> Facts:
        if self._facts is None:
            self._facts = local_facts(self)
        return self._facts

    def plan_line(self) -> str:
        main = self.pair.main
        return f"{main.plan.describe()} ({main.plan_reason})"

    def save_learned(self) -> None:
        """Write what the n-gram cache learned to its file (-lcd's, or the window's folder); a
        failed write is a warning (the cache stays in memory and is written after the next reply)."""
        cache = self.pair.cache
        if cache is None or not cache.dirty:
            return
        from app.engine.drafting.factory import cache_path

        path = self.pair.spec.cache_file or (cache_path(self.options.ngram_dir, cache.key)
                                             if self.options.ngram_dir else None)
        if path is None:
            return
        try:
            cache.save(path)
        except OSError as exc:
            log.warning("the n-gram cache could not be saved to %s: %s", path, exc)

    def with_drafter(self, spec: PairSpec, progress: Progress | None = None, cancel: Cancel | None = None,
                     options: LocalOptions | None = None) -> "LocalSession":
        """The loaded main model and its KV cache with `spec`'s drafter: only a new draft model is
        loaded (none for lookup, the n-gram cache or plain decoding, which are instant). This
        session is left as it was, so a failed or cancelled draft load keeps it running."""
        from app.engine.drafting.factory import make_drafter
        from app.engine.pair_loader import ngram_params

        started = time.monotonic()
        old = self.pair
        draft = check = None
        if spec.draft_path is not None:
            if (spec.draft_path, spec.n_gpu_layers_draft) == (old.spec.draft_path, old.spec.n_gpu_layers_draft):
                draft, check = old.draft, old.check
            else:  # checked against the loaded main model's header first
                draft, check = load_draft_for(old.main, spec, part_progress(progress, "draft model", 0.0, 1.0), cancel)
        if progress is not None:
            progress("ready", 1.0)
        self.save_learned()  # what the cache learned so far; the same cache object goes on learning
        options = options or self.options
        cache = old.cache if old.cache is not None else _open_cache(spec, options, old.main)
        drafter = make_drafter(old.main, spec.ngram, draft, spec.draft_ctx, cache, check=check, **ngram_params(spec))
        pair = LoadedPair(spec, old.main, draft, check, cache, drafter)
        swapped = LocalSession(pair, options, kv=self.kv)
        swapped._facts = replace(swapped.describe(), main_kept=True, swap_s=time.monotonic() - started)
        return swapped

    def beside(self) -> "LocalSession":
        """A session of its own on the same weights: its own KV caches and drafter state (a draft
        model's cache too); the n-gram cache is shared, so what it serves teaches it as well."""
        fresh_pair = replace(self.pair, drafter=self.pair.new_drafter())
        return LocalSession(fresh_pair, self.options)

    def close(self) -> None:
        """The weights go with the last reference (the window drops its session to free them)."""


def _open_cache(spec: PairSpec, options: LocalOptions, main):
    opener = _cache_opener(spec, options)
    return opener(main) if opener is not None else None


def cache_in_step(kv: KVModelLike) -> bool:
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


def local_facts(session: LocalSession) -> Facts:
    """What a loaded pair says about itself (the window names files by its library's titles)."""
    pair = session.pair
    main, draft = pair.main, pair.draft
    main_weights = weights_of(main)
    draft_weights = weights_of(draft) if draft is not None else None
    memory = main_weights.bytes + (draft_weights.bytes if draft_weights is not None else 0)
    step_s = main.backend.plain_step_s()
    return Facts(
        where=HERE, main_name=main.name, main_path=str(main.path), main_plan=main.plan.describe(),
        main_plan_reason=main.plan_reason, file_type=main.info.file_type, backend=main.backend.name, backend_reason=main.backend.reason,
        main_plain_tps=1.0 / step_s if step_s else None, main_weights=main_weights,
        draft_name=draft.name if draft is not None else None, draft_path=str(draft.path) if draft is not None else None,
        draft_plan=draft.plan.describe() if draft is not None else None, draft_weights=draft_weights,
        drafter="model" if pair.spec.draft_path is not None else pair.spec.ngram, drafter_name=pair.drafter.name,
        draft_text_level=pair.drafter.text_level, ngram_entries=len(pair.cache) if pair.cache is not None else None,
        load_s=main.load_s + (draft.load_s if draft is not None else 0.0), memory_bytes=memory,
        n_ctx=session.kv.n_ctx, n_ctx_train=main.info.context_length, n_vocab=session.kv.vocab_size,
        architecture=main.info.architecture, chat_template=bool(main.info.has_chat_template), rope_fix=main.rope_fix)


def weights_of(model) -> Weights:
    """How a loaded model (app.engine.loader.LoadedModel) holds its weights."""
    plan = model.plan
    return Weights(str(model.path), plan.dtype_name, plan.n_gpu_layers if plan.gpu is not None else 0,
                   model.weights_bytes)
