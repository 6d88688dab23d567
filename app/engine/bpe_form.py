"""A BPE tokenizer's `tokenizer.json` as two files that load in shorter holds of the GIL.

The tokenizers library parses a whole `tokenizer.json` in one call that holds the GIL: 1-2.5 s
for Gemma 3's 262k tokens and 515k merges on a 2-core AVX2 machine, during which no other
Python thread runs (the window's included, while a model loads on a worker). About half of
that call is its JSON: the vocabulary goes through three generic trees before it reaches the
model. So a cache entry can keep
- a skeleton: the same `tokenizer.json` with the model's vocabulary cut to the added tokens
  (whose ids the added vocabulary checks while it is read) and no merges, parsed in milliseconds;
- the model: the vocabulary in id order and the merges as pairs of ids, parsed by Python's json
  and handed to `tokenizers.models.BPE`, whose constructor is the one long hold left.
`join` puts the model into a tokenizer built from the skeleton. The cache keeps this form only
after the joined tokenizer serialized to the very `tokenizer.json` it came from
(app.engine.fastload), so a library that reads either part otherwise is caught when the entry
is made, not on a user's text.
"""

from __future__ import annotations

import json

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
    ids = [vocab[part] for pair in merges for part in pair]
    return json.dumps(skeleton, ensure_ascii=False), json.dumps({"vocab": by_id, "merges": ids}, ensure_ascii=False)


def join(backend, model_json: str | bytes) -> None:
    """Give `backend` (a tokenizers.Tokenizer built from the skeleton) the model's whole BPE, with
    the settings the skeleton's BPE was read with. ValueError where the text is not a split's."""
    model = json.loads(model_json)
    by_id, ids = model.get("vocab"), model.get("merges")
    if not isinstance(by_id, list) or not isinstance(ids, list) or len(ids) % 2:
        raise ValueError("not a split BPE model")
    vocab = {token: i for i, token in enumerate(by_id)}
    if len(vocab) != len(by_id):
        raise ValueError("a token is listed twice")
    merges = list(zip(map(by_id.__getitem__, ids[0::2]), map(by_id.__getitem__, ids[1::2])))
    # BPE() takes no None for its string settings: absent means the same.
    options = {name: value for name in _SETTINGS if (value := getattr(backend.model, name)) is not None}
    backend.model = BPE(vocab=vocab, merges=merges, **options)
