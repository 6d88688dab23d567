"""Each llama.cpp context gets a threadpool of its own, as llama.cpp's programs attach one, at the
polling level asked for; the steps it runs give the same logits as without one."""

from __future__ import annotations

import dataclasses

import numpy as np

from tests.llama_support import llama_loaded  # noqa: F401 - fixture


def test_a_context_runs_on_its_own_threadpool_and_frees_it(llama_loaded):  # noqa: F811
    weights = llama_loaded("llama-q8").model
    kv = weights.context(64)
    assert kv._threads.pool is not None
    with_pool = kv.feed([1, 5, 9, 12, 3], 5).copy()
    kv.close()
    assert kv._threads.pool is None
    sleeping = dataclasses.replace(weights.settings, poll=0)
    original, weights.settings = weights.settings, sleeping
    try:
        kv = weights.context(64)
        assert kv._threads.pool is not None
        assert np.array_equal(kv.feed([1, 5, 9, 12, 3], 5), with_pool)  # polling never changes a result
        kv.close()
    finally:
        weights.settings = original
