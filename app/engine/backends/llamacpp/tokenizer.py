"""The model's own llama.cpp tokenizer, with the part of transformers' tokenizer interface the app
uses (encode, decode, the chat template, special and end-of-generation tokens, offsets): the ids
are the ones llama.cpp users get, and no transformers tokenizer is built at load."""

from __future__ import annotations

import ctypes
from typing import Any, Sequence

import numpy as np

from app.engine.gguf.info import GGUFInfo

# GGUF token types (llama.cpp's llama_token_type): 3 control, 4 user-defined; both are parsed as
# special tokens where parsing special text is on.
_SPECIAL_TYPES = (3, 4)


class LlamaTokenizer:
    def __init__(self, weights: Any, info: GGUFInfo) -> None:
        self._lib, self._vocab = weights.lib, weights.vocab
        self.vocab_size = weights.n_vocab
        self.chat_template = weights.chat_template()
        self.name_or_path = str(info.path)
        bos = int(self._lib.llama_vocab_bos(self._vocab))
        self.bos_token_id = bos if bos >= 0 else None
        self.bos_token = self._text(bos) if bos >= 0 else None
        eos = int(self._lib.llama_vocab_eos(self._vocab))
        self.eos_token = self._text(eos) if eos >= 0 else None
        specials = self._special_ids(info)
        self._by_text = {self._text(i): i for i in specials}
        self.all_special_tokens = sorted(t for t in self._by_text if t)
        candidates = set(specials) | {eos, int(self._lib.llama_vocab_eot(self._vocab))}
        # Every end-of-generation token stops a reply, as in llama.cpp (<|im_end|>, <end_of_turn>...).
        self.eos_token_id = sorted(i for i in candidates if i >= 0 and self._lib.llama_vocab_is_eog(self._vocab, i))

    def _special_ids(self, info: GGUFInfo) -> list[int]:
        types = info.metadata.get("tokenizer.ggml.token_type")
        if isinstance(types, np.ndarray) and types.ndim == 1:
            ids = np.flatnonzero(np.isin(types[: self.vocab_size], _SPECIAL_TYPES))
            return [int(i) for i in ids]
        return []

    def _text(self, token: int) -> str:
        raw = self._lib.llama_vocab_get_text(self._vocab, token)
        return raw.decode("utf-8", "replace") if raw else ""

    # --- transformers' interface, the parts the app calls ------------------------------------

    def encode(self, text: str, add_special_tokens: bool = True, split_special_tokens: bool = False,
               **_ignored: Any) -> list[int]:
        """Token ids of text; BOS where the model adds one and add_special_tokens is set; special
        token text parsed as the token unless split_special_tokens (then it stays plain text)."""
        data = text.encode("utf-8")
        capacity = len(data) + 8
        for _ in range(2):
            out = (ctypes.c_int32 * capacity)()
            n = self._lib.llama_tokenize(self._vocab, data, len(data), out, capacity,
                                         add_special_tokens, not split_special_tokens)
            if n >= 0:
                return list(out[:n])
            capacity = -n
        raise ValueError("llama.cpp could not tokenize the text")

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False, **_ignored: Any) -> str:
        return self.decode_bytes(ids, skip_special_tokens).decode("utf-8", "replace")

    def decode_bytes(self, ids: Sequence[int], skip_special_tokens: bool = False) -> bytes:
        ids = [int(i) for i in ids]
        if not ids:
            return b""
        tokens = (ctypes.c_int32 * len(ids))(*ids)
        capacity = 16 * len(ids) + 16
        for _ in range(2):
            buf = ctypes.create_string_buffer(capacity)
            n = self._lib.llama_detokenize(self._vocab, tokens, len(ids), buf, capacity, False,
                                           not skip_special_tokens)
            if n >= 0:
                return buf.raw[:n]
            capacity = -n
        raise ValueError("llama.cpp could not detokenize the ids")

    def piece(self, token: int) -> bytes:
        """The bytes one token stands for, special tokens as their text."""
        buf = ctypes.create_string_buffer(256)
        n = self._lib.llama_token_to_piece(self._vocab, int(token), buf, 256, 0, True)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = self._lib.llama_token_to_piece(self._vocab, int(token), buf, -n, 0, True)
        return buf.raw[:max(n, 0)]

    def __call__(self, text: str, add_special_tokens: bool = False, return_offsets_mapping: bool = False,
                 **_ignored: Any) -> dict[str, list]:
        ids = self.encode(text, add_special_tokens=add_special_tokens)
        out: dict[str, list] = {"input_ids": ids}
        if return_offsets_mapping:
            out["offset_mapping"] = self._offsets(text, ids)
        return out

    def _offsets(self, text: str, ids: Sequence[int]) -> list[tuple[int, int]]:
        """Each token's character span in text, from its bytes (clipped where a token's bytes are
        not the text's own, as a BOS or a space the tokenizer added)."""
        char_at = np.zeros(len(text.encode("utf-8")) + 1, dtype=np.int64)
        at = 0
        for index, char in enumerate(text):
            width = len(char.encode("utf-8"))
            char_at[at:at + width] = index
            at += width
        char_at[at] = len(text)
        spans, byte = [], 0
        for token in ids:
            width = len(self.piece(token))
            start, end = min(byte, at), min(byte + width, at)
            spans.append((int(char_at[start]), int(char_at[end]) if end < at else len(text)))
            byte += width
        return spans

    def convert_tokens_to_ids(self, token: str) -> int | None:
        if token in self._by_text:
            return self._by_text[token]
        ids = self.encode(token, add_special_tokens=False)
        return ids[0] if len(ids) == 1 else None

    def apply_chat_template(self, messages: list[dict], chat_template: str | None = None,
                            add_generation_prompt: bool = False, tokenize: bool = True, **kwargs: Any):
        """Render a conversation with the model's template (transformers' sandboxed Jinja
        renderer, as its tokenizers do); token ids when tokenize, else the text."""
        from transformers.utils.chat_template_utils import render_jinja_template

        template = chat_template or self.chat_template
        if not template:
            raise ValueError("this model has no chat template")
        specials = {"bos_token": self.bos_token or "", "eos_token": self.eos_token or ""}
        rendered, _ = render_jinja_template(conversations=[messages], chat_template=template,
                                            add_generation_prompt=add_generation_prompt, **{**specials, **kwargs})
        text = rendered[0]
        return self.encode(text, add_special_tokens=False) if tokenize else text
