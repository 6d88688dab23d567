"""The speculative decoding loop: draft, verify in one main-model forward, accept, roll back.

Generation is an iterator of immutable events (StepEvent per verify step, then one DoneEvent),
cancellable between steps. With temperature 0 the output equals plain greedy decoding of the main
model token for token; with sampling its distribution equals the main model's (see sampling.py).
"""

from __future__ import annotations

import math
import time

import numpy as np
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence


from app.engine.loop.detok import IncrementalDetokenizer
from app.engine.drafting.drafters import Draft, Drafter, NoDrafter
from app.engine.errors import ContextFullError, SpeculaError
from app.engine.loop.events import DoneEvent, GenerationEvent, Origin, RunSummary, StepEvent, StopReason
from app.engine.seam import KVModelLike as KVModel, common_prefix_length, first_argmax
from app.engine.loop.sampling import (
    AcceptRule,
    Generator,
    RowProbs,
    SamplingParams,
    check_sampling,
    logits_to_probs,
    make_generator,
    sample,
    speculative_accept,
)
from app.engine.loop.schedule import AdaptiveDraftLength, FixedDraftLength
from app.engine.drafting.kinds import DEFAULT_DRAFT_MAX
from app.engine.loop.stops import StopMatcher


@dataclass(frozen=True)
class DecodeSettings:
    """Defaults follow llama.cpp's speculative example (draft min 0, p-min 0.75); the draft max is
    a ceiling of the adaptive length (DEFAULT_DRAFT_MAX), where llama.cpp's is a fixed length."""

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


CancelCheck = Callable[[], bool]


def make_settings(
    *,
    max_new_tokens: int,
    temperature: float,
    top_k: int,
    top_p: float,
    min_p: float,
    seed: int,
    draft_max: int,
    draft_min: int,
    draft_p_min: float,
    adaptive_draft: bool = True,
) -> DecodeSettings:
    """DecodeSettings from the values a user sets (seed < 0: random), as the command line, the
    window and the server take them; one-line errors for values the engine cannot use."""
    if max_new_tokens < 1:
        raise SpeculaError("the number of tokens to generate must be at least 1")
    if draft_max < 1:
        raise SpeculaError("draft max must be at least 1")
    if not (math.isfinite(draft_p_min) and 0.0 <= draft_p_min <= 1.0):
        raise SpeculaError(f"draft p-min must be a finite number between 0 and 1 (got {draft_p_min})")
    sampling = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                              seed=None if seed < 0 else seed)
    check_sampling(sampling)
    return DecodeSettings(max_new_tokens=max_new_tokens, draft_max=draft_max, draft_min=draft_min,
                          draft_p_min=draft_p_min, sampling=sampling, adaptive_draft=adaptive_draft)


class _Counters:
    """Running totals for the summary (llama.cpp's names)."""

    def __init__(self) -> None:
        self.n_steps = self.n_drafted = self.n_accepted = 0
        self.drafted_at: list[int] = []
        self.accepted_at: list[int] = []

    def add(self, n_drafted: int, n_accepted: int) -> None:
        if n_drafted == 0:
            return
        self.n_steps += 1
        self.n_drafted += n_drafted
        self.n_accepted += n_accepted
        while len(self.drafted_at) < n_drafted:
            self.drafted_at.append(0)
            self.accepted_at.append(0)
        for i in range(n_drafted):
            self.drafted_at[i] += 1
            self.accepted_at[i] += int(i < n_accepted)


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
    cancel: CancelCheck | None = None,
    accept_rule: AcceptRule = speculative_accept,
) -> Iterator[GenerationEvent]:
    """Generate a reply to prompt_ids, yielding a StepEvent per step and a final DoneEvent."""
    if not prompt_ids:
        raise ValueError("the prompt is empty")
    if len(prompt_ids) >= main.n_ctx:
        raise ContextFullError(
            f"the prompt has {len(prompt_ids)} tokens but the context holds {main.n_ctx}; "
            "shorten it or raise -c"
        )
    drafter = drafter or NoDrafter()
    sampling = settings.sampling
    drafter.configure(sampling, settings.draft_p_min)
    gen = make_generator(sampling.seed)
    stop_ids = set(settings.stop_token_ids if settings.stop_token_ids is not None else _eos_ids(tokenizer))
    detok = IncrementalDetokenizer(tokenizer, prompt_ids)
    stops = StopMatcher(settings.stop_strings)
    counters = _Counters()
    # Plain decoding asks no schedule: pricing 64 draft lengths a step cost it 4% of SmolLM2's step.
    schedule = (FixedDraftLength(0) if isinstance(drafter, NoDrafter) else
                AdaptiveDraftLength(settings.draft_max, getattr(main, "step_cost", None), drafter.token_cost_s())
                if settings.adaptive_draft else FixedDraftLength(settings.draft_max))

    t_start = time.monotonic()
    n_reused = min(common_prefix_length(main.ids, prompt_ids), len(prompt_ids) - 1)
    logits = main.sync(prompt_ids)
    token = _first_token(logits, sampling, gen)
    t_first = time.monotonic()

    context = list(prompt_ids)
    generated: list[int] = []
    reason: StopReason | None = None
    new_tokens, origins = [token], [Origin.MAIN]
    draft_s = 0.0
    verify_s = t_first - t_start
    n_drafted = n_accepted = 0
    while True:
        # Cut the step's tokens at a stop token or the token budget.
        for i, tok in enumerate(new_tokens):
            if tok in stop_ids:
                new_tokens, origins, reason = new_tokens[:i], origins[:i], StopReason.EOS
                break
        kept, text, draft_chars, hit = _decode_step(new_tokens, origins, detok, stops)
        new_tokens, origins = new_tokens[:kept], origins[:kept]
        generated.extend(new_tokens)
        context.extend(new_tokens)
        if hit:
            reason = StopReason.STOP_STRING
        elif reason is None and len(generated) >= settings.max_new_tokens:
            reason = StopReason.MAX_TOKENS
        elif reason is None and len(context) >= main.n_ctx:
            reason = StopReason.CONTEXT_FULL
        if reason is not None and not hit:
            text += stops.flush(detok.flush())
        yield StepEvent(
            tokens=tuple(new_tokens),
            origins=tuple(origins),
            text=text,
            draft_chars=draft_chars,
            n_drafted=n_drafted,
            n_accepted=n_accepted,
            draft_s=draft_s,
            verify_s=verify_s,
            timestamp=time.monotonic(),
        )
        if reason is not None:
            break
        if cancel is not None and cancel():
            reason = StopReason.CANCELLED
            tail = stops.flush(detok.flush())
            if tail:  # text held back for a possible stop string or a partial character
                yield StepEvent((), (), tail, 0, 0, 0, 0.0, 0.0, time.monotonic())
            break

        budget = schedule.length(min(
            settings.max_new_tokens - len(generated) - 1,
            main.n_ctx - len(context) - 1,
        ), confident=lambda: drafter.confident(context), catch_up=lambda: drafter.catch_up_s(context))
        t0 = time.monotonic()
        draft = drafter.propose(context, budget) if budget >= max(1, settings.draft_min) else Draft()
        if len(draft) < settings.draft_min or len(draft) > max(budget, 0):
            draft = Draft()
        t1 = time.monotonic()
        # The last context token is not in the main cache yet: it is fed with the draft.
        main.rewind(len(context) - 1)
        n_accepted, token = verify(main, context[-1], draft, sampling, gen, accept_rule)
        t2 = time.monotonic()
        drafter.accept(n_accepted)
        schedule.update(len(draft), n_accepted, t2 - t0, n_asked=budget if budget >= max(1, settings.draft_min) else 0,
                        draft_s=t1 - t0)
        counters.add(len(draft), n_accepted)
        n_drafted = len(draft)
        new_tokens = [*draft.tokens[:n_accepted], token]
        origins = [Origin.DRAFT] * n_accepted + [Origin.MAIN]
        draft_s, verify_s = t1 - t0, t2 - t1

    t_end = time.monotonic()
    drafter.finish(context)
    summary = RunSummary(
        text=stops.text,
        tokens=tuple(generated),
        stop_reason=reason,
        drafter=drafter.name,
        n_prompt=len(prompt_ids),
        n_prompt_evaluated=len(prompt_ids) - n_reused,
        prompt_s=t_first - t_start,
        n_predicted=len(generated),
        decode_s=t_end - t_first,
        ttft_s=t_first - t_start,
        n_steps=counters.n_steps,
        n_drafted=counters.n_drafted,
        n_accepted=counters.n_accepted,
        accepted_by_position=tuple(counters.accepted_at),
        drafted_by_position=tuple(counters.drafted_at),
        schedule_note=(schedule.declined_note() if isinstance(schedule, AdaptiveDraftLength)
                       and not isinstance(drafter, NoDrafter) else None),
    )
    yield DoneEvent(summary)


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


def _eos_ids(tokenizer) -> list[int]:
    value = getattr(tokenizer, "eos_token_id", None)
    if isinstance(value, int):
        return [value]
    return [int(v) for v in value or ()]
