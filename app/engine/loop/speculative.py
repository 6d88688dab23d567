"""The speculative decoding loop: draft, verify in one main-model forward, accept, roll back.

Generation is an iterator of immutable events (StepEvent per verify step, then one DoneEvent),
cancellable between steps. With temperature 0 the output equals plain greedy decoding of the main
model token for token; with sampling its distribution equals the main model's (see sampling.py).
"""

from __future__ import annotations

import time

import numpy as np
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence


from app.engine.loop.detok import IncrementalDetokenizer
from app.engine.errors import Cancel, ContextFullError
from app.engine.events import DoneEvent, GenerationEvent, Origin, RunSummary, StepCounters, StepEvent, StopReason
from app.engine.seam import DEFAULT_DRAFT_MAX, Draft, Drafter, KVModelLike as KVModel, NoDrafter, common_prefix_length, first_argmax
from app.engine.loop.sampling import (
    AcceptRule,
    Generator,
    RowProbs,
    SamplingParams,
    logits_to_probs,
    make_generator,
    sample,
    speculative_accept,
)
from app.engine.loop.schedule import AdaptiveDraftLength, DraftSchedule, FixedDraftLength, SplitSchedule
from app.engine.loop.explain import Prices, schedule_prices
from app.engine.loop.stops import StopMatcher


@dataclass(frozen=True)
class DecodeSettings:
    """What one generation runs with. What a user sets becomes this through
    app.engine.settings.GenSettings.decode_settings (checked there). Defaults follow llama.cpp's
    speculative example (draft min 0, p-min 0.75); the draft max is a ceiling of the adaptive
    length (DEFAULT_DRAFT_MAX), where llama.cpp's is a fixed length."""

    max_new_tokens: int = 256
    draft_max: int = DEFAULT_DRAFT_MAX
    draft_min: int = 0
    draft_p_min: float = 0.75
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop_strings: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] | None = None  # None: the tokenizer's EOS
    # Adapt the draft length to measured acceptance and cost (draft_max is then the ceiling);
    # False drafts up to draft_max at every step, as llama.cpp does.
    adaptive_draft: bool = True




def _first_token(logits, sampling: SamplingParams, gen: Generator) -> int:
    if sampling.greedy:
        return first_argmax(logits)
    return sample(logits_to_probs(np.asarray(logits)[None], sampling)[0], gen)


def verify(
    main: KVModel,
    pending: int,
    draft: Draft,
    sampling: SamplingParams,
    gen: Generator,
    accept_rule: AcceptRule = speculative_accept,
) -> tuple[int, int]:
    """One main-model forward over [pending, *draft]; returns (n accepted, next token).

    The main cache then holds the context plus the accepted draft tokens (the next token is not
    fed yet: it becomes the pending token of the following step).
    """
    n_before = len(main.ids)
    rows = main.feed_rows([pending, *draft.tokens], len(draft) + 1)
    if sampling.greedy:
        # Position by position: the rows after the first rejection need no argmax.
        n_accepted = 0
        while n_accepted < len(draft) and rows.argmax(n_accepted) == draft.tokens[n_accepted]:
            n_accepted += 1
        token = rows.argmax(n_accepted)
    else:
        p = RowProbs(rows.row, len(rows), sampling)
        n_accepted, token = accept_rule(p, draft.probs, list(draft.tokens), gen)
    main.rewind(n_before + 1 + n_accepted)
    return n_accepted, token


def generate(
    main: KVModel,
    tokenizer,
    prompt_ids: Sequence[int],
    drafter: Drafter | None = None,
    settings: DecodeSettings = DecodeSettings(),
    cancel: Cancel | None = None,
    accept_rule: AcceptRule = speculative_accept,
) -> Iterator[GenerationEvent]:
    """Generate a reply to prompt_ids, yielding a StepEvent per step and a final DoneEvent."""
    _check_prompt(main, prompt_ids)
    run = _Generation(main, tokenizer, prompt_ids, drafter or NoDrafter(), settings, accept_rule)
    step = run.first_step()
    while True:
        event, reason = run.emit(step)
        yield event
        if reason is None and cancel is not None and cancel():
            reason = StopReason.CANCELLED
            yield from run.flush_held()
        if reason is not None:
            break
        step = run.speculate()
    yield DoneEvent(run.summary(reason))


def _check_prompt(main: KVModel, prompt_ids: Sequence[int]) -> None:
    if not prompt_ids:
        raise ValueError("the prompt is empty")
    if len(prompt_ids) >= main.n_ctx:
        raise ContextFullError(
            f"the prompt has {len(prompt_ids)} tokens but the context holds {main.n_ctx}; "
            "shorten it or raise -c"
        )


@dataclass
class _Step:
    """What one verify step produced, before it is cut at a stop and shown."""

    tokens: list[int]
    origins: list[Origin]
    n_drafted: int = 0
    n_accepted: int = 0
    draft_s: float = 0.0
    verify_s: float = 0.0


def _plain(drafter: Drafter) -> bool:
    """No drafting: NoDrafter, also inside a drafter that only wraps it to learn from the reply
    (the window's n-gram cache learns from plain replies too): else the schedule asked it for
    drafts every step and said it "had nothing to propose"."""
    return isinstance(getattr(drafter, "inner", drafter), NoDrafter)


class _Generation:
    """One reply's state between steps: the context, the drafter and its schedule, the
    detokenizer and stop strings, the counters (gpt-fast's loop, with its state named)."""

    def __init__(self, main: KVModel, tokenizer, prompt_ids: Sequence[int], drafter: Drafter,
                 settings: DecodeSettings, accept_rule: AcceptRule) -> None:
        self.main, self.drafter, self.settings, self.accept_rule = main, drafter, settings, accept_rule
        self.sampling = settings.sampling
        drafter.configure(self.sampling, settings.draft_p_min)
        self.gen = make_generator(self.sampling.seed)
        self.stop_ids = set(settings.stop_token_ids if settings.stop_token_ids is not None else eos_ids(tokenizer))
        self.detok = IncrementalDetokenizer(tokenizer, prompt_ids)
        self.stops = StopMatcher(settings.stop_strings)
        self.counters = StepCounters()
        # Plain decoding asks no schedule: pricing 64 draft lengths a step cost it 4% of SmolLM2's step.
        self.prompt_ids = list(prompt_ids)
        self.context = list(prompt_ids)
        self.schedule = self._schedule(getattr(main, "step_cost", None))
        self.generated: list[int] = []
        self.stop_token: int | None = None  # the end-of-generation token that ended the reply
        self.t_start = self.t_first = time.monotonic()
        self.n_reused = 0

    def _schedule(self, curve: Callable[[int], float] | None) -> DraftSchedule:
        """Plain decoding asks no schedule (pricing 64 lengths a step cost it 4% of SmolLM2's
        step); n-gram drafters before a draft model get one schedule each (SplitSchedule)."""
        drafter, settings = self.drafter, self.settings
        if _plain(drafter) or not settings.adaptive_draft:
            return FixedDraftLength(0 if _plain(drafter) else settings.draft_max)
        model_cost = drafter.token_cost_s()
        free_draft = getattr(drafter, "free_draft", None)
        if free_draft is None or getattr(drafter, "fallback", None) is None:
            return AdaptiveDraftLength(settings.draft_max, curve, model_cost)
        context = self.context  # extended in place as the reply grows
        return SplitSchedule(AdaptiveDraftLength(settings.draft_max, curve, None),
                             AdaptiveDraftLength(settings.draft_max, curve, model_cost),
                             lambda: free_draft(context, settings.draft_max), drafter.use_free,
                             lambda: drafter.matchers_confident(context))

    def first_step(self) -> _Step:
        """The prompt read (reusing what the cache holds of it) and the first token sampled."""
        self.t_start = time.monotonic()  # the clock of prompt_s and ttft_s starts here, after the set-up
        self.n_reused = min(common_prefix_length(self.main.ids, self.prompt_ids), len(self.prompt_ids) - 1)
        token = _first_token(self.main.sync(self.prompt_ids), self.sampling, self.gen)
        self.t_first = time.monotonic()
        return _Step([token], [Origin.MAIN], verify_s=self.t_first - self.t_start)

    def emit(self, step: _Step) -> tuple[StepEvent, StopReason | None]:
        """The step's tokens cut at a stop token, a stop string, the budget or the context, added
        to the reply, as an event; and why the reply ends there (None: it goes on)."""
        reason = None
        for i, token in enumerate(step.tokens):
            if token in self.stop_ids:
                step.tokens, step.origins, reason = step.tokens[:i], step.origins[:i], StopReason.EOS
                self.stop_token = token
                break
        kept, text, draft_chars, hit = _decode_step(step.tokens, step.origins, self.detok, self.stops)
        tokens, origins = step.tokens[:kept], step.origins[:kept]
        self.generated.extend(tokens)
        self.context.extend(tokens)
        if hit:
            reason = StopReason.STOP_STRING
        elif reason is None and len(self.generated) >= self.settings.max_new_tokens:
            reason = StopReason.MAX_TOKENS
        elif reason is None and len(self.context) >= self.main.n_ctx:
            reason = StopReason.CONTEXT_FULL
        if reason is not None and not hit:
            text += self.stops.flush(self.detok.flush())
        event = StepEvent(tokens=tuple(tokens), origins=tuple(origins), text=text, draft_chars=draft_chars,
                          n_drafted=step.n_drafted, n_accepted=step.n_accepted, draft_s=step.draft_s,
                          verify_s=step.verify_s, timestamp=time.monotonic())
        return event, reason

    def flush_held(self) -> Iterator[StepEvent]:
        """Text held back for a possible stop string or a partial character, on cancel."""
        tail = self.stops.flush(self.detok.flush())
        if tail:
            yield StepEvent((), (), tail, 0, 0, 0, 0.0, 0.0, time.monotonic())

    def speculate(self) -> _Step:
        """One step: as many drafts as the schedule says pay, verified in one forward."""
        asked = self._draft_budget()
        t0 = time.monotonic()
        draft = self._propose(asked)
        t1 = time.monotonic()
        self.main.rewind(len(self.context) - 1)  # the last context token is fed with the draft
        n_accepted, token = verify(self.main, self.context[-1], draft, self.sampling, self.gen, self.accept_rule)
        t2 = time.monotonic()
        self.drafter.accept(n_accepted)
        self.schedule.update(len(draft), n_accepted, t2 - t0, n_asked=asked, draft_s=t1 - t0)
        self.counters.add(len(draft), n_accepted)
        return _Step([*draft.tokens[:n_accepted], token], [Origin.DRAFT] * n_accepted + [Origin.MAIN],
                     len(draft), n_accepted, t1 - t0, t2 - t1)

    def _draft_budget(self) -> int:
        """Drafts to ask for: the schedule's length within the reply's budget and context, 0
        where that is fewer than draft_min."""
        room = min(self.settings.max_new_tokens - len(self.generated) - 1, self.main.n_ctx - len(self.context) - 1)
        context = self.context
        length = self.schedule.length(room, confident=lambda: self.drafter.confident(context),
                                      catch_up=lambda: self.drafter.catch_up_s(context))
        return length if length >= max(1, self.settings.draft_min) else 0

    def _propose(self, asked: int) -> Draft:
        draft = self.drafter.propose(self.context, asked) if asked else Draft()
        if len(draft) < self.settings.draft_min or len(draft) > asked:
            return Draft()
        return draft

    def summary(self, reason: StopReason) -> RunSummary:
        t_end = time.monotonic()
        # A drafter that learns the reply learns where it ended too: a regenerated reply then
        # drafts its end-of-generation token with the rest, where without it the learned
        # n-grams of the reply's last words went on past it (SmolLM2's chat reply, asked
        # again, verified 17 such drafts, all rejected, in its last step).
        ended = [self.stop_token] if reason is StopReason.EOS and self.stop_token is not None else []
        self.drafter.finish(self.context + ended)
        return RunSummary(
            text=self.stops.text, tokens=tuple(self.generated), stop_reason=reason, drafter=self.drafter.name,
            n_prompt=len(self.prompt_ids), n_prompt_evaluated=len(self.prompt_ids) - self.n_reused,
            prompt_s=self.t_first - self.t_start, n_predicted=len(self.generated), decode_s=t_end - self.t_first,
            ttft_s=self.t_first - self.t_start, n_steps=self.counters.n_steps, n_drafted=self.counters.n_drafted,
            n_accepted=self.counters.n_accepted, accepted_by_position=tuple(self.counters.accepted_at),
            drafted_by_position=tuple(self.counters.drafted_at), schedule_note=self.schedule.declined_note(),
            **_priced(schedule_prices(self.schedule)),
        )


def _priced(prices: Prices | None) -> dict:
    """A summary's why-fields from the schedule's prices."""
    if prices is None:
        return {}
    return {"break_even": prices.break_even().sentence(), "step_costs": prices.step_costs,
            "draft_token_cost": prices.draft_token}


def _decode_step(tokens: list[int], origins: list[Origin], detok: IncrementalDetokenizer,
                 stops: StopMatcher) -> tuple[int, str, int, bool]:
    """Text for one step's tokens, token by token, so that a stop string ending inside the step
    keeps exactly the tokens plain decoding would have produced before stopping (accepted drafts
    after it are dropped). Returns (tokens kept, text, leading characters from drafts, hit)."""
    text, draft_raw = "", 0
    for i, (token, origin) in enumerate(zip(tokens, origins)):
        piece = detok.push([token])
        if origin is Origin.DRAFT:
            draft_raw += len(piece)
        emitted, hit = stops.push(piece)
        text += emitted
        if hit:
            return i + 1, text, min(draft_raw, len(text)), True
    return len(tokens), text, min(draft_raw, len(text)), False


def eos_ids(tokenizer) -> list[int]:
    """The model's end-of-generation ids (a reply stops at any of them)."""
    value = getattr(tokenizer, "eos_token_id", None)
    if isinstance(value, int):
        return [value]
    return [int(v) for v in value or ()]
