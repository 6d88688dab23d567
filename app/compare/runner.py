"""Run a comparison headless: one main model, several drafters, one prompt set.

The main model is loaded once; draft models are loaded one at a time and freed before the next.
"none" runs first, so every later result can say at once whether its output equals the
baseline's. With RunSettings.repeats > 1 the whole round (every configuration on every prompt)
runs again, round after round, so a slow spell of the machine falls on every configuration alike
and the rounds' spread says what is noise. Every configuration gets the same settings and seed,
and a fresh KV cache per prompt (a cache warmed by the previous configuration would flatter the next one's time to first token).
Each drafter is warmed up on a short reply before it is timed: the first forward of each input
shape is slow.

After each finished prompt the runner publishes a new CompareRun snapshot (on_update) and writes
it to `save_to` atomically, so a cancel (checked between decoding steps) keeps every finished
result; the prompt in flight is dropped.
"""

from __future__ import annotations

import gc
import logging
import sys
from dataclasses import replace
from pathlib import Path
from typing import Callable


from app.compare.choices import plan_configs
from app.compare.memory import PeakRss
from app.compare.results import (
    CANCELLED, COMPLETE, ENGINE_KINDS, FAILED, LLAMA_SERVER, MODEL, NONE, SERVER_URL, CompareRequest, CompareRun, ConfigSpec, MainFacts,
    Progress, PromptResult, save_run,
)
from app.engine.loop.chat import format_stops, render_prompt
from app.engine.errors import ContextFullError, LoadCancelled, SpeculaError
from app.engine.events import DoneEvent, StepEvent, StopReason
from app.engine.drafting.compat import DraftCheck
from app.engine.gguf.info import GGUFInfo
from app.engine.loader import LoadedModel
from app.engine.drafting.factory import make_drafter, open_cache
from app.engine.pair_loader import Headers, PairSpec, check_spec, load_draft_for, load_main
from app.engine.loop.speculative import DecodeSettings
from app.engine.reply_engine import open_session, session_on
from app.engine.session import Prompt, ServerSpec
from app.hub.display import display_name

log = logging.getLogger(__name__)

WARMUP_TOKENS = 8
OnProgress = Callable[[Progress], None]
OnUpdate = Callable[[CompareRun], None]
Cancel = Callable[[], bool]


class _Cancelled(Exception):
    pass


class Runner:
    """One comparison. `run()` returns the final snapshot (status complete or cancelled)."""

    def __init__(self, request: CompareRequest, on_progress: OnProgress | None = None,
                 on_update: OnUpdate | None = None, cancel: Cancel | None = None,
                 save_to=None, main: LoadedModel | None = None) -> None:
        self.request = request
        self.on_progress = on_progress or (lambda progress: None)
        self.on_update = on_update or (lambda run: None)
        self.cancelled = cancel or (lambda: False)
        self.save_to = save_to
        self.main = main
        self.configs = plan_configs(list(request.drafts), request.settings.draft_sweep)
        self.repeats = max(request.settings.repeats, 1)
        self.total = len(self.configs) * len(request.prompts) * self.repeats
        self.run_state: CompareRun | None = None
        self.baseline: dict[int, tuple[int, ...]] = {}
        self.baseline_text: dict[int, str] = {}
        self._ngram_drafters: dict[tuple[str, int], object] = {}  # (config name, round) -> its n-gram drafter
        self._headers: dict[str, Headers] = {}  # draft file -> its header and check, read once before any load
        self._main_info: GGUFInfo | None = None  # the main header, read by _check_drafts
        self._check: DraftCheck | None = None  # the loaded draft model's, carried to each of its drafters

    # --- the whole run ------------------------------------------------------------------------

    def run(self) -> CompareRun:
        if not self.request.prompts:
            raise SpeculaError("no prompt to run")
        self._check_drafts()
        main = self.main or self._load_main()
        self.run_state = CompareRun(
            main=MainFacts(display_name(main.path, main.info.file_type), str(main.path), main.plan.describe(), main.plan.dtype_name, main.load_s),
            settings=self.request.settings, configs=tuple(self.configs), prompts=tuple(self.request.prompts),
            machine=_machine(main),
        )
        try:
            ids = [self._prompt_ids(main, p.text, i) for i, p in enumerate(self.request.prompts)]
            self._publish()
            with PeakRss() as peak:
                for repeat in range(self.repeats):
                    for group in _groups(self.configs):
                        self._run_group(main, group, ids, peak, repeat)
            status = COMPLETE
        except (_Cancelled, LoadCancelled):
            status = CANCELLED
        except BaseException:
            self.run_state = replace(self.run_state, status=FAILED)
            self._publish()
            raise
        self.run_state = replace(self.run_state, status=status)
        self._publish()
        self._progress(status)
        return self.run_state

    def _spec(self, draft_path: str | None = None) -> PairSpec:
        """The main model and one draft file (drafters are made per reply) as the engine's spec."""
        r = self.request
        return PairSpec(r.main_path, draft_path, draft_ctx=r.ctx_size or None, device=r.device, dtype=r.dtype,
                        n_gpu_layers=r.n_gpu_layers, n_gpu_layers_draft=r.n_gpu_layers_draft, backend=r.backend)

    def _check_drafts(self) -> None:
        """Refuse a bad main file, and a draft of another vocabulary, on headers before
        loading anything (the main header, read here, is not read again by its load)."""
        self._main_info = None if self.main is not None else check_spec(self._spec()).main
        for draft in self.request.drafts:
            if draft.kind == MODEL:
                self._headers[draft.path] = check_spec(self._spec(draft.path))

    def _load_main(self) -> LoadedModel:
        return load_main(self._spec(), cancel=self.cancelled, info=self._main_info,
                         progress=lambda stage, fraction: self._progress(f"main model: {stage} {fraction:.0%}"))

    def _prompt_ids(self, main: LoadedModel, text: str, index: int) -> list[int]:
        ids = render_prompt(main.tokenizer, [{"role": "user", "content": text}])
        n_ctx = main.kv_model(self._n_ctx()).n_ctx
        if len(ids) + min(self.request.settings.gen.max_tokens, 16) >= n_ctx:
            raise ContextFullError(f"prompt {index + 1} has {len(ids)} tokens: it does not fit the "
                                   f"context of {n_ctx} with a reply (shorten it or raise -c)")
        return ids

    # --- one drafter (a draft model is loaded for its group and freed after it) ---------------

    def _run_group(self, main: LoadedModel, group: list[ConfigSpec], ids: list[list[int]], peak: PeakRss,
                   repeat: int = 0) -> None:
        self._check_cancel()
        first = group[0]
        if any(e.config == first.name for e in self.run_state.errors):
            return  # its draft failed to load in an earlier round: said once is enough
        if first.drafter in ENGINE_KINDS:
            self._run_server_group(main, group, ids, repeat)
            return
        draft = None
        if first.drafter == MODEL:
            try:
                draft, self._check = self._load_draft(main, first)
            except LoadCancelled:
                raise
            except SpeculaError as exc:  # keep going with the other drafters
                for config in group:
                    self.run_state = self.run_state.with_error(config.name, str(exc).splitlines()[0])
                self._publish()
                return
        try:
            self._warm_up(main, draft, first, ids[0], repeat)
            round_text = f", run {repeat + 1}/{self.repeats}" if self.repeats > 1 else ""
            for config in group:
                for index, prompt_ids in enumerate(ids):
                    self._check_cancel()
                    self._progress(f"{config.name} · {self.request.prompts[index].category} "
                                   f"({index + 1}/{len(ids)}{round_text})")
                    peak.reset()
                    result = self._run_prompt(main, draft, config, index, prompt_ids, peak, repeat)
                    self.run_state = self.run_state.with_result(result)
                    self._publish()
        finally:
            del draft
            _free_memory()

    def _run_server_group(self, main: LoadedModel, group: list[ConfigSpec], ids: list[list[int]],
                          repeat: int) -> None:
        """llama-server (started for this round, stopped after it) or a server at a URL: the same
        prompts, warm-up and settings; a server that fails is one error line for its row."""
        config = group[0]
        self._progress(f"starting {config.label}")
        session = None
        try:
            session = open_session(server_spec(self.request, config), cancel=self.cancelled)
            row_prompts = [self._row_prompt(session, config, ours, self.request.prompts[i].text)
                           for i, ours in enumerate(ids)]
            self._progress(f"warming up {config.name}")
            self._consume(self._server_reply(main, session, config, row_prompts[0], WARMUP_TOKENS))
            round_text = f", run {repeat + 1}/{self.repeats}" if self.repeats > 1 else ""
            for index, prompt in enumerate(row_prompts):
                self._check_cancel()
                self._progress(f"{config.name} · {self.request.prompts[index].category} "
                               f"({index + 1}/{len(ids)}{round_text})")
                events = self._server_reply(main, session, config, prompt, self.request.settings.gen.max_tokens)
                result = self._result(config, index, *self._consume(events), None, repeat)
                self.run_state = self.run_state.with_result(result)
                self._publish()
        except LoadCancelled:
            raise
        except SpeculaError as exc:  # keep going with the other rows
            self.run_state = self.run_state.with_error(config.name, str(exc).splitlines()[0])
            self._publish()
        finally:
            if session is not None:
                session.close()

    def _server_reply(self, main: LoadedModel, session, config: ConfigSpec, prompt: Prompt, n_predict: int):
        settings = replace(self._settings(main, config), max_new_tokens=n_predict)
        return session.reply(prompt, settings, self.cancelled)

    @staticmethod
    def _row_prompt(session, config: ConfigSpec, ours: list[int], text: str) -> Prompt:
        """Our ids for llama-server on our file; for a server at a URL the prompt as it reads it
        (its own ids, or the chat for one speaking only OpenAI's API: its model may differ)."""
        if config.drafter == LLAMA_SERVER:
            return Prompt.of_ids(ours)
        return session.tokenize(Prompt.chat([{"role": "user", "content": text}]))[0]

    def _load_draft(self, main: LoadedModel, config: ConfigSpec) -> tuple[LoadedModel, DraftCheck]:
        """The configuration's draft model and its check (made on headers before the run, against
        the request's main file; a main model handed in from another file is checked again)."""
        same_main = Path(main.path) == Path(self.request.main_path)
        return load_draft_for(
            main, self._spec(config.draft_path), cancel=self.cancelled,
            headers=self._headers.get(config.draft_path) if same_main else None,
            progress=lambda stage, fraction: self._progress(f"draft {config.label}: {stage} {fraction:.0%}"),
        )

    def _warm_up(self, main: LoadedModel, draft: LoadedModel | None, config: ConfigSpec, ids: list[int],
                 repeat: int = 0) -> None:
        self._progress(f"warming up {config.name}")
        settings = replace(self._settings(main, config), max_new_tokens=WARMUP_TOKENS)
        session = session_on(main, self._drafter(main, draft, config, repeat, warm_up=True), self._n_ctx())
        for _ in session.reply(Prompt.of_ids(ids), settings, self.cancelled):
            pass
        self._check_cancel()

    # --- one prompt ---------------------------------------------------------------------------

    def _run_prompt(self, main: LoadedModel, draft: LoadedModel | None, config: ConfigSpec, index: int,
                    ids: list[int], peak: PeakRss, repeat: int = 0) -> PromptResult:
        cuda = _torch_cuda(main)
        if cuda is not None:
            cuda.reset_cuda_peak()
        session = session_on(main, self._drafter(main, draft, config, repeat), self._n_ctx())
        events = session.reply(Prompt.of_ids(ids), self._settings(main, config), self.cancelled)
        summary, timeline = self._consume(events)
        result = self._result(config, index, summary, timeline, peak.value, repeat)
        return replace(result, peak_gpu_bytes=cuda.cuda_peak_bytes() if cuda is not None else None)

    def _consume(self, events) -> tuple:
        """(summary, timeline) of a reply's events: tokens so far against seconds since the first."""
        timeline: list[tuple[int, float]] = []
        first_at = None
        n_so_far = 0
        summary = None
        for event in events:
            if isinstance(event, StepEvent) and event.n_tokens:
                first_at = event.timestamp if first_at is None else first_at
                n_so_far += event.n_tokens
                timeline.append((n_so_far, event.timestamp - first_at))
            elif isinstance(event, DoneEvent):
                summary = event.summary
        if summary is None or summary.stop_reason is StopReason.CANCELLED:
            raise _Cancelled()
        return summary, timeline

    def _result(self, config: ConfigSpec, index: int, summary, timeline, peak_rss: int | None,
                repeat: int) -> PromptResult:
        tokens = tuple(summary.tokens)
        if config.drafter == NONE:
            self.baseline[index], self.baseline_text[index] = tokens, summary.text
        same = _same_reply(config, tokens, summary.text, self.baseline.get(index), self.baseline_text.get(index))
        return PromptResult(
            config=config.name, prompt_index=index, category=self.request.prompts[index].category,
            summary=replace(summary, tokens=tokens), timeline=tuple(timeline), peak_rss_bytes=peak_rss,
            identical=same if self.request.settings.greedy else None, repeat=repeat,
        )

    def _n_ctx(self) -> int | None:
        return self.request.ctx_size or None

    def _drafter(self, main: LoadedModel, draft: LoadedModel | None, config: ConfigSpec, repeat: int = 0,
                 warm_up: bool = False):
        """A fresh drafter per reply: a draft model's cache must not carry over between prompts.
        An n-gram drafter's learning does, on purpose, as in the chat: each configuration's own
        n-gram cache and ngram-mod pool (the session takes a fresh() drafter per reply, sharing
        them), empty at the start of each round, learning from each of its replies in turn (never
        from another configuration's, nor from an earlier round's: that one has seen these very
        replies and would flatter it)."""
        if config.drafter == MODEL:
            return make_drafter(main, draft=draft, draft_ctx=self.request.ctx_size or None, check=self._check)
        if warm_up:  # learning of its own: the warm-up reply is the first prompt's, it must not teach it
            return make_drafter(main, config.drafter, cache=open_cache(main, None))
        key = (config.name, repeat)
        if key not in self._ngram_drafters:
            self._ngram_drafters = {k: v for k, v in self._ngram_drafters.items() if k[1] == repeat}
            self._ngram_drafters[key] = make_drafter(main, config.drafter, cache=open_cache(main, None))
        return self._ngram_drafters[key]

    def _settings(self, main: LoadedModel, config: ConfigSpec) -> DecodeSettings:
        s = self.request.settings
        gen = replace(s.gen, draft_max=config.draft_max, adaptive_draft=config.adaptive)  # the row's length
        # A base model without a template stops where chat would (the next "User:" turn).
        return gen.decode_settings(  # the one check the CLI, the window and the server use
            stop_strings=() if s.ignore_eos else format_stops(main.tokenizer),
            stop_token_ids=() if s.ignore_eos else None)

    # --- reporting ----------------------------------------------------------------------------

    def _progress(self, stage: str) -> None:
        done = len(self.run_state.results) if self.run_state is not None else 0
        self.on_progress(Progress(done, self.total, stage))

    def _publish(self) -> None:
        if self.save_to is not None:
            save_run(self.run_state, self.save_to)
        self.on_update(self.run_state)

    def _check_cancel(self) -> None:
        if self.cancelled():
            raise _Cancelled()


def _same_reply(config: ConfigSpec, tokens: tuple[int, ...], text: str, baseline: tuple[int, ...] | None,
               baseline_text: str | None) -> bool | None:
    """Whether a row's reply is plain decoding's: by tokens; by text on llama-server (its stream
    names a token held back inside a UTF-8 character only with the next one's chunk, and never
    sends a character the reply's limit cut in two, which our text shows as U+FFFD); not known for
    a server at a URL (its model may be another) nor for the baseline itself."""
    if config.drafter in (NONE, SERVER_URL) or baseline is None:
        return None
    if config.drafter == LLAMA_SERVER:
        return text.rstrip("\ufffd") == (baseline_text or "").rstrip("\ufffd")
    return tokens == baseline


def _groups(configs: list[ConfigSpec]) -> list[list[ConfigSpec]]:
    """Configurations that share a drafter (a sweep's lengths): one draft load for them all."""
    groups: dict[tuple, list[ConfigSpec]] = {}
    for config in configs:
        groups.setdefault((config.drafter, config.draft_path, config.server_types, config.server_url), []).append(config)
    return list(groups.values())


def _torch_cuda(main: LoadedModel):
    """The torch backend's CUDA helpers where the main model runs there, else None: a
    comparison on llama.cpp never imports torch."""
    if main.plan.gpu != "cuda":
        return None
    from app.engine.backends.torch import device as torch_device

    return torch_device


def _free_memory() -> None:
    gc.collect()
    if "torch" in sys.modules:  # only where a torch model ran
        from app.engine.backends.torch import device as torch_device

        torch_device.release_cuda_cache()


def _machine(main: LoadedModel) -> str:
    """What ran the comparison, as the plan line says it (llama.cpp or torch, device, threads)."""
    return main.plan.describe()


def server_spec(request: CompareRequest, config: ConfigSpec) -> ServerSpec:
    """The engine a server row runs on: llama-server started for one round with llama.cpp's own
    --spec-type list (a fresh server per round: its ngram-mod pool learns across requests, as our
    n-gram cache does within a round), or the server at the row's URL."""
    from app.engine.llama_server.spec import ServerEngine

    if config.drafter == LLAMA_SERVER:
        types = tuple(t for t in config.server_types.split(",") if t)
        draft = Path(config.draft_path) if config.draft_path else None
        engine = ServerEngine(spec_types=types, draft=draft, ctx_size=request.ctx_size, rpc=request.rpc,
                              n_gpu_layers=request.n_gpu_layers, n_gpu_layers_draft=request.n_gpu_layers_draft)
        return ServerSpec(engine, Path(request.main_path))
    return ServerSpec(ServerEngine(url=config.server_url, api_key=request.api_key), check=False)
