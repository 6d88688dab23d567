"""A small HTTP client for llama-server's native API (/health, /completion) on token ids, with
every field of its answers checked: a server that answers garbage is one line, never a traceback.

Standard library only: the requests are few and on loopback (or a URL the user gave), so a
connection per request costs nothing that matters next to a model's reply."""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any, Sequence

from app.engine.errors import SpeculaError

_MAX_ANSWER_BYTES = 64 * 1024 * 1024


class ServerError(SpeculaError):
    """A server that could not be reached, refused a request or answered what it should not."""


@dataclass(frozen=True)
class ServerReply:
    """One /completion answer: the generated token ids and text, and the server's own timings
    (its decode rate, and the drafted and accepted counts of its speculation)."""

    tokens: tuple[int, ...]
    text: str
    prompt_n: int
    prompt_ms: float
    predicted_n: int
    predicted_ms: float
    draft_n: int
    draft_n_accepted: int

    @property
    def decode_tps(self) -> float | None:
        """llama-server's predicted_per_second: generated tokens over the time after the prompt."""
        return self.predicted_n / self.predicted_ms * 1000.0 if self.predicted_ms > 0 else None

    @property
    def accept_rate(self) -> float | None:
        return self.draft_n_accepted / self.draft_n if self.draft_n else None


class ServerClient:
    def __init__(self, base_url: str, api_key: str | None = None, timeout_s: float = 600.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.timeout_s = timeout_s

    def healthy(self, timeout_s: float = 5.0) -> bool:
        """True once the model is loaded (llama-server answers 503 while loading)."""
        try:
            self._request("GET", "/health", None, timeout_s)
        except ServerError as exc:
            if "HTTP 503" in str(exc):
                return False
            raise
        return True

    def complete(self, prompt_ids: Sequence[int], n_predict: int, greedy: bool = True, seed: int = 0,
                 extra: dict[str, Any] | None = None) -> ServerReply:
        """One reply to `prompt_ids` (exactly these ids: no template, no BOS added), at most
        n_predict tokens, stopping at the model's end of generation. Greedy: top-k 1, the only
        sampler, as llama-server documents for deterministic output."""
        body: dict[str, Any] = {"prompt": [int(t) for t in prompt_ids], "n_predict": int(n_predict),
                                "cache_prompt": False, "return_tokens": True, "seed": seed, "stream": False}
        if greedy:
            body.update(temperature=0.0, top_k=1, samplers=["top_k"])
        body.update(extra or {})
        return parse_completion(self._request("POST", "/completion", body, self.timeout_s))

    def _request(self, method: str, path: str, body: dict | None, timeout_s: float) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base_url + path, data=data, method=method)
        request.add_header("Content-Type", "application/json")
        if self.api_key:
            request.add_header("Authorization", f"Bearer {self.api_key}")
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as answer:
                raw = answer.read(_MAX_ANSWER_BYTES + 1)
        except urllib.error.HTTPError as exc:
            raise ServerError(f"{self.base_url}{path}: HTTP {exc.code} {_short(exc.read(2048))}") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise ServerError(f"{self.base_url}{path}: could not connect ({reason})") from None
        if len(raw) > _MAX_ANSWER_BYTES:
            raise ServerError(f"{self.base_url}{path}: the answer is larger than {_MAX_ANSWER_BYTES >> 20} MiB")
        try:
            return json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            raise ServerError(f"{self.base_url}{path}: the answer is not JSON: {_short(raw)}") from None


def parse_completion(answer: Any) -> ServerReply:
    """A ServerReply from /completion's JSON, every field checked for type and range."""
    if not isinstance(answer, dict):
        raise ServerError("llama-server's answer is not a JSON object")
    tokens = answer.get("tokens")
    if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0
                                                for t in tokens):
        raise ServerError("llama-server's answer has no list of token ids (is it llama-server, with return_tokens?)")
    text = answer.get("content", "")
    if not isinstance(text, str):
        raise ServerError("llama-server's answer has a content that is not text")
    timings = answer.get("timings", {})
    if not isinstance(timings, dict):
        raise ServerError("llama-server's answer has timings that are not an object")
    return ServerReply(tuple(tokens), text,
                       _count(timings, "prompt_n"), _duration(timings, "prompt_ms"),
                       _count(timings, "predicted_n"), _duration(timings, "predicted_ms"),
                       _count(timings, "draft_n"), _count(timings, "draft_n_accepted"))


def _count(timings: dict, key: str) -> int:
    value = timings.get(key, 0)
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 1 << 40:
        raise ServerError(f"llama-server's timings.{key} is not a count: {_short(str(value).encode())}")
    return value


def _duration(timings: dict, key: str) -> float:
    value = timings.get(key, 0.0)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ServerError(f"llama-server's timings.{key} is not a duration: {_short(str(value).encode())}")
    return float(value)


def _short(raw: bytes, limit: int = 160) -> str:
    """Up to `limit` characters of a remote answer, control characters escaped."""
    text = raw.decode("utf-8", "replace")
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return text[:limit] + ("..." if len(text) > limit else "")
