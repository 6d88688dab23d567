"""The Model tab says what runs the models and why, lets the user choose, and remembers it."""

from __future__ import annotations

import json

from app.worker.requests import LOOKUP
from tests.llama_support import require_llama_cpp
from tests.gui_support import add_models, load_pair, open_window, shot  # noqa: F401


def test_the_backend_is_chosen_shown_with_its_reason_and_remembered(qtbot, data_dir, tiny_paths):
    require_llama_cpp()
    window = open_window(qtbot)
    picker = window.picker
    add_models(qtbot, window, [tiny_paths["llama-q8"]])
    assert picker.backend() == "auto"
    facts = load_pair(qtbot, window, tiny_paths["llama-q8"], LOOKUP)
    assert facts.backend == "llama.cpp"
    line = picker.plan_label.text()
    assert line.startswith("Runs on llama.cpp on CPU · Q8_0 · ") and "tok/s without drafting" in line
    assert "llama.cpp" in window.pair_label.text()
    shot(window, "backend-llama-cpp")

    picker.set_backend("torch")
    assert picker.spec().backend == "torch"
    facts = load_pair(qtbot, window, tiny_paths["llama-q8"], LOOKUP)
    assert facts.backend == "torch"
    assert picker.plan_label.text().startswith("Runs on torch (as asked) · CPU")
    shot(window, "backend-torch")
    assert json.loads(window.settings.value("pair/last"))["backend"] == "torch"
    window.close()

    again = open_window(qtbot)
    assert again.picker.backend() == "torch"


def test_progress_text_is_never_clipped(qtbot, data_dir):
    window = open_window(qtbot)
    bar = window.picker.progress
    stage = "main model: measuring llama.cpp's steps here (once per model) on a very long file name.gguf"
    window.picker.set_progress(stage, 0.42)
    # The bar shows the share; the stage reads whole on the wrapping line under it (issue 60
    # item 10: cut to the bar's width it read "main model: meas…(once per model)").
    label = window.picker.state_label
    assert bar.text() == "42%" and bar.toolTip() == stage
    assert label.text() == stage and label.wordWrap()
    window.picker.set_progress("reading weights", 0.5)
    assert bar.text() == "50%" and label.text() == "reading weights"
