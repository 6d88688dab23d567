"""A reply from a server speaking OpenAI's API as the events our loop yields, so that the command
line, the charts and the history read one shape whichever engine ran it.

Such a server names no token ids: each streamed chunk becomes a StepEvent with its text and no
tokens (the charts count no tokens for it, as for a text-only tail), and the RunSummary marks
`tokens` unknown. Its speed is ours to measure: completion tokens (usage, else one per chunk)
over the time from the first chunk to the last. Its drafted and accepted counts are the change
of its /metrics counters over the reply (shared with whatever else the server answered
meanwhile); where it exports none they are marked unknown, never shown as zeros."""

from __future__ import annotations

import time
from typing import Any, Callable, Iterator

from app.engine.loop.events import (UNKNOWN_DRAFTS, UNKNOWN_PROMPT, UNKNOWN_STEPS, UNKNOWN_TOKENS, DoneEvent,
                                    GenerationEvent, RunSummary, StepEvent, StopReason)
from app.engine.loop.sampling import SamplingParams
from app.engine.remote.metrics import SpecCounters
from app.engine.remote.openai_client import ChatChunk, OpenAIClient

_STOPS = {"stop": StopReason.EOS, "length": StopReason.MAX_TOKENS}


def openai_sampling(sampling: SamplingParams, stop_strings: tuple[str, ...] = ()) -> dict[str, Any]:
    """OpenAI's fields for our settings: greedy is temperature 0 (top_k is no OpenAI field)."""
    fields: dict[str, Any] = {"stop": list(stop_strings)} if stop_strings else {}
    if sampling.greedy:
        return {**fields, "temperature": 0.0}
    fields.update(temperature=sampling.temperature, top_p=sampling.top_p)
    if sampling.seed is not None:
        fields["seed"] = sampling.seed
    return fields


class _Reply:
    """The chunks so far: text, timing, the server's usage."""

    def __init__(self) -> None:
        self.started = self.last_at = time.monotonic()
        self.first_at: float | None = None
        self.texts: list[str] = []
        self.n_chunks = 0
        self.finish: str | None = None
        self.prompt_tokens: int | None = None
        self.completion_tokens: int | None = None

    def take(self, chunk: ChatChunk) -> StepEvent | None:
        self.finish = chunk.finish_reason or self.finish
        self.prompt_tokens = chunk.prompt_tokens if chunk.prompt_tokens is not None else self.prompt_tokens
        if chunk.completion_tokens is not None:
            self.completion_tokens = chunk.completion_tokens
        if not chunk.text:
            return None
        now = time.monotonic()
        self.first_at = self.first_at or now
        self.texts.append(chunk.text)
        self.n_chunks += 1
        event = StepEvent((), (), chunk.text, 0, 0, 0, 0.0, now - self.last_at, now, n_unnamed=1)
        self.last_at = now
        return event


def generate_on_openai(client: OpenAIClient, model: str, max_new_tokens: int, sampling: SamplingParams,
                       drafter: str, messages: list[dict[str, str]] | None = None, prompt: str | None = None,
                       stop_strings: tuple[str, ...] = (),
                       cancelled: Callable[[], bool] | None = None) -> Iterator[GenerationEvent]:
    """StepEvents as the server streams its reply, then the DoneEvent with its RunSummary."""
    before = client.spec_counters()
    reply = _Reply()
    for chunk in client.stream(model, max_new_tokens, openai_sampling(sampling, stop_strings), messages, prompt,
                               cancelled):
        event = reply.take(chunk)
        if event is not None:
            yield event
    after = client.spec_counters() if before is not None else None
    counts = after.since(before) if after is not None and before is not None else None
    yield DoneEvent(_summary(reply, drafter, counts))


def _summary(reply: _Reply, drafter: str, counts: SpecCounters | None) -> RunSummary:
    now = time.monotonic()
    first_at = reply.first_at or now
    stop = StopReason.CANCELLED if reply.finish is None else _STOPS.get(reply.finish, StopReason.EOS)
    n_predicted = reply.completion_tokens if reply.completion_tokens is not None else reply.n_chunks
    n_prompt = reply.prompt_tokens or 0
    unknown = UNKNOWN_TOKENS + (UNKNOWN_PROMPT if reply.prompt_tokens is None else ())
    if counts is None:
        unknown += UNKNOWN_DRAFTS
    elif counts.drafts is None:
        unknown += UNKNOWN_STEPS
    n_steps = counts.drafts if counts is not None and counts.drafts is not None else 0
    accepted_at = counts.accepted_per_pos if counts is not None and counts.drafts is not None else ()
    return RunSummary(
        text="".join(reply.texts), tokens=(), stop_reason=stop, drafter=drafter, n_prompt=n_prompt,
        n_prompt_evaluated=n_prompt, prompt_s=first_at - reply.started, n_predicted=n_predicted,
        decode_s=reply.last_at - first_at if reply.first_at else 0.0, ttft_s=first_at - reply.started,
        n_steps=n_steps, n_drafted=counts.draft_tokens if counts else 0, n_accepted=counts.accepted if counts else 0,
        # the servers rate position i as its accepted count over the steps (vLLM's and llama-server's own rule)
        accepted_by_position=accepted_at, drafted_by_position=(n_steps,) * len(accepted_at),
        unknown=tuple(dict.fromkeys(unknown)))
