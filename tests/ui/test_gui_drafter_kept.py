"""Changing the main model keeps the user's drafter where it still fits (issue 52 item 13): a
text-level draft fits any main model; where the draft model cannot stay, the picker says why
beside the drafter, and the draft comes back with a main model it fits again."""

from __future__ import annotations

from app.worker.requests import DEFAULT_DRAFTER, DRAFTER_TEXT, MODEL
from tests.gui_support import add_models, open_window, shot  # noqa: F401


def test_the_drafter_stays_where_it_fits_and_says_why_where_not(qtbot, data_dir, tiny_paths):
    window = open_window(qtbot)
    picker = window.picker
    names = ["llama-f32", "qwen2-f32", "llama-q8", "llama-b"]
    add_models(qtbot, window, [tiny_paths[n] for n in names])
    path = {n: str(tiny_paths[n]) for n in names}

    assert picker.select_main(path["llama-f32"]) and picker.select_draft(MODEL, path["llama-b"])
    assert picker.select_main(path["qwen2-f32"])  # another family: llama-b still drafts, through text
    assert picker.draft_choice() == (MODEL, path["llama-b"])

    assert picker.select_draft(MODEL, path["llama-q8"])
    assert picker.select_main(path["llama-q8"])  # the draft became the main model
    assert picker.draft_choice() == (DEFAULT_DRAFTER, None)
    assert f"llama-q8 is now the main model: {DRAFTER_TEXT[DEFAULT_DRAFTER]} instead" in picker.draft_facts.text()
    shot(window, "52-13-drafter-replaced")
    assert picker.select_main(path["llama-f32"])  # and it comes back where it fits again
    assert picker.draft_choice() == (MODEL, path["llama-q8"])
    assert "instead" not in picker.draft_facts.text()
