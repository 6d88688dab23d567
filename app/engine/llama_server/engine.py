"""A reply from llama-server as the same events our own loop yields (app.engine.events), so
that the command line, the charts and the history read one shape whichever engine ran it.

Its text is exact; its token ids may miss one where llama-server held a token back (its text
ended inside a UTF-8 character) and streamed it with the next token's chunk, which names only
that token: the counts (n_predicted) are llama-server's own.

llama-server streams one chunk per token; with timings_per_token each carries its running
drafted and accepted counts, which change on the first token of each verify step: that token and
the step's other accepted tokens (n_accepted + 1 in all, the last one the main model's own) make
one StepEvent with llama.cpp's own counts."""

from __future__ import annotations

import time
from contextlib import closing
from typing import Callable, Iterator, Sequence

from app.engine.llama_server.client import ServerClient, ServerReply, StreamChunk
from app.engine.events import DoneEvent, GenerationEvent, Origin, RunSummary, StepCounters, StepEvent, StopReason
from app.engine.loop.sampling import SamplingParams
from app.engine.remote.engine import ReplyBounds


def sampling_fields(sampling: SamplingParams, stop_strings: Sequence[str] = ()) -> dict:
    """llama-server's /completion fields for our sampling settings (greedy: top-k 1 alone)."""
    fields: dict = {"stop": list(stop_strings)}
    if sampling.greedy:
        return {**fields, "temperature": 0.0, "top_k": 1, "samplers": ["top_k"]}
    fields.update(temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p, min_p=sampling.min_p)
    if sampling.seed is not None:
        fields["seed"] = sampling.seed
    return fields


class _Step:
    """The tokens of one verify step as they arrive."""

    def __init__(self, n_drafted: int, n_accepted: int, started: float) -> None:
        self.n_drafted, self.n_accepted, self.started = n_drafted, n_accepted, started
        self.tokens: list[int] = []
        self.texts: list[str] = []

    def complete(self) -> bool:
        return len(self.tokens) >= self.n_accepted + 1

    def event(self) -> StepEvent:
        n = len(self.tokens)
        origins = tuple(Origin.DRAFT if i < min(self.n_accepted, n) else Origin.MAIN for i in range(n))
        draft_chars = sum(len(t) for t in self.texts[:min(self.n_accepted, n)])
        now = time.monotonic()
        return StepEvent(tuple(self.tokens), origins, "".join(self.texts), draft_chars, self.n_drafted,
                         self.n_accepted, 0.0, now - self.started, now)


class _Reply:
    """The reply so far, chunk by chunk, grouped into verify steps."""

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.texts: list[str] = []
        self.first_at: float | None = None
        self.n_decoded = 0  # as llama-server counts them (tokens_predicted), the end-of-generation token left out
        self.drafted = self.accepted = 0
        self.counts = StepCounters()
        self.step: _Step | None = None
        self.final: ServerReply | None = None  # the last chunk's timings, once it came
        self.limited = False  # the server streamed past max_new_tokens: stopped here, a "limit" stop

    def take(self, chunk: StreamChunk) -> Iterator[StepEvent]:
        if chunk.draft_n != self.drafted or chunk.draft_n_accepted != self.accepted:  # a verify step's first token
            yield from self.flush()
            self.step = _Step(chunk.draft_n - self.drafted, chunk.draft_n_accepted - self.accepted, time.monotonic())
            if self.step.n_drafted > 0:
                self.counts.add(self.step.n_drafted, self.step.n_accepted)
            self.drafted, self.accepted = chunk.draft_n, chunk.draft_n_accepted
        if not chunk.tokens and not chunk.text:
            return
        self.first_at = self.first_at or time.monotonic()
        self.n_decoded = max(self.n_decoded, chunk.n_decoded)
        self.tokens.extend(chunk.tokens)
        self.texts.append(chunk.text)
        self.step = self.step or _Step(0, 0, time.monotonic())
        self.step.tokens.extend(chunk.tokens)
        self.step.texts.append(chunk.text)
        if self.step.complete():
            yield from self.flush()

    def flush(self) -> Iterator[StepEvent]:
        step, self.step = self.step, None
        if step is not None and step.tokens:
            yield step.event()


def _tokens_with(reply: _Reply, pending: StreamChunk | None, chunk: StreamChunk) -> int:
    """The reply's tokens once `chunk` is in: its ids, or llama-server's count where higher."""
    n_ids = len(reply.tokens) + (len(pending.tokens) if pending is not None else 0) + len(chunk.tokens)
    return max(n_ids, reply.n_decoded, chunk.n_decoded)


_STOPS = {"eos": StopReason.EOS, "limit": StopReason.MAX_TOKENS, "word": StopReason.STOP_STRING}


def generate_on_server(client: ServerClient, ids: Sequence[int], max_new_tokens: int, sampling: SamplingParams,
                       drafter: str, stop_strings: Sequence[str] = (),
                       cancelled: Callable[[], bool] | None = None,
                       extra: dict | None = None) -> Iterator[GenerationEvent]:
    """StepEvents as llama-server streams the reply, then the DoneEvent with its RunSummary
    (llama-server's own timings and counts; the end-of-generation token left out, as ours).
    `extra`: further /completion fields (ignore_eos). A server that streams past
    max_new_tokens is stopped there (its connection closed), a "limit" stop."""
    started = time.monotonic()
    reply = _Reply()
    with closing(client.stream(ids, max_new_tokens, {**sampling_fields(sampling, stop_strings), **(extra or {})},
                               cancelled)) as chunks:  # closing: leaving early closes the connection now
        yield from _read(chunks, reply, ReplyBounds(max_new_tokens), client.shown_url)
    yield DoneEvent(_summary(reply, ids, started, drafter))


def _read(chunks: Iterator[StreamChunk], reply: _Reply, bounds: ReplyBounds, where: str) -> Iterator[StepEvent]:
    """The reply's StepEvents as its chunks come; sets reply.final (its last chunk's timings),
    or reply.limited where the server streamed past `bounds` (the chunk past them is dropped)."""
    pending: StreamChunk | None = None  # a token without text: the end-of-generation token if the reply stops next
    for chunk in chunks:
        if bounds.over(_tokens_with(reply, pending, chunk), chunk.text):
            bounds.warn(where)
            reply.limited = True
            break
        reply.final = chunk.final or reply.final
        if pending is not None and not (chunk.final is not None and chunk.final.stop_type == "eos"):
            yield from reply.take(pending)
        pending = None
        if chunk.tokens and not chunk.text and not chunk.stop:
            pending = chunk
            continue
        yield from reply.take(chunk)
    if pending is not None:
        yield from reply.take(pending)
    yield from reply.flush()


def _summary(reply: _Reply, ids: Sequence[int], started: float, drafter: str) -> RunSummary:
    tokens, texts, first_at, counts, final = reply.tokens, reply.texts, reply.first_at, reply.counts, reply.final
    now = time.monotonic()
    if final is None:  # cancelled or cut at the limit: what the server timed is not known
        stop = StopReason.MAX_TOKENS if reply.limited else StopReason.CANCELLED
        prompt_s, decode_s, n_evaluated = (first_at or now) - started, 0.0, len(ids)
        if first_at is not None:
            decode_s = now - first_at
    else:
        stop = _STOPS.get(final.stop_type, StopReason.EOS)
        prompt_s, decode_s, n_evaluated = final.prompt_ms / 1000.0, final.predicted_ms / 1000.0, final.prompt_n
    return RunSummary(
        text="".join(texts), tokens=tuple(tokens), stop_reason=stop, drafter=drafter, n_prompt=len(ids),
        n_prompt_evaluated=n_evaluated, prompt_s=prompt_s, n_predicted=max(len(tokens), reply.n_decoded),
        decode_s=decode_s,
        ttft_s=(first_at or now) - started, n_steps=counts.n_steps, n_drafted=reply.drafted, n_accepted=reply.accepted,
        accepted_by_position=tuple(counts.accepted_at), drafted_by_position=tuple(counts.drafted_at))
