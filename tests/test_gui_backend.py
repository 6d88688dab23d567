"""The Model tab says what runs the models and why, lets the user choose, and remembers it."""

from __future__ import annotations

import json

from app.worker.requests import LOOKUP
from tests.llama_support import require_llama_cpp
from tests.test_gui import add_models, data_dir, load_pair, open_window, shot  # noqa: F401


def test_the_backend_is_chosen_shown_with_its_reason_and_remembered(qtbot, data_dir, tiny_paths):
    require_llama_cpp()
    window = open_window(qtbot)
    picker = window.picker
    add_models(qtbot, window, [tiny_paths["llama-q8"]])
    assert picker.backend() == "auto" and not picker.int4_check.isVisibleTo(picker)
    facts = load_pair(qtbot, window, tiny_paths["llama-q8"], LOOKUP)
    assert facts["backend"] == "llama.cpp"
    line = picker.plan_label.text()
    assert line.startswith("Runs on llama.cpp on CPU · Q8_0 · ") and "tok/s without drafting" in line
    assert "llama.cpp" in window.pair_label.text()
    shot(window, "backend-llama-cpp")

    picker.set_backend("torch")
    assert picker.int4_check.isVisibleTo(picker) and picker.spec().backend == "torch"
    facts = load_pair(qtbot, window, tiny_paths["llama-q8"], LOOKUP)
    assert facts["backend"] == "torch"
    assert picker.plan_label.text().startswith("Runs on torch (as asked) · CPU")
    shot(window, "backend-torch")
    assert json.loads(window.settings.value("pair/last"))["backend"] == "torch"
    window.close()

    again = open_window(qtbot)
    assert again.picker.backend() == "torch"
