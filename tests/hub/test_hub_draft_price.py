"""A draft's verdict says what this machine's measured steps predict (issue 60 item 4): Discover said
"✓ drafts token by token, 35% of its size" for Qwen2.5-Coder 0.5B under the 1.5B where, on a 2-core
CPU, every draft step was declined. The step costs are llama.cpp's own, measured on real tiny GGUF
files and kept by app.engine.backends.llamacpp.cost as a load keeps them."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.engine.backends.llamacpp import cost
from app.engine.backends.llamacpp import lib as llamacpp_lib
from app.engine.backends.llamacpp.kv import LlamaSettings, LlamaWeights
from app.engine.drafting.compat import check_draft
from app.engine.gguf.info import read_gguf_info
from app.engine.loop.explain import break_even
from app.hub.draft_price import DraftPrice, measured_curve, price_draft
from app.hub.draft_verdict import NO_GAIN, PAYS, UNPRICED, draft_verdict
from tests.hf_server import hub_files  # noqa: F401 (a fixture)


def measure_here(path: Path) -> cost.StepCurve:
    """What loading the model in the window does: measure llama.cpp's steps and keep the curve."""
    weights = LlamaWeights(path, 0, LlamaSettings())
    try:
        curve, _steady = cost.measure(weights)
        cost.store(weights, llamacpp_lib.build_key(), curve)  # kept even if another program was busy
    finally:
        weights.close()
    return curve


@pytest.fixture(scope="module")
def measured(tiny_paths, hub_files):
    """The 4-layer main model and the 1-layer draft, each measured here once."""
    return {name: measure_here(hub_files[name]) for name in ("big", "small")}


def test_a_draft_is_priced_by_the_steps_measured_here(measured, hub_files):
    main, draft = read_gguf_info(hub_files["big"]), read_gguf_info(hub_files["small"])
    main_curve = measured_curve(hub_files["big"], main.n_layers)
    assert main_curve is not None and main_curve.points == measured["big"].points

    price = price_draft(main, hub_files["big"], draft, hub_files["small"])
    token = measured["small"].cost(1) / measured["big"].cost(1)
    expected = break_even(lambda k: main_curve.ratio(k + 1) + k * token, token, None)
    assert price.measured_draft and price.draft_token == pytest.approx(token)
    assert (price.verify_4, price.acceptance, price.length) == (expected.verify_4, expected.acceptance, expected.length)
    assert f"a drafted token costs {token:.2f}x a main-model token here" in price.prices()

    guessed = price_draft(main, hub_files["big"], draft)  # the draft never loaded here: by its size
    assert not guessed.measured_draft
    assert guessed.draft_token == pytest.approx(draft.memory_bytes("gguf") / main.memory_bytes("gguf"))
    assert "(by its size: it was never loaded here)" in guessed.prices()

    verdict = draft_verdict(check_draft(main, draft), draft, main, price=price)
    assert price.prices() in verdict.text and UNPRICED not in verdict.text


def test_nothing_is_predicted_for_a_main_model_never_measured(hub_files, tmp_path):
    main, draft = read_gguf_info(hub_files["mid"]), read_gguf_info(hub_files["small"])
    copy = tmp_path / "never-loaded.gguf"
    copy.write_bytes(hub_files["mid"].read_bytes())
    assert measured_curve(copy, main.n_layers) is None and measured_curve(None, 1) is None
    assert price_draft(main, copy, draft) is None and price_draft(main, None, draft) is None
    verdict = draft_verdict(check_draft(main, draft), draft, main, price=None)
    assert verdict.kind == PAYS and verdict.text.endswith(UNPRICED)


@pytest.mark.parametrize("price, kind, words", [
    # The real pair on this project's 2-core CPU: 0.62x a token, a verify of 4 drafts 2.4x.
    (DraftPrice(0.62, True, 2.44, 0.99, 16), NO_GAIN,
     "but will hardly pay on this machine: a drafted token costs 0.62x a main-model token here and a verify "
     "of 4 drafts 2.4x, so it needs 99% of its drafts accepted (16 a step) to pay"),
    (DraftPrice(0.65, True, 3.7, None, 0), NO_GAIN,
     "but will not pay on this machine: a drafted token costs 0.65x a main-model token here and a verify of "
     "4 drafts 3.7x, so no draft length pays even with every token accepted"),
    (DraftPrice(0.08, False, 1.3, 0.35, 5), PAYS,
     "; it pays here with 35% of its drafts accepted (5 a step) or more: a drafted token costs about 0.08x"),
])
def test_the_verdict_says_what_the_prices_predict(hub_files, price, kind, words):
    main, draft = read_gguf_info(hub_files["big"]), read_gguf_info(hub_files["small"])
    verdict = draft_verdict(check_draft(main, draft), draft, main, price=price)
    assert verdict.kind == kind and words in verdict.text
    assert verdict.text.startswith("drafts token by token (same vocabulary), ")
