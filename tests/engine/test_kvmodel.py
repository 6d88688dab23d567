"""The torch backend's KV model: a rewind leaves the cache as if the rewound tokens were never
fed, a verify's rows are the logits of one-token steps (float32, to rounding), and a greedy
token is the first of equal maxima, as llama.cpp's sampler picks."""

from __future__ import annotations

import numpy as np

from app.engine.backends.torch.kv import KVModel, LogitRows

IDS = [5, 17, 3, 99, 42, 7, 64, 12, 8, 31]


def test_a_rewind_then_other_tokens_equals_feeding_those_tokens_fresh(tiny_loaded):
    loaded = tiny_loaded("llama-q8")
    assert loaded.backend.name == "torch" and loaded.plan.dtype_name == "float32"
    kv = loaded.kv_model()
    assert isinstance(kv, KVModel)
    kv.feed(IDS[:6])
    kv.feed([1, 2, 3], 3)  # a rejected draft
    kv.rewind(6)
    assert kv.ids == IDS[:6]
    after_rewind = kv.feed(IDS[6:], 4)
    fresh = loaded.kv_model()
    fresh.feed(IDS[:6])  # the same batches, so the same products: bit for bit
    assert np.array_equal(fresh.feed(IDS[6:], 4), after_rewind)


def test_a_verifys_rows_are_the_one_token_steps_logits(tiny_loaded):
    loaded = tiny_loaded("llama-q8")
    kv = loaded.kv_model()
    kv.feed(IDS[:5])
    steps = [kv.feed([t])[0] for t in IDS[5:]]
    kv.rewind(5)
    rows = kv.feed_rows(IDS[5:], len(IDS) - 5)
    assert len(rows) == 5
    for i, step in enumerate(steps):
        np.testing.assert_allclose(rows.row(i), step, rtol=1e-4, atol=1e-4)
        assert rows.argmax(i) == int(step.argmax())


def test_sync_reuses_the_common_prefix(tiny_loaded):
    kv = tiny_loaded("llama-q8").kv_model()
    kv.sync(IDS)
    last = kv.sync(IDS[:7] + [2, 9])
    assert kv.ids == IDS[:7] + [2, 9]
    np.testing.assert_allclose(last, tiny_loaded("llama-q8").kv_model().feed(IDS[:7] + [2, 9])[0], rtol=1e-4, atol=1e-4)


def test_the_greedy_token_is_the_first_of_equal_maxima():
    rows = LogitRows(np.array([[0.0, 3.0, 1.0, 3.0]], dtype=np.float32))
    assert rows.argmax(0) == 1 and rows.all().shape == (1, 4)
