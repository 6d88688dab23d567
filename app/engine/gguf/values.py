"""What a GGUF header's values are, apart from the file they came from: its string arrays (decoded
only when asked for) and the small tests and readings the parser and the checks share."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, overload

import numpy as np

DEFAULT_ALIGNMENT = 32  # general.alignment where a header does not say (GGUF's own default)


class StringArray(Sequence[str]):
    """A GGUF string array as one bytes blob plus offsets; items are decoded on access.

    Decoding 262k token strings eagerly costs more than parsing the rest of the header, and the
    compatibility check can compare the raw bytes directly (`raw`, `blob`, `starts`, `ends`).
    """

    __slots__ = ("blob", "starts", "ends", "_decoded")

    def __init__(self, blob: bytes, starts: np.ndarray, ends: np.ndarray) -> None:
        self.blob = blob
        self.starts = starts  # int64 offsets into blob, one per item
        self.ends = ends
        self._decoded: list[str] | None = None

    def __len__(self) -> int:
        return len(self.starts)

    def raw(self, i: int) -> bytes:
        return self.blob[self.starts[i]:self.ends[i]]

    @overload
    def __getitem__(self, i: int) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> list[str]: ...
    def __getitem__(self, i: int | slice) -> str | list[str]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if self._decoded is not None:
            return self._decoded[i]
        # errors="replace": a stray invalid byte must not make a whole model unreadable.
        return self.raw(i).decode("utf-8", errors="replace")

    def __iter__(self) -> Iterator[str]:
        if self._decoded is None:
            blob = self.blob
            self._decoded = [blob[s:e].decode("utf-8", errors="replace")
                             for s, e in zip(self.starts.tolist(), self.ends.tolist())]
        return iter(self._decoded)

    def __repr__(self) -> str:
        return f"StringArray(len={len(self)})"


def as_int(value: Any, default: int = 0) -> int:
    """A metadata number; a per-layer array counts as its maximum."""
    if value is None:
        return default
    if isinstance(value, (np.ndarray, list)):
        return int(max(value)) if len(value) else default
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def kind_of(value: Any) -> str:
    if isinstance(value, (StringArray, list, np.ndarray)):
        return "an array"
    return "a string" if isinstance(value, str) else f"{type(value).__name__} {value!r}"


def is_count(value: Any) -> bool:
    """A non-negative whole number stored as an integer type (llama.cpp refuses other types too)."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)) and value >= 0
