"""Drafting through text, for a draft model whose vocabulary differs from the main model's.

The draft keeps its own KV cache over its own tokenization of the main context's text. Each step:
the new main tokens are decoded (incrementally, `MainText`), the draft's tokens are brought in line
with that text by re-tokenizing only a tail (`DraftText`), the draft drafts greedily, its tokens are
decoded to text, and (a tail of the main context + the drafted text) is re-tokenized with the main
tokenizer (`main_tokens_for`). Only main tokens that extend the current main context exactly and
will not change when more text follows are proposed.

Correctness never rests on this: the main model verifies every proposed token, so a poor
re-tokenization costs acceptance, not output. Proposals carry no draft probabilities in the main
vocabulary (q = one-hot of a deterministic draft), so with sampling the loop's rule for such drafts
applies (sampling.speculative_accept with q None) and the main model's distribution is kept exactly.
"""

from __future__ import annotations

import logging
from typing import Sequence

import numpy as np

from app.engine.drafting.drafters import Draft, Drafter, DraftModelDrafter, DraftReading
from app.engine.seam import KVModelLike as KVModel, common_prefix_length, first_argmax
from app.engine.loop.sampling import SamplingParams, softmax

log = logging.getLogger(__name__)

REPLACEMENT_CHAR = "\ufffd"
# The main tail re-tokenized each step: at least MIN_TAIL tokens, walked back to a word start up
# to MAX_TAIL tokens; retried once from WIDE_TAIL tokens when the short tail tokenizes differently.
MIN_TAIL, MAX_TAIL, WIDE_TAIL = 4, 24, 64
# Draft tokens re-tokenized before the first changed character: the last tokens of the old text
# may merge with what follows it.
DRAFT_MARGIN = 3
DECODE_WINDOW = 4  # tokens of left context for decoding one token (SentencePiece's leading space)
# Draft tokens beyond the main tokens asked for: the drafted text's last word is dropped as
# unstable, and the two vocabularies cut text into pieces of different sizes.
EXTRA_DRAFT = 3


class Codec:
    """Fast encode/decode through the tokenizer's Rust backend where it has one."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.backend = getattr(tokenizer, "backend_tokenizer", None)

    def encode(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """Token ids of `text` (no BOS/EOS added) and each token's character span."""
        if self.backend is not None:
            enc = self.backend.encode(text, add_special_tokens=False)
            return list(enc.ids), list(enc.offsets)
        out = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        return list(out["input_ids"]), [tuple(span) for span in out["offset_mapping"]]

    def ids(self, text: str) -> list[int]:
        if self.backend is not None:
            return list(self.backend.encode(text, add_special_tokens=False).ids)
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        # Special tokens stay as text: the main side must re-tokenize them to the same ids.
        if self.backend is not None:
            return self.backend.decode(list(ids), skip_special_tokens=False)
        return self.tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def decode_after(self, left: Sequence[int], new: Sequence[int]) -> tuple[str, bool]:
        """The text `new` adds after `left`, without a trailing incomplete character, and whether
        it ended on a whole character."""
        before = self.decode(left).rstrip(REPLACEMENT_CHAR) if left else ""
        after = self.decode([*left, *new])
        clean = not after.endswith(REPLACEMENT_CHAR)
        after = after.rstrip(REPLACEMENT_CHAR)
        if after.startswith(before):
            return after[len(before):], clean
        return self.decode(new).rstrip(REPLACEMENT_CHAR), clean  # a decoder that rewrites its left


class MainText:
    """The main context's text, kept in step with its tokens by decoding only new tokens."""

    def __init__(self, codec: Codec) -> None:
        self.codec = codec
        self.ids: list[int] = []
        self.ends: list[int] = []  # text length after each token
        self.clean: list[bool] = []  # whether the text after each token ends on a whole character
        self.text = ""

    def update(self, context: Sequence[int]) -> None:
        n = common_prefix_length(self.ids, context)
        del self.ids[n:], self.ends[n:], self.clean[n:]
        self.text = self.text[: self.ends[-1]] if n else ""
        for token in context[n:]:
            piece, clean = self.codec.decode_after(self.ids[self._window_start():], [int(token)])
            self.ids.append(int(token))
            self.text += piece
            self.ends.append(len(self.text))
            self.clean.append(clean)

    def _window_start(self) -> int:
        """A few tokens back, where the text was whole: a window that starts mid-character
        decodes its first bytes as replacement characters, which the next token can't fix."""
        start = max(0, len(self.ids) - DECODE_WINDOW)
        while start > 0 and not self.clean[start - 1]:
            start -= 1
        return start

    def tail_start(self, n_min: int, n_max: int) -> int:
        """A token index a few tokens before the end where the text is whole and, if one is
        found within n_max tokens, a word starts: where re-tokenizing the tail is most likely to
        reproduce the context's own tokens."""
        n = len(self.ids)
        first = max(0, n - n_max)
        start = None
        for a in range(max(0, n - n_min), first - 1, -1):
            if a == 0:
                return 0
            if not self.clean[a - 1]:
                continue
            if start is None:
                start = a
            nxt = self.ends[a - 1]
            if nxt < len(self.text) and self.text[nxt].isspace():
                return a
        return start if start is not None else 0

    def text_from(self, a: int) -> str:
        return self.text[self.ends[a - 1]:] if a else self.text


class DraftText:
    """The draft tokenizer's tokens of the main text, re-tokenized only from just before the first
    character that changed since the last step."""

    def __init__(self, codec: Codec) -> None:
        self.codec = codec
        self.text = ""
        self.ids: list[int] = []
        self.spans: list[tuple[int, int]] = []

    def sync(self, text: str) -> list[int]:
        same = len(self.text) if text.startswith(self.text) else _common_chars(self.text, text)
        keep = 0
        for i, (_, end) in enumerate(self.spans):
            if end > same:
                break
            keep = i + 1
        keep = max(0, keep - DRAFT_MARGIN)
        # Restart only where the old tokens did not overlap (a character split over tokens).
        while 0 < keep < len(self.spans) and self.spans[keep - 1][1] > self.spans[keep][0]:
            keep -= 1
        start = self.spans[keep - 1][1] if keep else 0
        ids, spans = self.codec.encode(text[start:])
        self.ids = self.ids[:keep] + ids
        self.spans = self.spans[:keep] + [(s + start, e + start) for s, e in spans]
        self.text = text
        return self.ids


def _common_chars(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _char_class(ch: str) -> int:
    if ch.isspace():
        return 0
    if ch.isalpha():
        return 1
    if ch.isdigit():
        return 2
    return 3


def last_run_start(text: str) -> int:
    """Where the last run of one character class (letters, digits, spaces, other) starts, with
    the whitespace just before it: text from there may still be joined by what follows (a word,
    a number, a run of spaces), and byte-level BPE and SentencePiece both tokenize a word
    together with the space before it (" ran", "▁ran"), so "fox r" must not propose " ".
    """
    i = len(text)
    if not i:
        return 0
    cls = _char_class(text[-1])
    while i > 0 and _char_class(text[i - 1]) == cls:
        i -= 1
    while i > 0 and cls != 0 and text[i - 1].isspace():
        i -= 1
    return i


def main_tokens_for(codec: Codec, tail_ids: Sequence[int], tail_text: str, drafted: str) -> list[int] | None:
    """Main tokens that follow `tail_ids` (whose text is `tail_text`) for the drafted text, cut
    to those that will not change whatever text comes next.

    Stable means: the tokenization of (tail + drafted) and of (tail + drafted without its last
    run of one character class) agree on them. None when the tail itself does not re-tokenize to
    `tail_ids` (the context is not in its canonical tokenization there).
    """
    drafted = drafted.rstrip(REPLACEMENT_CHAR)
    cut = last_run_start(drafted)
    if cut == 0:
        return []
    n = len(tail_ids)
    full = codec.ids(tail_text + drafted)
    if full[:n] != list(tail_ids):
        return None
    short = codec.ids(tail_text + drafted[:cut])
    if short[:n] != list(tail_ids):
        return None
    new_full, new_short = full[n:], short[n:]
    return new_full[: common_prefix_length(new_full, new_short)]


class TextDrafter(DraftModelDrafter):
    """A draft model with another tokenizer drafts through text (see the module's docstring)."""

    text_level = True

    def __init__(self, draft: KVModel, draft_tokenizer, main_tokenizer, main_vocab_size: int,
                 name: str = "draft") -> None:
        self.draft = draft
        self.name = name
        self.main_vocab_size = main_vocab_size
        self.main_codec, self.draft_codec = Codec(main_tokenizer), Codec(draft_tokenizer)
        self.main_text = MainText(self.main_codec)
        self.draft_text = DraftText(self.draft_codec)
        # Drafting stops at the draft's special tokens (its end of turn): their text would not
        # be the main model's.
        self.draft_stop = set(getattr(draft_tokenizer, "all_special_ids", None) or ())
        self.p_min = 0.0
        self.n_tail_mismatch = 0
        # In main-model tokens: the two vocabularies' counts for a text are close enough for a price.
        self.reading = DraftReading(draft, same_vocabulary=False)

    def fresh(self) -> Drafter:
        return TextDrafter(self.draft, self.draft_codec.tokenizer, self.main_codec.tokenizer,
                           self.main_vocab_size, name=self.name)

    def configure(self, sampling: SamplingParams, draft_p_min: float) -> None:
        # Drafting is always greedy, hence deterministic given the context: the proposal is a
        # one-hot q, which the accept rule for drafts without probabilities expects.
        self.p_min = draft_p_min

    def propose(self, context: Sequence[int], max_tokens: int) -> Draft:
        if max_tokens <= 0 or not context:
            return Draft()
        self.main_text.update(context)
        self.reading.read(len(context))
        target = self.draft_text.sync(self.main_text.text)
        n_draft = min(max_tokens + EXTRA_DRAFT, self.draft.n_ctx - len(target) - 1)
        if not target or n_draft <= 0:
            return Draft()
        drafted = self._draft(target, n_draft)
        if not drafted:
            return Draft()
        text, _ = self.draft_codec.decode_after(target[-DECODE_WINDOW:], drafted)
        tokens = self._main_tokens(context, text)
        tokens = tokens[:max_tokens]
        for i, token in enumerate(tokens):  # a tokenizer id the main model has no row for
            if not 0 <= token < self.main_vocab_size:
                tokens = tokens[:i]
                break
        return Draft(tuple(tokens))

    def _draft(self, target: list[int], n: int) -> list[int]:
        logits = self.draft.sync(target)
        drafted: list[int] = []
        while True:
            if self.p_min > 0.0 and float(softmax(np.asarray(logits, dtype=np.float32)).max()) < self.p_min:
                break  # the draft is unsure: stop rather than waste verify work
            token = first_argmax(logits)
            if token in self.draft_stop:
                break
            drafted.append(token)
            if len(drafted) >= n:
                break
            logits = self.draft.feed([token], 1)[0]
        return drafted

    def _main_tokens(self, context: Sequence[int], text: str) -> list[int]:
        for n_max in (MAX_TAIL, WIDE_TAIL):
            a = self.main_text.tail_start(MIN_TAIL, n_max)
            tokens = main_tokens_for(self.main_codec, context[a:], self.main_text.text_from(a), text)
            if tokens is not None:
                return tokens
            if a == 0:
                break
        self.n_tail_mismatch += 1
        log.debug("text drafter: the context's tail does not re-tokenize to itself; no draft")
        return []
