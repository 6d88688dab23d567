"""Response bodies in OpenAI's shapes, plus llama-server's `timings` object.

Chat: `chat.completion` / `chat.completion.chunk` (deltas: first the role, then content pieces,
then an empty delta with finish_reason). Text: `text_completion` for both. The last chunk of a
stream carries `usage` and `timings`, as llama-server sends them; with
stream_options.include_usage, a further chunk with no choices carries them as OpenAI documents.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from app import __version__
from app.engine.events import RunSummary, StopReason

FINISH_REASONS = {
    StopReason.EOS: "stop",
    StopReason.STOP_STRING: "stop",
    StopReason.MAX_TOKENS: "length",
    StopReason.CONTEXT_FULL: "length",
    StopReason.CANCELLED: "stop",  # only ever sent to a client that has left
}


def usage(summary: RunSummary) -> dict[str, Any]:
    return {
        "prompt_tokens": summary.n_prompt,
        "completion_tokens": summary.n_predicted,
        "total_tokens": summary.n_prompt + summary.n_predicted,
        "prompt_tokens_details": {"cached_tokens": summary.n_prompt - summary.n_prompt_evaluated},
    }


def timings(summary: RunSummary) -> dict[str, Any]:
    """llama-server's fields, computed as it computes them (rates are count / time)."""
    prompt_ms, predicted_ms = summary.prompt_s * 1000, summary.decode_s * 1000
    n_prompt, n_predicted = summary.n_prompt_evaluated, summary.n_predicted
    decode_tps = summary.decode_tps
    return {
        "cache_n": summary.n_prompt - n_prompt,
        "prompt_n": n_prompt,
        "prompt_ms": prompt_ms,
        "prompt_per_token_ms": prompt_ms / n_prompt if n_prompt else 0.0,
        "prompt_per_second": 1000 * n_prompt / prompt_ms if prompt_ms > 0 else 0.0,
        "predicted_n": n_predicted,
        "predicted_ms": predicted_ms,
        # llama-server's rule, which `run --json`'s decode_tps follows too: the first token came
        # from the prompt pass, so the rate counts the steps after it (and the end-of-generation step).
        "predicted_per_token_ms": 1000 / decode_tps if decode_tps > 0 else 0.0,
        "predicted_per_second": decode_tps,
        "draft_n": summary.n_drafted,
        "draft_n_accepted": summary.n_accepted,
    }


def sse(data: dict[str, Any] | str) -> bytes:
    """One server-sent event: `data: {...}` and a blank line."""
    text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return f"data: {text}\n\n".encode()


SSE_DONE = sse("[DONE]")


@dataclass(frozen=True)
class Reply:
    """The identity of one response (chat or text); builds its full body and its stream chunks."""

    chat: bool
    model: str
    drafter: str
    id: str = field(default="")
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self) -> None:
        if not self.id:
            prefix = "chatcmpl-" if self.chat else "cmpl-"
            object.__setattr__(self, "id", prefix + uuid.uuid4().hex)

    def _head(self, chunk: bool) -> dict[str, Any]:
        kind = ("chat.completion.chunk" if chunk else "chat.completion") if self.chat else "text_completion"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model,
                "system_fingerprint": f"specula-{__version__}-{self.drafter}"}

    def full(self, summary: RunSummary) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": FINISH_REASONS[summary.stop_reason]}
        if self.chat:
            choice["message"] = {"role": "assistant", "content": summary.text}
        else:
            choice["text"] = summary.text
        return {**self._head(False), "choices": [choice], "usage": usage(summary), "timings": timings(summary)}

    def chunk(self, text: str | None = None, first: bool = False) -> bytes:
        """A content chunk; `first` opens a chat stream with the assistant's role."""
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant", "content": ""} if first else {"content": text}
            choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": None}
        return sse({**self._head(True), "choices": [choice]})

    def last_chunks(self, summary: RunSummary, include_usage: bool) -> bytes:
        """The finish chunk (with usage and timings), the optional usage-only chunk, [DONE]."""
        finish = FINISH_REASONS[summary.stop_reason]
        body: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": finish}
        body.update({"delta": {}} if self.chat else {"text": ""})
        stats = {"usage": usage(summary), "timings": timings(summary)}
        out = sse({**self._head(True), "choices": [body], **stats})
        if include_usage:
            out += sse({**self._head(True), "choices": [], **stats})
        return out + SSE_DONE
