"""The settings a user sets for a reply, in one shape for the command line, the window, Compare
and the server (issue 49 item 5), and the one place they become the engine's DecodeSettings.

Plain frozen data (no Qt): the window remembers it in QSettings and the history database
(`to_dict` / `from_dict`), Compare saves it inside its JSON files, the CLI builds it from its
flags and the server from a request's JSON over the defaults its flags set.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING, Any

from app.engine.drafting.kinds import DEFAULT_DRAFT_MAX
from app.engine.errors import SpeculaError

UNTIL_CONTEXT = -1  # max_tokens: reply until the model ends or the context is full (llama.cpp's -n -1)
# UNTIL_CONTEXT's length where the context is not known (a server speaking OpenAI's API does not
# say it, and may refuse an unbounded request).
UNKNOWN_CONTEXT_MAX_TOKENS = 2048

# The loop (numpy and the sampler) is imported when settings become DecodeSettings, not with this
# module: the command line's parser and the window's forms import it to build and show settings.
if TYPE_CHECKING:
    from app.engine.loop.speculative import DecodeSettings


@dataclass(frozen=True)
class GenSettings:
    """Reply length, sampling and drafting; the defaults are the command line's (`specula run`'s
    flags: temperature 0.8, 256 tokens, llama.cpp's sampling) and the window's."""

    max_tokens: int = 256
    temperature: float = 0.8  # 0 = greedy
    top_k: int = 40  # 0 = off
    top_p: float = 0.95  # 1 = off
    min_p: float = 0.05  # 0 = off
    seed: int = -1  # negative: a random seed per reply
    draft_max: int = DEFAULT_DRAFT_MAX  # the ceiling of the adaptive length, or the fixed length
    draft_min: int = 0  # draft nothing when fewer would be drafted
    draft_p_min: float = 0.75  # a draft model stops drafting below this top probability
    adaptive_draft: bool = True  # False: always draft up to draft_max (the CLI's --draft-fixed)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None, base: GenSettings | None = None) -> GenSettings:
        """Known keys with values of the right type over `base` (default: the class's defaults);
        anything else keeps base's value, so an old or hand-edited settings file never stops the
        app."""
        base = base if base is not None else cls()
        if not isinstance(data, dict):
            return base
        values = {}
        for f in fields(cls):
            if f.name in data:
                value = _coerce(getattr(base, f.name), data[f.name])
                if value is not None:
                    values[f.name] = value
        return cls(**{**asdict(base), **values})

    def decode_settings(self, stop_strings: tuple[str, ...] = (), stop_token_ids: tuple[int, ...] | None = None,
                        context: int | None = None) -> DecodeSettings:
        """The engine's DecodeSettings of these values (seed < 0: random; stop_token_ids None:
        the tokenizer's EOS; max_tokens UNTIL_CONTEXT: the `context`'s length, where the loop
        stops at the context's end); a one-line SpeculaError for a value the engine cannot use."""
        from app.engine.loop.sampling import SamplingParams, check_sampling
        from app.engine.loop.speculative import DecodeSettings

        if self.max_tokens < 1 and self.max_tokens != UNTIL_CONTEXT:
            raise SpeculaError("the number of tokens to generate must be at least 1")
        max_new = self.max_tokens if self.max_tokens != UNTIL_CONTEXT else context or UNKNOWN_CONTEXT_MAX_TOKENS
        if self.draft_max < 1:
            raise SpeculaError("draft max must be at least 1")
        if not (math.isfinite(self.draft_p_min) and 0.0 <= self.draft_p_min <= 1.0):
            raise SpeculaError(f"draft p-min must be a finite number between 0 and 1 (got {self.draft_p_min})")
        sampling = SamplingParams(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p,
                                  min_p=self.min_p, seed=None if self.seed < 0 else self.seed)
        check_sampling(sampling)
        return DecodeSettings(max_new_tokens=max_new, draft_max=self.draft_max, draft_min=self.draft_min,
                              draft_p_min=self.draft_p_min, sampling=sampling, stop_strings=tuple(stop_strings),
                              stop_token_ids=stop_token_ids, adaptive_draft=self.adaptive_draft)


def _coerce(default: Any, value: Any) -> Any:
    """`value` as the type of `default`, or None when it cannot be (an INI file may hand back
    "false" or "0.3" as text)."""
    if isinstance(default, bool):
        return value if isinstance(value, bool) else str(value).lower() in ("1", "true", "yes")
    try:
        return type(default)(value)
    except (TypeError, ValueError, OverflowError):
        return None
