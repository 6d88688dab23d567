"""A verify's logits through an int4 head: computed a few rows at a time, with the bits of
one-token steps."""

from __future__ import annotations

import pytest
import torch

from app.engine.cpu import quantlinear
from app.engine.kvmodel import LogitRows
from app.engine.loader import load_model

pytestmark = pytest.mark.skipif(not quantlinear.int4_available(), reason="this torch has no CPU int4 kernel")

TEXT = "def add(a, b):\n    return a + b\n\nThe quick brown fox jumps over the lazy dog. 12 + 30 = 42."


@pytest.fixture(scope="module", params=["smollm2-135m", "gemma3-270m"])
def demo(request, demo_path):
    return load_model(demo_path(request.param), device="cpu", dtype="bfloat16")


def _verify_rows(demo, n: int) -> tuple[LogitRows, list[torch.Tensor], list[int]]:
    """(the rows of a verify of the text's last n tokens whose head records the rows of each call,
    the logits of the same tokens fed one at a time, the record)."""
    kv = demo.kv_model()
    kv._screen = None  # every greedy token read from its row, screened or not on this CPU
    ids = demo.tokenizer.encode(TEXT)
    prompt, drafts = ids[:-n], ids[-n:]
    kv.feed(prompt)
    steps = [kv.feed([t])[0] for t in drafts]
    kv.rewind(len(prompt))
    rows = kv.feed_rows(drafts, n)
    calls: list[int] = []
    head = rows._head
    rows._head = lambda hidden: calls.append(hidden.shape[0]) or head(hidden)
    return rows, steps, calls


def test_a_verify_computes_its_first_rows_then_the_rest_with_the_bits_of_one_token_steps(demo):
    assert demo.plan.int4 and kv_head_is_int4(demo)
    rows, steps, calls = _verify_rows(demo, 9)
    got = [rows.row(i) for i in range(9)]
    assert calls == [LogitRows.FIRST_ROWS, 9 - LogitRows.FIRST_ROWS]
    for i in range(9):
        assert torch.equal(got[i], steps[i]), i
    assert rows.argmax(8) == int(steps[8].argmax())


def test_a_rejected_first_draft_computes_one_run_and_all_fills_in_the_rest_at_once(demo):
    rows, steps, calls = _verify_rows(demo, 9)
    assert rows.argmax(0) == int(steps[0].argmax())
    assert calls == [LogitRows.FIRST_ROWS]
    everything = rows.all()
    assert calls == [LogitRows.FIRST_ROWS, 9 - LogitRows.FIRST_ROWS]
    assert torch.equal(everything, torch.stack(steps))


def kv_head_is_int4(demo) -> bool:
    return isinstance(demo.model.get_output_embeddings(), quantlinear.Int4Linear)


@pytest.mark.parametrize("size", [50, 1000, 65536, 65536 + 1000, 262144])
def test_first_argmax_is_torch_argmax_on_ties_infinities_and_nans(size):
    """The chunked argmax gives torch's index: the first of tied maxima, the first NaN."""
    from app.engine.kvmodel import first_argmax

    generator = torch.Generator().manual_seed(size)
    for trial in range(40):
        row = (torch.randint(-3, 4, (size,), generator=generator).float() if trial % 2
               else torch.randn(size, generator=generator).to(torch.bfloat16).float())
        if trial % 5 == 1:
            row[int(torch.randint(size, (1,), generator=generator))] = float("nan")
        if trial % 7 == 2:
            row[-1] = float("inf")
        if trial % 9 == 3:
            row[:] = float("-inf")
        assert first_argmax(row) == int(row.argmax())
