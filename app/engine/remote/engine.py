"""A reply from a server speaking OpenAI's API as the events our loop yields, so that the command
line, the charts and the history read one shape whichever engine ran it.

Such a server names no token ids: each streamed chunk becomes a StepEvent with its text and no
tokens (the charts count no tokens for it, as for a text-only tail), and the RunSummary marks
`tokens` unknown. Its speed is ours to measure: completion tokens (usage, else one per chunk)
over the time from the first chunk to the last. Its drafted and accepted counts are the change
of its /metrics counters over the reply (shared with whatever else the server answered
meanwhile); where it exports none they are marked unknown, never shown as zeros.

The reply's length is enforced here too, not left to the server: one that streams past
max_new_tokens (or forever) is stopped there, its connection closed, as a "limit" stop."""

from __future__ import annotations

import logging
import time
from contextlib import closing
from typing import Any, Callable, Iterator

from app.engine.events import (UNKNOWN_DRAFTS, UNKNOWN_PROMPT, UNKNOWN_STEPS, UNKNOWN_TOKENS, DoneEvent,
                                    GenerationEvent, RunSummary, StepEvent, StopReason)
from app.engine.loop.sampling import SamplingParams
from app.engine.remote.metrics import SpecCounters
from app.engine.remote.openai_client import ChatChunk, OpenAIClient

log = logging.getLogger(__name__)

_STOPS = {"stop": StopReason.EOS, "length": StopReason.MAX_TOKENS}
# A token's text is a few characters; the longest in the vocabularies we know run to 128.
MAX_CHARS_PER_TOKEN = 256
MAX_REPLY_CHARS = 64 * 1024 * 1024
TRAILING_CHUNKS = 16  # after the last token: its finish reason, usage, timings


class ReplyBounds:
    """What a streamed reply of at most `max_new_tokens` tokens may bring, counted on our side:
    its tokens, its text (MAX_CHARS_PER_TOKEN a token) and its chunks (two a token, and a few:
    a role, a finish, usage; so that chunks with nothing in them cannot go on forever either).
    Past the last token only TRAILING_CHUNKS more are read."""

    def __init__(self, max_new_tokens: int) -> None:
        self.max_tokens = max_new_tokens
        self.max_chars = min(MAX_CHARS_PER_TOKEN * max_new_tokens + 4096, MAX_REPLY_CHARS)
        self.max_chunks = 2 * max_new_tokens + 64
        self.chunks = self.chars = self.trailing = 0

    def over(self, n_tokens: int, text: str) -> bool:
        """True where a chunk that brings the reply to `n_tokens` tokens, with `text`, goes past
        the bounds: the reply ends before it."""
        self.chunks += 1
        self.chars += len(text)
        if n_tokens > self.max_tokens or self.chars > self.max_chars or self.chunks > self.max_chunks:
            return True
        if n_tokens >= self.max_tokens:
            self.trailing += 1
            return self.trailing > TRAILING_CHUNKS
        return False

    def warn(self, where: str) -> None:
        log.warning("%s streamed past %d tokens (%d chunks, %d characters): stopped reading there",
                    where, self.max_tokens, self.chunks, self.chars)


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
    bounds = ReplyBounds(max_new_tokens)
    with closing(client.stream(model, max_new_tokens, openai_sampling(sampling, stop_strings), messages, prompt,
                               cancelled)) as chunks:  # closing: leaving early closes the connection now
        for chunk in chunks:
            if bounds.over(_tokens_with(reply, chunk), chunk.text):
                bounds.warn(client.shown_url)
                reply.finish = reply.finish or "length"  # a limit stop, not a cancel
                break
            event = reply.take(chunk)
            if event is not None:
                yield event
    after = client.spec_counters() if before is not None else None
    counts = after.since(before) if after is not None and before is not None else None
    yield DoneEvent(_summary(reply, drafter, counts))


def _tokens_with(reply: _Reply, chunk: ChatChunk) -> int:
    """The reply's tokens once `chunk` is in: the server's usage where it says, else a chunk of
    text a token (a chunk may hold more: then the server's usage is what stops it)."""
    n_chunks = reply.n_chunks + (1 if chunk.text else 0)
    return max(n_chunks, chunk.completion_tokens or 0, reply.completion_tokens or 0)


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
