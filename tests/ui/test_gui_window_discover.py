"""Discover inside the main window: a model found and downloaded there becomes a usable library
entry and main model, Discover judges drafts against the main model the chat loaded (before that,
the largest in the library), and on a laptop's screen a file's facts, its Download button and the
download's progress are in sight without scrolling."""

from __future__ import annotations

from pathlib import Path

import pytest
from huggingface_hub import constants
from PySide6.QtCore import QPoint, QRect

from tests.hf_server import BIG_FILE, REPO_BIG, REPO_MID, REPO_SMALL, fake_hub, hub, hub_files  # noqa: F401
from tests.gui_support import WAIT_MS, load_pair, open_window, shot
from tests.ui.test_gui_discover import CHUNK, browse


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

    # With that main model loaded, Discover checks another file as its draft.
    assert panel._main is not None and panel._main.vocab_size == 559
    assert panel.chooser.current().key == path
    browse(qtbot, panel, REPO_SMALL, "Tiny-Llama-1L-F32.gguf")
    qtbot.waitUntil(lambda: "As a draft" in panel.details.text(), timeout=WAIT_MS)
    assert "cannot draft" not in panel.details.text()


def test_before_a_model_is_loaded_drafts_are_judged_against_the_largest(qtbot, hub, tmp_path, monkeypatch):
    """Issue 60 item 4: a fresh window's picker shows the demo model nobody chose, and Discover
    judged every file against it."""
    monkeypatch.setenv("SPECULA_DATA_DIR", str(tmp_path / "specula-data"))
    window = open_window(qtbot)
    usable = [e for e in window.library.entries() if e.usable]
    largest = max(usable, key=lambda e: e.info.n_params)
    assert window.discover.chooser.current().key == largest.path
    assert window.discover.chooser.combo.count() == len(usable)


def fully_in_sight(widget, window) -> bool:
    """The widget is shown whole: inside the window, and not cut by any scrolling parent."""
    top_left = widget.mapTo(window, QPoint(0, 0))
    inside = QRect(0, 0, window.width(), window.height()).contains(QRect(top_left, widget.size()))
    return widget.isVisible() and inside and widget.visibleRegion().boundingRect() == widget.rect()


def facts_in_sight(panel, window) -> int:
    """How many pixels of the facts' first lines are in sight, from their top (0: none)."""
    seen = panel.details.visibleRegion().boundingRect()
    box = panel.details_box
    top = box.mapTo(window, QPoint(0, 0))
    inside = QRect(0, 0, window.width(), window.height()).contains(QRect(top, box.size()))
    return seen.height() if inside and seen.top() == 0 else 0


@pytest.mark.parametrize("size", [(1280, 720), (1440, 900)])
def test_a_files_facts_download_and_progress_are_in_sight_on_a_laptop_screen(qtbot, hub, tmp_path, monkeypatch, size):
    """Issue 60 item 9: at 1280x720 and 1440x900 the facts, Download and the progress bar were
    below the fold of the scrolling panel; and a resumed download left the status bar saying
    "cancelled ... download it again to resume"."""
    monkeypatch.setenv("SPECULA_DATA_DIR", str(tmp_path / "specula-data"))
    window = open_window(qtbot)
    window.resize(*size)
    messages = []
    window.discover.statusMessage.connect(messages.append)
    window.models_tabs.setCurrentWidget(window.discover)
    panel = window.discover
    browse(qtbot, panel, REPO_BIG, BIG_FILE)
    line = panel.fontMetrics().lineSpacing()
    assert fully_in_sight(panel.download_button, window) and fully_in_sight(panel.draft_button, window)
    assert fully_in_sight(panel.chooser.combo, window)
    assert facts_in_sight(panel, window) >= 4 * line  # the first lines: the fit and the draft verdict

    hub.faults.throttle_bps = 1 << 20
    panel.download_button.click()
    qtbot.waitUntil(lambda: panel.strip.last is not None and panel.strip.last.done >= CHUNK, timeout=WAIT_MS)
    assert fully_in_sight(panel.strip.bar, window) and fully_in_sight(panel.strip.button, window)
    assert fully_in_sight(panel.strip.detail, window) and facts_in_sight(panel, window) >= 3 * line
    shot(window, f"60-9-discover-downloading-{size[0]}x{size[1]}")
    panel.strip.button.click()  # Cancel
    qtbot.waitUntil(lambda: panel.strip.state == "stopped", timeout=WAIT_MS)
    assert "download it again to resume" in messages[-1]
    window.show_message(messages[-1])  # as the window's status bar shows it
    panel.strip.button.click()  # Resume
    assert messages[-1] == f"resuming {REPO_BIG}/{BIG_FILE} where it stopped"
    assert window.statusBar().currentMessage() == messages[-1]  # the "cancelled" line is gone
    shot(window, f"60-9-discover-resuming-{size[0]}x{size[1]}")
    panel.cancel_download()
    qtbot.waitUntil(lambda: panel.strip.state == "stopped", timeout=WAIT_MS)
