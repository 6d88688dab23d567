"""Plain, immutable records that generation yields. They cross threads as data (no tensors)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from enum import Enum
from typing import Any


class Origin(str, Enum):
    """Where a generated token came from."""

    DRAFT = "draft"  # proposed by the drafter and accepted by the main model
    MAIN = "main"  # chosen by the main model itself (first token, correction or bonus token)


class StopReason(str, Enum):
    EOS = "eos"
    STOP_STRING = "stop"
    MAX_TOKENS = "length"
    CONTEXT_FULL = "context"
    CANCELLED = "cancelled"


@dataclass(frozen=True)
class StepEvent:
    """One verify step of the speculative loop (or the first token, sampled from the prompt)."""

    tokens: tuple[int, ...]
    origins: tuple[Origin, ...]
    text: str  # the text delta these tokens complete (may be empty mid-character)
    draft_chars: int  # how many leading characters of `text` came from accepted draft tokens
    n_drafted: int
    n_accepted: int
    draft_s: float
    verify_s: float
    timestamp: float  # time.monotonic() when the step finished
    # Tokens this step generated where their ids are not known (a server speaking OpenAI's API
    # streams text: one token per chunk, as it sends them); None: len(tokens).
    n_unnamed: int | None = None

    @property
    def n_tokens(self) -> int:
        """Tokens the model generated in this step (for rates and charts)."""
        return len(self.tokens) if self.n_unnamed is None else self.n_unnamed


@dataclass(frozen=True)
class RunSummary:
    """Counters users know from llama.cpp's llama-speculative, for one generation."""

    text: str
    tokens: tuple[int, ...]
    stop_reason: StopReason
    drafter: str
    n_prompt: int  # prompt tokens
    n_prompt_evaluated: int  # of which not served from the KV cache
    prompt_s: float
    n_predicted: int
    decode_s: float
    ttft_s: float
    n_steps: int
    n_drafted: int
    n_accepted: int
    accepted_by_position: tuple[int, ...]
    drafted_by_position: tuple[int, ...]
    # Why the schedule drafted little or nothing, in one line (None where it drafted as asked).
    schedule_note: str | None = None
    break_even: str | None = None  # why drafting pays here or not (app.engine.loop.explain), where priced
    # The schedule's prices behind that sentence (explain.Prices): a step of k drafts against one
    # of none, k = 0 .. 16, and one drafted token; () and None where nothing was priced.
    step_costs: tuple[float, ...] = ()
    draft_token_cost: float | None = None
    # The fields of to_dict this engine could not know, null there (a server speaking OpenAI's
    # API: its token ids; its draft counts where its /metrics has none): see UNKNOWN_* below.
    unknown: tuple[str, ...] = ()

    @property
    def encode_tps(self) -> float:
        return self.n_prompt_evaluated / self.prompt_s if self.prompt_s > 0 else 0.0

    @property
    def decode_tps(self) -> float:
        """Tokens per second after the first token (the first comes from the prompt pass), as
        llama.cpp counts them: a reply that ended at the end-of-generation token spent a step on
        it, which counts (llama-server's predicted_per_second; without it a 25-token reply read
        4% slower than the same steps in llama-server)."""
        return decode_rate(self.n_predicted, self.decode_s, self.stop_reason is StopReason.EOS)

    @property
    def accept_rate(self) -> float:
        return self.n_accepted / self.n_drafted if self.n_drafted else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Mean number of draft tokens accepted per verify step."""
        return self.n_accepted / self.n_steps if self.n_steps else 0.0

    @property
    def acceptance_by_position(self) -> tuple[float, ...]:
        return tuple(
            acc / dr if dr else 0.0
            for acc, dr in zip(self.accepted_by_position, self.drafted_by_position)
        )

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["stop_reason"] = self.stop_reason.value
        data["tokens"] = list(self.tokens)
        data.update(
            encode_tps=self.encode_tps,
            decode_tps=self.decode_tps,
            accept_rate=self.accept_rate,
            mean_accepted_length=self.mean_accepted_length,
            acceptance_by_position=list(self.acceptance_by_position),
        )
        for name in self.unknown:
            data[name] = None
        data["unknown"] = list(self.unknown)
        return data


# What a server speaking OpenAI's API leaves unknown: its token ids always; its prompt size where
# it sends no usage; the draft counts where its /metrics has none (SpecCounters.drafts None: the
# steps and per-position counts only).
UNKNOWN_TOKENS = ("tokens",)
UNKNOWN_PROMPT = ("n_prompt", "n_prompt_evaluated", "encode_tps")
UNKNOWN_STEPS = ("n_steps", "mean_accepted_length", "accepted_by_position", "drafted_by_position",
                 "acceptance_by_position")
UNKNOWN_DRAFTS = ("n_drafted", "n_accepted", "accept_rate") + UNKNOWN_STEPS


@dataclass(frozen=True)
class DoneEvent:
    """The last event of every generation, also after cancellation."""

    summary: RunSummary


GenerationEvent = StepEvent | DoneEvent


class StepCounters:
    """Running totals of a reply's verify steps for its summary (llama.cpp's names): our
    loop's and a llama-server reply's (app.engine.llama_server.engine) alike."""

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


def decode_rate(n_predicted: int, decode_s: float, ended_at_eos: bool) -> float:
    """Decoded tokens per second after the first token, the end-of-generation step counted."""
    n_decoded = n_predicted - 1 + int(ended_at_eos)
    return n_decoded / decode_s if n_decoded > 0 and decode_s > 0 else 0.0
