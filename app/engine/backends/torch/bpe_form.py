"""A BPE tokenizer's `tokenizer.json` as two files that load in shorter holds of the GIL.

The tokenizers library parses a whole `tokenizer.json` in one call that holds the GIL: 1-2.5 s
for Gemma 3's 262k tokens and 515k merges on a 2-core AVX2 machine, during which no other
Python thread runs (the window's included, while a model loads on a worker). About half of
that call is its JSON: the vocabulary goes through three generic trees before it reaches the
model. So a cache entry can keep
- a skeleton: the same `tokenizer.json` with the model's vocabulary cut to the added tokens
  (whose ids the added vocabulary checks while it is read) and no merges, parsed in milliseconds;
- the model: the vocabulary in id order (JSON) and the merges as pairs of ids (little-endian
  uint32, base64 in the same JSON), handed to `tokenizers.models.BPE`, whose constructor is the
  one long hold left. Ids as a JSON list of a million numbers took 0.15 s of Python's json more,
  and building the merges with the garbage collector on 0.08 s more (Gemma 3, 2-core Zen 3).
`join` puts the model into a tokenizer built from the skeleton. The cache keeps this form only
after the joined tokenizer serialized to the very `tokenizer.json` it came from
(app.engine.backends.torch.fastload), so a library that reads either part otherwise is caught when the entry
is made, not on a user's text.
"""

from __future__ import annotations

import base64
import gc
import json

import numpy as np
from tokenizers.models import BPE

# BPE's settings in tokenizer.json, each a keyword of BPE(); a model with any other field is
# kept whole.
_SETTINGS = ("dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix", "fuse_unk",
             "byte_fallback", "ignore_merges")


def split(tokenizer_json: str) -> tuple[str, str] | None:
    """(skeleton, model) texts of a BPE tokenizer.json whose ids are 0..n-1 and whose merges are
    pairs of its tokens; None for any other tokenizer."""
    whole = json.loads(tokenizer_json)
    model = whole.get("model") if isinstance(whole, dict) else None
    if not isinstance(model, dict) or model.get("type") != "BPE" or set(model) - {"type", "vocab", "merges", *_SETTINGS}:
        return None
    vocab, merges = model.get("vocab"), model.get("merges")
    if not isinstance(vocab, dict) or not isinstance(merges, list) or sorted(vocab.values()) != list(range(len(vocab))):
        return None
    if not all(isinstance(pair, list) and len(pair) == 2 and all(part in vocab for part in pair) for pair in merges):
        return None  # merges written as "a b" strings (older files), or naming unknown tokens
    added = {token.get("content") for token in whole.get("added_tokens") or [] if isinstance(token, dict)}
    skeleton = dict(whole, model=dict(model, vocab={t: i for t, i in vocab.items() if t in added}, merges=[]))
    by_id = sorted(vocab, key=vocab.__getitem__)
    ids = np.array([vocab[part] for pair in merges for part in pair], dtype="<u4")
    model_text = {"vocab": by_id, "merges_u32le": base64.b64encode(ids.tobytes()).decode("ascii")}
    return json.dumps(skeleton, ensure_ascii=False), json.dumps(model_text, ensure_ascii=False)


def join(backend, model_json: str | bytes) -> None:
    """Give `backend` (a tokenizers.Tokenizer built from the skeleton) the model's whole BPE, with
    the settings the skeleton's BPE was read with. ValueError where the text is not a split's."""
    model = json.loads(model_json)
    by_id, packed = model.get("vocab"), model.get("merges_u32le")
    if not isinstance(by_id, list) or not isinstance(packed, str):
        raise ValueError("not a split BPE model")
    ids = np.frombuffer(base64.b64decode(packed, validate=True), dtype="<u4")
    if len(ids) % 2 or (len(ids) and int(ids.max()) >= len(by_id)):
        raise ValueError("merges name tokens the vocabulary does not have")
    vocab = dict(zip(by_id, range(len(by_id))))
    if len(vocab) != len(by_id):
        raise ValueError("a token is listed twice")
    # BPE() takes no None for its string settings: absent means the same.
    options = {name: value for name in _SETTINGS if (value := getattr(backend.model, name)) is not None}
    # Half a million pairs are new objects: the collector would walk them several times over.
    collecting = gc.isenabled()
    gc.disable()
    try:
        ids = ids.tolist()
        merges = list(zip(map(by_id.__getitem__, ids[0::2]), map(by_id.__getitem__, ids[1::2])))
        backend.model = BPE(vocab=vocab, merges=merges, **options)
    finally:
        if collecting:
            gc.enable()
