"""One file, one entry (issue 52 item 5): a downloaded copy of the built-in SmolLM2 (in a folder
the user added, and as a single file the user added) is not a second model in the Library, the
main list or the draft list. The built-in entry keeps it, Remove forgets the added copy, and the
built-in file stays. Real GGUF files, offscreen Qt; SPECULA_SHOTS saves the screenshot."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from PySide6.QtCore import Qt

from tests.gui_support import WAIT_MS, open_window, shot  # noqa: F401

TITLE = "SmolLM2 135M Instruct (Q4_1)"


@pytest.mark.demo
def test_a_copy_of_the_built_in_model_is_one_entry_everywhere(qtbot, data_dir, demo_path, tmp_path):
    builtin_file = demo_path("smollm2-135m")
    downloads, elsewhere = tmp_path / "Downloads", tmp_path / "elsewhere"
    downloads.mkdir()
    elsewhere.mkdir()
    in_folder = shutil.copy(builtin_file, downloads / "SmolLM2-135M-Instruct-Q4_1.gguf")
    single = str(shutil.copy(builtin_file, elsewhere / "smollm2-copy.gguf"))

    window = open_window(qtbot)
    window.library.add_folder(str(downloads))
    window.library.add_files([single])
    qtbot.waitUntil(lambda: not window.library.is_scanning()
                    and any(e.copies for e in window.library.entries()), timeout=WAIT_MS)
    qtbot.waitUntil(lambda: not window.library.is_scanning(), timeout=WAIT_MS)

    entries = window.library.entries()
    smollm = [e for e in entries if e.info is not None and e.info.vocab_size == 49152]
    assert [(e.title, e.source) for e in smollm] == [(TITLE, "builtin")]
    assert set(smollm[0].copies) == {str(in_folder), single}
    tree = window.library.tree
    rows = [tree.topLevelItem(i) for i in range(tree.topLevelItemCount())]
    assert [r.text(1) for r in rows if r.text(0) == TITLE] == ["built-in"]
    assert not any("(= built-in)" in r.text(1) for r in rows)

    picker = window.picker
    mains = [picker.main_combo.itemText(i) for i in range(picker.main_combo.count())]
    assert sum(TITLE in t for t in mains) == 1, mains
    assert picker.select_main(single)  # a pair saved with the copy selects the built-in entry
    assert picker.main_path() == str(builtin_file)
    gemma = next(e for e in entries if e.source == "builtin" and e.title.startswith("Gemma"))
    assert picker.select_main(gemma.path)  # SmolLM2 drafts for it through text: offered once
    drafts = [text for text, _, _ in picker.draft_items()]
    assert sum(TITLE in t for t in drafts) == 1, drafts

    window.models_tabs.setCurrentWidget(window.library)
    row = next(r for r in rows if r.text(0) == TITLE)
    tree.setCurrentItem(row)
    assert window.library.details.text().count("(the same file, listed once)") == 2
    shot(window, "52-5-one-entry")

    qtbot.mouseClick(window.library.remove_button, Qt.MouseButton.LeftButton)  # forgets both copies
    qtbot.waitUntil(lambda: not window.library.is_scanning()
                    and not any(e.copies for e in window.library.entries()), timeout=WAIT_MS)
    assert window.library.files() == [] and window.library.folders() == []
    assert Path(builtin_file).exists() and Path(single).exists()  # forgetting deletes nothing
