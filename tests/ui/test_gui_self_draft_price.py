"""A model as its own draft has one price everywhere (issue 52 item 3): Discover, the pair picker
and the chat's note under the reply say a drafted token costs as much as a main-model token, from
one measurement of the weights' step (the copy used to measure its own, moments after the main
model's, and the note said 1.95x)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from app.hub.draft_verdict import NO_GAIN, SELF_DRAFT_COST, draft_verdict
from app.engine.drafting.compat import check_draft
from app.engine.gguf.info import read_gguf_info
from app.worker.requests import MODEL, GenSettings
from tests.gui_support import add_models, load_pair, open_window, send, shot, visible_text  # noqa: F401


@pytest.fixture
def smollm2_and_copy(tmp_path):
    from app.hub.builtin import builtin_path
    from tests.llama_support import require_llama_cpp

    require_llama_cpp()
    main = builtin_path("smollm2-135m")
    copy = Path(shutil.copy(main, tmp_path / "SmolLM2-135M-Instruct-downloaded.gguf"))
    # The same weights under another header (its general.name edited in place, same length): a
    # byte copy would be the built-in entry itself, listed once (issue 52 item 5).
    data = bytearray(copy.read_bytes())
    name = read_gguf_info(main).name.encode()
    at = data.index(name)
    data[at:at + len(name)] = name[:-1] + (b"X" if name[-1:] != b"X" else b"Y")
    copy.write_bytes(bytes(data))
    return main, copy


@pytest.mark.demo
def test_one_measurement_prices_the_copy_as_the_main_model(smollm2_and_copy):
    from app.engine.drafting.drafters import ModelDrafter
    from app.engine.loader import load_model

    main_path, copy = smollm2_and_copy
    main, draft = load_model(main_path, backend="llama.cpp"), load_model(copy, backend="llama.cpp")
    assert draft.model.step_curve is main.model.step_curve
    main_kv = main.kv_model()
    drafter = ModelDrafter(draft.kv_model(), main_kv.vocab_size)
    assert drafter.token_cost_s() / main_kv.step_cost(1) == 1.0


@pytest.mark.demo
def test_discover_the_picker_and_the_note_say_the_same_price(qtbot, data_dir, smollm2_and_copy):
    main, copy = smollm2_and_copy
    main_info, copy_info = read_gguf_info(main), read_gguf_info(copy)
    verdict = draft_verdict(check_draft(main_info, copy_info), copy_info, main_info)
    assert verdict.kind == NO_GAIN and SELF_DRAFT_COST in verdict.text  # Discover's line

    window = open_window(qtbot)
    add_models(qtbot, window, [copy])
    picker = window.picker
    assert picker.select_main(str(main)) and picker.select_draft(MODEL, str(copy))
    assert SELF_DRAFT_COST in picker.draft_combo.itemData(picker.draft_combo.currentIndex(), 3)  # tooltip
    load_pair(qtbot, window, main, MODEL, copy)
    summary = send(qtbot, window, "Name three colours.", GenSettings(temperature=0.0, max_tokens=24))
    note = summary["schedule_note"] or ""
    assert note.startswith("drafting declined in all") and note in visible_text(window), note
    if "a drafted token costs" in note:  # the schedule names the draft's price where it never drafted
        assert "a drafted token costs 1.00x a main-model token" in note, note
    window.picker.draft_combo.setToolTip(picker.draft_combo.itemData(picker.draft_combo.currentIndex(), 3))
    shot(window, "52-3-self-draft-price")
