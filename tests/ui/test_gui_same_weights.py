"""A model never drafts for itself by default: a second copy of the main model's weights (a
downloaded SmolLM2 beside the built-in one) is marked in the chat's draft list and in Compare's,
and the pair picker never keeps it as the draft when that main model is chosen.

Real tiny GGUF files (tests/tiny_gguf.py); offscreen Qt. SPECULA_SHOTS saves screenshots.
"""

from __future__ import annotations

import shutil

import pytest

from app.hub.draft_verdict import SELF_DRAFT_COST
from app.hub.identity import same_header_weights, same_weights
from app.ui.models.draft_labels import SAME_WEIGHTS
from app.hub.library_entries import FILE, entry_for_file
from app.worker.requests import DEFAULT_DRAFTER, MODEL
from tests.gui_support import shot  # noqa: F401


@pytest.fixture
def copy(tiny_paths, tmp_path):
    """The main model again, as a download of it would be: another file, the same bytes."""
    return shutil.copy(tiny_paths["llama-f32"], tmp_path / "downloaded-llama-Q4.gguf")


def test_a_copy_is_the_same_weights_and_a_sibling_is_not(tiny_paths, copy, tmp_path):
    from tests.tiny_gguf import TinySpec, write_tiny_gguf

    main, twin = entry_for_file(tiny_paths["llama-f32"], FILE), entry_for_file(copy, FILE)
    # The same shapes and header size, other numbers (as a family's base and instruct models).
    other = entry_for_file(write_tiny_gguf(tmp_path / "sibling.gguf", TinySpec(seed=7)), FILE)
    assert same_weights(main.info, twin.info) and same_weights(main.info, main.info)
    assert same_header_weights(main.info, other.info) and not same_weights(main.info, other.info)


def test_the_chat_never_keeps_a_copy_of_the_main_model_as_its_draft(qtbot, data_dir, tiny_paths, copy):
    from app.ui.models.pair_picker import PairPicker

    picker = PairPicker()
    qtbot.addWidget(picker)
    picker.resize(520, 560)
    paths = [tiny_paths["llama-f32"], tiny_paths["llama-other"], copy]
    picker.set_entries([entry_for_file(p, FILE) for p in paths])
    assert picker.select_main(str(tiny_paths["llama-other"]))
    assert picker.select_draft(MODEL, str(tiny_paths["llama-f32"]))  # a fine draft for this main

    assert picker.select_main(str(copy))  # now its own weights would draft for it
    assert picker.draft_choice() == (DEFAULT_DRAFTER, None)  # the default drafter instead
    items = {text: (enabled, tip) for text, enabled, tip in picker.draft_items()}
    marked = [t for t in items if SAME_WEIGHTS in t]
    assert len(marked) == 1 and marked[0].startswith("llama-f32 —")
    assert SELF_DRAFT_COST in items[marked[0]][1]
    assert not any(SAME_WEIGHTS in t for t in items if t.startswith("llama-other"))
    picker.show()
    picker.draft_combo.showPopup()
    shot(picker.draft_combo.view(), "same-weights-chat-drafts")
    picker.draft_combo.hidePopup()

    assert picker.select_main(str(tiny_paths["llama-other"]))  # back: the user's choice returns
    assert picker.draft_choice() == (MODEL, str(tiny_paths["llama-f32"]))


def test_compare_marks_the_copy_and_never_ticks_it(qtbot, data_dir, tiny_paths, copy):
    from app.ui.compare.view import CompareWindow

    window = CompareWindow([entry_for_file(p, FILE) for p in (tiny_paths["llama-f32"], tiny_paths["llama-other"], copy)])
    qtbot.addWidget(window)
    setup = window.setup
    assert setup.select_main(str(tiny_paths["llama-other"]))
    assert setup.check_draft(MODEL, str(tiny_paths["llama-f32"]))
    assert setup.select_main(str(copy))
    texts = dict(setup.draft_texts())
    marked = [t for t in texts if SAME_WEIGHTS in t]
    assert len(marked) == 1 and texts[marked[0]]  # offered: measuring it is the user's call
    assert all(kind != MODEL or path != str(tiny_paths["llama-f32"]) for kind, path in setup._checked())
    window.resize(1100, 700)
    window.show()
    shot(window.setup, "same-weights-compare-drafts")
