"""One generation at a time per model, on a worker thread; requests wait in a bounded queue.

The engine is synchronous code, so it runs on its own thread and never blocks the event
loop. Each request is a Job: the worker pushes the engine's events into the job's asyncio queue
with `loop.call_soon_threadsafe` (the one thread-safe way into a loop), and the request handler
awaits them. A job's cancel flag is the engine's `cancel` callable, checked between steps, so a
client that leaves stops its generation at the next step.

The KV cache is shared by every client, so how much of a prompt it already held says something
about the previous request. A client is told (usage.prompt_tokens_details.cached_tokens,
timings.cache_n/prompt_n, and /metrics' prompt token counter) only about a cache its own previous
request filled: the cached count is reported when the previous generation on the model was the
same client's (its network address), else 0. The cache is still used; only the count is hidden.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import queue
import threading
import time
from typing import AsyncIterator, Sequence

from app.common.batches import Batcher
from app.engine.errors import ContextFullError, SpeculaError
from app.engine.events import DoneEvent, RunSummary, StepEvent, StopReason
from app.engine.loop.speculative import DecodeSettings
from app.server.errors import ApiError, context_exceeded, internal_error, server_busy, shutting_down
from app.server.model import ServedModel
from app.server.stats import ServerStats

log = logging.getLogger(__name__)

JobItem = StepEvent | DoneEvent | ApiError


class Job:
    """One request's generation, seen from both sides: the worker posts, the handler awaits."""

    def __init__(self, prompt_ids: Sequence[int], settings: DecodeSettings, loop: asyncio.AbstractEventLoop,
                 client: str = "") -> None:
        self.prompt_ids = prompt_ids
        self.settings = settings
        self.client = client  # who sent it (an address), for the cached-tokens rule
        self._loop = loop
        self._items: asyncio.Queue[JobItem] = asyncio.Queue()
        self._cancel = threading.Event()
        self.shutdown = False  # cancelled because the server is stopping (the client gets a 503)

    def cancel(self, shutdown: bool = False) -> None:
        self.shutdown = self.shutdown or shutdown
        self._cancel.set()

    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def post(self, item: JobItem) -> None:
        """From the worker thread. If the loop is gone (server stopped) nobody is listening: stop."""
        self.post_all((item,))

    def post_all(self, items: tuple) -> None:
        """Several items with one wake-up of the event loop (app.common.batches says why)."""
        try:
            self._loop.call_soon_threadsafe(self._put_all, items)
        except RuntimeError:
            self._cancel.set()

    def _put_all(self, items: tuple) -> None:
        for item in items:
            self._items.put_nowait(item)

    async def events(self) -> AsyncIterator[StepEvent | DoneEvent]:
        """StepEvents, then the DoneEvent; a failure is raised as the ApiError the client gets."""
        while True:
            item = await self._items.get()
            if isinstance(item, ApiError):
                raise item
            if isinstance(item, DoneEvent) and item.summary.stop_reason is StopReason.CANCELLED and self.shutdown:
                raise shutting_down()
            yield item
            if isinstance(item, DoneEvent):
                return


class Admission:
    """A request's place in the queue from before its prompt is tokenized until it is a Job (or
    refused): a flood of long prompts is counted against the queue while being tokenized, and
    the requests past it get 503 at once instead of each being tokenized first."""

    def __init__(self) -> None:
        self.shutdown = False

    def cancel(self, shutdown: bool = False) -> None:
        self.shutdown = self.shutdown or shutdown


class ModelWorker:
    """The thread that owns a served model's generation (ServedModel), and the bounded queue in front of it."""

    def __init__(self, served: ServedModel, max_waiting: int = 8, stats: ServerStats | None = None) -> None:
        if max_waiting < 0:
            raise ValueError("max_waiting must be >= 0")
        self.served = served
        self.max_waiting = max_waiting
        self.stats = stats or ServerStats()
        self._queue: queue.Queue[Job | None] = queue.Queue()
        self._lock = threading.Lock()
        self._admitted: list[Job | Admission] = []  # tokenizing, waiting or running, oldest first
        self._running: Job | None = None
        self._mean_job_s = 1.0  # moving average, for Retry-After
        self._cache_client: str | None = None  # whose generation last filled the KV cache (worker thread)
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="specula-generate", daemon=True)
        self._thread.start()

    @property
    def processing(self) -> int:
        return int(self._running is not None)

    @property
    def waiting(self) -> int:
        with self._lock:
            return max(0, len(self._admitted) - self.processing)

    def _check_room_locked(self) -> None:
        if self._closed:
            raise shutting_down()
        if len(self._admitted) >= 1 + self.max_waiting:
            self.stats.count("requests_rejected")
            raise server_busy(self._retry_after_s())

    def admit(self) -> Admission:
        """A place in the queue for a request about to be tokenized; 503 when there is none.
        Give it to submit(), or back with release() when the request is refused."""
        admission = Admission()
        with self._lock:
            self._check_room_locked()
            self._admitted.append(admission)
        return admission

    def submit(self, prompt_ids: Sequence[int], settings: DecodeSettings, client: str = "",
               admission: Admission | None = None) -> Job:
        """Queue a generation (call from the event loop) in the place `admission` holds; without
        one, 503 when the wait queue is full."""
        job = Job(prompt_ids, settings, asyncio.get_running_loop(), client)
        with self._lock:
            if admission is not None and admission in self._admitted and not self._closed:
                self._admitted[self._admitted.index(admission)] = job
            else:
                self._check_room_locked()
                self._admitted.append(job)
        self._queue.put(job)
        return job

    def release(self, admission: Admission) -> None:
        """Give back a place that did not become a job (a no-op once it did)."""
        with self._lock:
            if admission in self._admitted:
                self._admitted.remove(admission)

    def _retry_after_s(self) -> int:
        # A slot frees when the running generation ends: about one average generation from now.
        return max(1, min(60, math.ceil(self._mean_job_s)))

    def cancel_all(self) -> None:
        """Refuse new jobs and cancel every admitted one (their clients get a 503). Non-blocking."""
        with self._lock:
            self._closed = True
            jobs = list(self._admitted)
        for job in jobs:
            job.cancel(shutdown=True)

    def close(self, timeout_s: float = 5.0) -> None:
        """cancel_all(), then stop the thread (a generation stops at its next step)."""
        self.cancel_all()
        self._queue.put(None)
        self._thread.join(timeout_s)

    def _run(self) -> None:
        while (job := self._queue.get()) is not None:
            started = time.monotonic()
            try:
                if job.cancelled():
                    self._release(job)
                    job.post(shutting_down() if job.shutdown else ApiError(499, "cancelled", "cancelled"))
                else:
                    with self._lock:
                        self._running = job
                    self._generate(job)
                    self._mean_job_s = 0.8 * self._mean_job_s + 0.2 * (time.monotonic() - started)
            finally:
                self._release(job)

    def _release(self, job: Job) -> None:
        """Free the job's place (once). Called before its last event is posted too: its client
        may send the next request the moment it reads that event, and must find room then, not
        when this thread gets round to it (with no waiting room, tests/server/test_server_security.py's
        back-to-back requests got 503 under load)."""
        with self._lock:
            if self._running is job:
                self._running = None
            if job in self._admitted:
                self._admitted.remove(job)

    def _generate(self, job: Job) -> None:
        previous, self._cache_client = self._cache_client, None  # unknown until this one ends well
        steps = Batcher(job.post_all)
        try:
            for event in self.served.generate(job.prompt_ids, job.settings, job.cancelled):
                if isinstance(event, DoneEvent):
                    event = DoneEvent(client_view(event.summary, same_client=previous == job.client))
                    self._cache_client = job.client
                    self.stats.record(event.summary)
                    self._release(job)
                    steps.add(event)
                    steps.send()
                else:
                    steps.add(event)
        except ContextFullError as exc:
            steps.send()
            self._failed(job, context_exceeded(str(exc), "messages"))
        except SpeculaError as exc:
            steps.send()
            self._failed(job, ApiError(500, str(exc), "generation_failed", error_type="server_error"))
        except Exception:
            log.exception("generation failed")
            steps.send()
            self._failed(job, internal_error())

    def _failed(self, job: Job, error: ApiError) -> None:
        self.stats.count("requests_failed")
        self._release(job)
        job.post(error)


def client_view(summary: RunSummary, same_client: bool) -> RunSummary:
    """The summary a client may see: no prompt tokens served from the cache unless its own
    previous request filled that cache (the module's docstring says why)."""
    if same_client:
        return summary
    return dataclasses.replace(summary, n_prompt_evaluated=summary.n_prompt)
