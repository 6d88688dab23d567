"""The int8 output projection: row-exact, its bound holds, and every row's leading logits are the
table's float32 products, on built heads and on the demo models' real heads."""

from __future__ import annotations

import pytest
import torch

from app.engine.cpu import int8head
from app.engine.cpu import plan as cpu_plan
from app.engine.cpu.int8head import Int8Head
from app.engine.drafters import NoDrafter, PromptLookupDrafter
from app.engine.events import StepEvent
from app.engine.loader import cpu_plan_options, load_model
from app.engine.gguf_info import read_gguf_info
from app.engine.sampling import SamplingParams
from app.engine.speculative import DecodeSettings, generate
from tests.kv_checks import verify_and_steps

pytestmark = pytest.mark.skipif(not int8head.available(),
                                reason="this torch has no quantized engine whose int8 rows are row-exact here")

TEXT = "def add(a, b):\n    return a + b\n\nThe quick brown fox jumps over the lazy dog. 12 + 30 = 42."


def _table(n=4096, k=96, seed=0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    # Rows of very different sizes, as a trained embedding's are, and some all zero.
    table = torch.randn(n, k, generator=generator) * torch.logspace(-2, 0.5, n)[torch.randperm(n, generator=generator)][:, None]
    table[::97] = 0
    return table.to(torch.bfloat16)


def _rows(m=17, k=96, seed=1) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    rows = torch.randn(m, k, generator=generator) * torch.logspace(-3, 2, k)  # outliers, as Gemma's
    rows[2] = 0
    rows[3] *= 1e-30
    rows[4, ::3] = 0
    return rows


def _bound(head: Int8Head, rows: torch.Tensor) -> torch.Tensor:
    """What the head allows itself between an int8 logit and the exact product."""
    rows = rows.float()
    _, scales = head._approximate(rows)
    input_slack = int8head.input_error(scales, head._step)[:, None]
    return rows.abs().sum(1, keepdim=True) * head._weight_slack + input_slack * head._abs_sums


def test_each_row_is_what_that_row_alone_gives():
    head = Int8Head(_table())
    rows = _rows()
    alone = torch.cat([head(rows[i : i + 1]) for i in range(len(rows))])
    for first, count in ((0, 17), (0, 2), (3, 5), (5, 12), (16, 1)):
        assert torch.equal(head(rows[first : first + count]), alone[first : first + count]), (first, count)
    assert torch.equal(head(rows.to(torch.bfloat16)[None])[0], torch.cat(
        [head(rows.to(torch.bfloat16)[i : i + 1]) for i in range(len(rows))]))  # [1, M, K] bf16, as a model feeds it


def test_int8_logits_stay_within_their_bound_and_the_leading_ones_are_exact():
    table = _table()
    head = Int8Head(table)
    rows = _rows()
    out = head(rows)
    exact = rows.double() @ table.double().T
    approx, _ = head._approximate(rows.float())
    assert ((approx.double() - exact).abs() <= _bound(head, rows).double()).all()
    float32 = torch.nn.functional.linear(rows.float(), table.float())
    for i in range(len(rows)):
        best = int(out[i].argmax())
        assert best == int(float32[i].argmax()) == int(exact[i].argmax()) or rows[i].abs().max() == 0, i
        # The winner's logit is the table's float32 product (to float32's rounding).
        assert torch.isclose(out[i, best].double(), exact[i, best], rtol=2e-6, atol=1e-30), i


def test_ties_and_near_ties_are_decided_by_float32_products():
    table = _table(n=2048)
    table[7] = torch.randn(96, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)  # a leading token
    table[1500] = table[7]  # an exact tie with an earlier token
    table[1501] = table[7] * (1 - 2.0**-8)  # and a near one just below
    head = Int8Head(table)
    rows = table[7:8].float() * 3
    out = head(rows)[0]
    float32 = torch.nn.functional.linear(rows, table.float())[0]
    # Float32 products of equal rows may differ in their last bit with their place in a product.
    assert int(out.argmax()) in (7, 1500) and int(float32.argmax()) in (7, 1500)
    assert torch.allclose(out[[7, 1500, 1501]], float32[[7, 1500, 1501]], rtol=2e-6, atol=0)
    assert out[1501] < out[7]


@pytest.fixture(scope="module", params=["smollm2-135m", "gemma3-270m"])
def demo(request, demo_path):
    return load_model(demo_path(request.param), device="cpu", dtype="bfloat16", int8_head=True)


def _hidden(loaded, text: str) -> torch.Tensor:
    base = getattr(loaded.model, loaded.model.base_model_prefix)
    with torch.inference_mode():
        return base(input_ids=torch.tensor([loaded.tokenizer.encode(text)])).last_hidden_state[0]


def test_the_demo_heads_argmax_is_the_float32_products(demo):
    head = demo.model.get_output_embeddings()
    assert isinstance(head, Int8Head) and demo.plan.int8_head and "int8 head" in demo.plan.describe()
    table = head.table
    assert table.data_ptr() == demo.model.get_input_embeddings().weight.data_ptr()  # tied: one table
    hidden = _hidden(demo, TEXT)
    out = head(hidden)
    exact = hidden.double() @ table.double().T
    approx, _ = head._approximate(hidden.float())
    error = (approx.double() - exact).abs()
    assert (error <= _bound(head, hidden).double()).all()
    assert (out.argmax(1) == exact.argmax(1)).all()
    alone = torch.cat([head(hidden[i : i + 1]) for i in range(hidden.shape[0])])
    assert torch.equal(out, alone)


def test_verifies_give_the_one_token_steps_logits_and_lookup_keeps_the_text(demo):
    if not demo.plan.int4:
        pytest.skip("the int4 kernel does not run here: the int8 head's plan is not row-exact without it")
    ids = demo.tokenizer.encode(TEXT)
    prompt, drafts = ids[:8], ids[8:25]
    kv = demo.kv_model()
    assert torch.equal(*verify_and_steps(kv, prompt, drafts))

    settings = DecodeSettings(max_new_tokens=48, sampling=SamplingParams(temperature=0.0))
    text = "Repeat exactly: the cat sat on the mat, the cat sat on the mat, the cat sat on the mat."
    prompt_ids = demo.tokenizer.encode(text)

    def tokens(drafter):
        return [t for e in generate(demo.kv_model(), demo.tokenizer, prompt_ids, drafter, settings)
                if isinstance(e, StepEvent) for t in e.tokens]

    assert tokens(PromptLookupDrafter()) == tokens(NoDrafter())


def test_plans_offer_an_int8_head_where_it_runs_and_never_without_it(demo_path, tiny_paths, monkeypatch):
    assert not any(o.int8_head for o in cpu_plan_options(read_gguf_info(tiny_paths["llama-f32"])))  # a tiny head
    info = read_gguf_info(demo_path("smollm2-135m"))
    names = [o.name for o in cpu_plan_options(info)]
    assert "bf16-i8head" in names and cpu_plan.OPTIONS["bf16-i8head"].label == "bf16 (dequantized weights) + int8 head"
    assert cpu_plan.with_int8_head(cpu_plan.BF16_INT4) is cpu_plan.BF16_INT4_I8HEAD
    assert not cpu_plan.BF16_I8HEAD.exact_verify and cpu_plan.BF16_INT4_I8HEAD.exact_verify
    monkeypatch.setattr(int8head, "_engine", lambda: None)  # a torch without a quantized engine
    int8head.available.cache_clear()
    try:
        assert not int8head.available()
        assert not any(o.int8_head for o in cpu_plan_options(info))
        assert not load_model(demo_path("smollm2-135m"), device="cpu", dtype="bfloat16", int8_head=True).plan.int8_head
    finally:
        int8head.available.cache_clear()
