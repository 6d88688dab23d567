"""Server counters, served at /metrics in Prometheus' text format with llama-server's names
(`llamacpp:*`) where one exists, so a dashboard built for llama-server reads them as they are."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from app.engine.events import RunSummary, StopReason


@dataclass
class ServerStats:
    prompt_tokens: int = 0  # evaluated, i.e. not served from the KV cache
    prompt_seconds: float = 0.0
    predicted_tokens: int = 0
    predicted_seconds: float = 0.0
    draft_tokens: int = 0
    draft_tokens_accepted: int = 0
    requests_completed: int = 0
    requests_cancelled: int = 0  # the client left, or the server stopped, mid-generation
    requests_failed: int = 0
    requests_rejected: int = 0  # answered 503: the wait queue was full
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def record(self, summary: RunSummary) -> None:
        with self._lock:
            self.prompt_tokens += summary.n_prompt_evaluated
            self.prompt_seconds += summary.prompt_s
            self.predicted_tokens += summary.n_predicted
            self.predicted_seconds += summary.decode_s
            self.draft_tokens += summary.n_drafted
            self.draft_tokens_accepted += summary.n_accepted
            if summary.stop_reason is StopReason.CANCELLED:
                self.requests_cancelled += 1
            else:
                self.requests_completed += 1

    def count(self, name: str) -> None:
        with self._lock:
            setattr(self, name, getattr(self, name) + 1)

    def prometheus(self, processing: int, deferred: int) -> str:
        with self._lock:
            rows = [
                ("llamacpp:prompt_tokens_total", "counter", "Prompt tokens evaluated.", self.prompt_tokens),
                ("llamacpp:prompt_seconds_total", "counter", "Prompt evaluation time.", self.prompt_seconds),
                ("llamacpp:tokens_predicted_total", "counter", "Tokens generated.", self.predicted_tokens),
                ("llamacpp:tokens_predicted_seconds_total", "counter", "Generation time.", self.predicted_seconds),
                ("llamacpp:requests_processing", "gauge", "Requests generating now.", processing),
                ("llamacpp:requests_deferred", "gauge", "Requests waiting in the queue.", deferred),
                ("specula:draft_tokens_total", "counter", "Tokens drafted.", self.draft_tokens),
                ("specula:draft_tokens_accepted_total", "counter", "Drafted tokens accepted.", self.draft_tokens_accepted),
                ("specula:requests_completed_total", "counter", "Generations that ran to their end.", self.requests_completed),
                ("specula:requests_cancelled_total", "counter", "Generations cancelled mid-way.", self.requests_cancelled),
                ("specula:requests_failed_total", "counter", "Generations that failed.", self.requests_failed),
                ("specula:requests_rejected_total", "counter", "Requests answered 503 (queue full).", self.requests_rejected),
            ]
        lines = []
        for name, kind, text, value in rows:
            lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}", f"{name} {value}"]
        return "\n".join(lines) + "\n"
