"""Incremental detokenization: text deltas that are right when a character spans several tokens.

The read-offset scheme of text-generation-inference: decode a short window of already-emitted
tokens and the window plus new tokens, and emit the difference once it no longer ends in a
partial UTF-8 character. The window gives tokenizers that drop a leading space at the start of a
decode (SentencePiece) the context they need.
"""

from __future__ import annotations

from typing import Sequence


REPLACEMENT_CHAR = "\ufffd"


class IncrementalDetokenizer:
    def __init__(self, tokenizer, context: Sequence[int] = ()) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = list(context[-4:])  # a little prompt context for leading spaces
        self.prefix_offset = 0
        self.read_offset = len(self.ids)

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def push(self, new_ids: Sequence[int]) -> str:
        """Add tokens; return the text they complete (may be '' mid-character)."""
        self.ids.extend(new_ids)
        prefix_text = self._decode(self.ids[self.prefix_offset : self.read_offset])
        full_text = self._decode(self.ids[self.prefix_offset :])
        if len(full_text) > len(prefix_text) and not full_text.endswith(REPLACEMENT_CHAR):
            delta = full_text[len(prefix_text) :]
            self.prefix_offset = self.read_offset
            self.read_offset = len(self.ids)
            return delta
        return ""

    def flush(self) -> str:
        """At the end: whatever is left, even an incomplete character."""
        prefix_text = self._decode(self.ids[self.prefix_offset : self.read_offset])
        full_text = self._decode(self.ids[self.prefix_offset :])
        self.prefix_offset = self.read_offset = len(self.ids)
        return full_text[len(prefix_text) :]
