"""Discover inside the main window: a model found and downloaded there becomes a usable library
entry and main model, and Discover judges drafts against the main model picked in the window."""

from __future__ import annotations

from pathlib import Path

from huggingface_hub import constants

from tests.hf_server import REPO_MID, REPO_SMALL, fake_hub, hub, hub_files  # noqa: F401
from tests.gui_support import WAIT_MS, load_pair, open_window
from tests.ui.test_gui_discover import browse


def test_download_in_discover_lands_in_the_library_and_loads(qtbot, hub, tmp_path, monkeypatch, hub_files):
    monkeypatch.setenv("SPECULA_DATA_DIR", str(tmp_path / "specula-data"))
    window = open_window(qtbot)
    window.models_tabs.setCurrentWidget(window.discover)
    panel = window.discover
    browse(qtbot, panel, REPO_MID, "Tiny-Llama-2L-Q8_0.gguf")
    with qtbot.waitSignal(panel.downloaded, timeout=WAIT_MS) as done:
        panel.download_button.click()
    path = done.args[0]
    assert Path(path).is_relative_to(constants.HF_HUB_CACHE)
    qtbot.waitUntil(lambda: not window.library.is_scanning()
                    and any(e.path == path and e.usable for e in window.library.entries()), timeout=WAIT_MS)
    facts = load_pair(qtbot, window, path)  # the downloaded file is a main model like any other
    assert facts.main_path == path

    # With that main model chosen, Discover checks another file as its draft.
    assert panel._main is not None and panel._main.vocab_size == 559
    browse(qtbot, panel, REPO_SMALL, "Tiny-Llama-1L-F32.gguf")
    qtbot.waitUntil(lambda: "As a draft for" in panel.details.text(), timeout=WAIT_MS)
    assert "cannot draft" not in panel.details.text()
