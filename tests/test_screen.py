"""Screened argmax of an int4 head: always the token the whole int4 row gives, on the real demo
heads and on heads built to have exact and near ties."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from app.engine.cpu import quantlinear
from app.engine.fastload import _dequantize
from app.engine.loader import load_model
from app.engine.cpu.quantlinear import Int4Linear, pack_passes
from app.engine.cpu.screen import ScreenedHead, can_screen, screening_pays

pytestmark = pytest.mark.skipif(
    not quantlinear.int4_available() or not quantlinear.layout_is_known(),
    reason="this torch has no CPU int4 kernel, or packs another layout here (then nothing is screened)")

TEXT = "def add(a, b):\n    return a + b\n\nThe quick brown fox jumps over the lazy dog. 12 + 30 = 42."


@pytest.fixture(scope="module", params=["smollm2-135m", "gemma3-270m"])
def demo(request, demo_path):
    return load_model(demo_path(request.param), device="cpu", dtype="bfloat16")


def _hidden(loaded, text: str) -> torch.Tensor:
    base = getattr(loaded.model, loaded.model.base_model_prefix)
    with torch.inference_mode():
        return base(input_ids=torch.tensor([loaded.tokenizer.encode(text)])).last_hidden_state[0]


def _screen(loaded) -> ScreenedHead:
    """The demo's head screened by its tied embedding, whether or not this CPU's KV caches use it."""
    head, table = loaded.model.get_output_embeddings(), loaded.model.get_input_embeddings().weight
    assert can_screen(head, table)
    return ScreenedHead(head, table)


def test_kv_caches_screen_only_where_screening_pays(demo):
    assert (demo.kv_model()._screen is not None) == screening_pays()


def test_demo_heads_screen_to_the_int4_argmax_within_the_bound(demo):
    head = demo.model.get_output_embeddings()
    assert isinstance(head, Int4Linear)  # a Q8_0 head, packed in two passes
    hidden = _hidden(demo, TEXT)
    screened = _screen(demo).rows(hidden)
    with torch.inference_mode():
        full = head(hidden).float()
    # The bound holds everywhere, with room to spare.
    assert ((full - screened._approx).abs() <= screened._slack).all()
    for i in range(hidden.shape[0]):
        assert screened.argmax(i) == int(full[i].argmax()), i


def test_block_logits_are_bit_for_bit_the_whole_rows(demo):
    head = demo.model.get_output_embeddings()
    screen = _screen(demo)
    x = _hidden(demo, TEXT)[-5:].to(torch.bfloat16)
    blocks = torch.tensor([0, 3, head.out_features // 64 - 1])
    index = (blocks[:, None] * 64 + torch.arange(64)).reshape(-1)
    with torch.inference_mode():
        whole = head(x).float()[:, index]
        assert torch.equal(screen.block_logits(x, blocks), whole)
        assert torch.equal(screen.block_logits(x[2:3], blocks)[0], whole[2])  # alone or with others


def test_verify_picks_the_same_tokens_screened_or_row_by_row(demo):
    kv = demo.kv_model()
    kv._screen = _screen(demo)  # screened here even where it would not pay
    ids = demo.tokenizer.encode(TEXT)
    kv.sync(ids[:-10])
    n = len(kv.ids)
    screened = kv.feed_rows(ids[-10:], 10)
    tokens = [screened.argmax(i) for i in range(10)]
    assert screened._screened is not None  # 10 rows: the screened path was taken
    kv.rewind(n)
    kv._screen = None
    plain = kv.feed_rows(ids[-10:], 10)
    assert tokens == [int(plain.row(i).argmax()) for i in range(10)]


def _tied_head(rows: np.ndarray) -> tuple[Int4Linear, torch.Tensor]:
    raw = gguf.quants.quantize(rows, gguf.GGMLQuantizationType.Q8_0).reshape(-1)
    head = Int4Linear(pack_passes(raw, "Q8_0", rows.shape), rows.shape[0], rows.shape[1], None)
    table = _dequantize(raw, "Q8_0", rows.shape).to(torch.bfloat16)
    return head, table


def test_exact_and_near_ties_resolve_as_the_whole_row_does():
    rng = np.random.default_rng(7)
    rows = (rng.standard_normal((512, 128)) * 0.02).astype(np.float32)
    rows[300] = rows[40]  # an exact tie between two blocks: the first index must win
    rows[301] = rows[40]
    rows[41] = rows[40] * (1 + 1e-3)  # near ties, a quantization step or so apart
    rows[450] = rows[40] * (1 - 1e-3)
    head, table = _tied_head(rows)
    assert can_screen(head, table)
    screen = ScreenedHead(head, table)
    base = torch.from_numpy(rows[40]) * 40
    xs = torch.stack([base + torch.randn(128) * s for s in (0.0, 0.01, 0.05, 0.2, 1.0, 3.0)]
                     + [torch.randn(128) for _ in range(26)]).to(torch.bfloat16)
    screened = screen.rows(xs)
    with torch.inference_mode():
        full = head(xs).float()
    for i in range(xs.shape[0]):
        assert screened.argmax(i) == int(full[i].argmax()), i
    assert screened.argmax(0) in (40, 41)  # the duplicated rows 300 and 301 never win a tie


def test_heads_that_cannot_be_screened_are_refused():
    head, table = _tied_head((np.random.default_rng(1).standard_normal((96, 64)) * 0.02).astype(np.float32))
    assert not can_screen(head, table)  # 96 rows: not whole 64-row packed blocks
    head, table = _tied_head((np.random.default_rng(1).standard_normal((128, 64)) * 0.02).astype(np.float32))
    assert can_screen(head, table) and not can_screen(head, table.float()) and not can_screen(head, None)


def test_a_flat_row_falls_back_to_the_whole_row_and_still_agrees():
    rows = (np.random.default_rng(3).standard_normal((256, 64)) * 0.02).astype(np.float32)
    head, table = _tied_head(rows)
    xs = torch.cat([torch.zeros(1, 64), torch.randn(2, 64)]).to(torch.bfloat16)  # row 0: every logit 0
    screened = ScreenedHead(head, table).rows(xs)
    with torch.inference_mode():
        full = head(xs).float()
    assert [screened.argmax(i) for i in range(3)] == full.argmax(dim=1).tolist()
    assert screened._tokens == []  # the union of candidates was everything: no gathering
