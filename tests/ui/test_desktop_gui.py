"""The desktop app's face in the real window: its icon, and the first-launch page that says what
to do when no model is loaded (demo model, Discover, add a folder).

Screenshots go to /tmp/specula-shots/ (empty*.png, icon.png) so a person can look at them.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QImage, QPainter
from PySide6.QtWidgets import QApplication, QFileDialog

from app.desktop_entry import ICON_SIZES
from app.hub.builtin import builtin_path
from app.ui.shell.launch import make_app
from app.worker.requests import DEFAULT_DRAFTER, NONE
from tests.gui_support import WAIT_MS, add_models, load_pair, open_window  # noqa: F401

SHOTS = Path("/tmp/specula-shots")


def save_shot(widget, name: str) -> None:
    for _ in range(3):  # resize events, then the layouts they invalidate
        QApplication.processEvents()
    SHOTS.mkdir(parents=True, exist_ok=True)
    assert widget.grab().save(str(SHOTS / f"{name}.png"))


def test_window_gets_the_app_icon_at_every_size(qtbot, data_dir):
    app = make_app()  # what `specula` does before opening the window
    assert app.desktopFileName() == "io.github.specula.Specula"
    window = open_window(qtbot)
    icon = window.windowIcon()
    assert not icon.isNull()
    sizes = {(s.width(), s.height()) for s in icon.availableSizes()}
    assert sizes == {(n, n) for n in ICON_SIZES}
    # A sheet of the icon as the desktop shows it, from 16 px up, for a person to look at.
    sheet = QImage(16 + 32 + 48 + 64 + 128 + 6 * 12, 140, QImage.Format.Format_ARGB32)
    sheet.fill(QColor("#f4f4f5"))
    painter = QPainter(sheet)
    x = 6
    for n in (16, 32, 48, 64, 128):
        pixmap = icon.pixmap(n, n)
        assert (pixmap.width(), pixmap.height()) == (n, n)
        painter.drawPixmap(x, 6, pixmap)
        x += n + 12
    painter.end()
    SHOTS.mkdir(parents=True, exist_ok=True)
    assert sheet.save(str(SHOTS / "icon.png"))


def test_first_launch_shows_what_to_do_instead_of_an_empty_chat(qtbot, data_dir, tiny_paths, monkeypatch):
    window = open_window(qtbot)
    panel, page = window.panel, window.panel.empty_state
    assert panel.empty_state_shown() and page.isVisible() and not panel.view.isVisible()
    assert page.demo_button.isEnabled() and "SmolLM2" in page.demo_note.text()
    save_shot(window, "empty")
    save_shot(panel, "empty-panel")
    window.resize(900, 640)  # a small window: each note under its button, nothing is cut
    save_shot(window, "empty-narrow")
    assert page.width() < 540 and page.demo_note.y() > page.demo_button.y() + page.demo_button.height() - 1
    assert page.demo_note.height() >= page.demo_note.heightForWidth(page.demo_note.width())

    qtbot.mouseClick(page.discover_button, Qt.MouseButton.LeftButton)
    assert window.models_tabs.currentWidget() is window.discover

    # "Add a folder…": the folder dialog (answered here) adds it to the library.
    folder = tiny_paths["llama-f32"].parent
    monkeypatch.setattr(QFileDialog, "getExistingDirectory", lambda *a, **k: str(folder))
    qtbot.mouseClick(page.folder_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not window.library.is_scanning()
                    and str(tiny_paths["llama-f32"]) in {e.path for e in window.library.entries()}, timeout=WAIT_MS)
    assert str(folder) in window.library.folders()

    # A model loaded from the Model tab: the page gives way to the (empty) conversation.
    load_pair(qtbot, window, tiny_paths["llama-f32"], NONE)
    qtbot.waitUntil(lambda: not panel.empty_state_shown(), timeout=5000)  # its own queued signal
    assert panel.view.isVisible()


def test_a_chat_with_messages_is_shown_even_with_no_model(qtbot, data_dir):
    window = open_window(qtbot)
    assert window.panel.empty_state_shown()
    chat_id = window.store.new_chat("Earlier chat")
    window.store.add_message(chat_id, "user", "hello from yesterday")
    window.controller.open_chat(chat_id)
    assert not window.panel.empty_state_shown()
    assert "hello from yesterday" in window.panel.view.document().toPlainText()
    window.controller.new_chat()  # an empty chat, still no model: what to do, again
    assert window.panel.empty_state_shown()


def test_a_failed_load_says_why_on_the_page(qtbot, data_dir, tiny_paths, tmp_path):
    window = open_window(qtbot)
    doomed = tmp_path / "moved-away.gguf"
    shutil.copyfile(tiny_paths["llama-f32"], doomed)
    add_models(qtbot, window, [doomed])
    assert window.picker.select_main(str(doomed))
    doomed.unlink()  # gone between listing and loading: the load fails with a reason
    qtbot.mouseClick(window.picker.load_button, Qt.MouseButton.LeftButton)
    page = window.panel.empty_state
    qtbot.waitUntil(lambda: page.status.text().startswith("Not loaded:"), timeout=WAIT_MS)
    assert window.loaded_facts is None and window.panel.empty_state_shown()
    assert page.status.isVisible() and page.status.text().startswith("Not loaded:")
    assert "moved-away.gguf" in page.status.text()
    assert page.demo_button.isEnabled() and page.demo_button.text() == "Load the demo model"


def test_an_unavailable_demo_stays_disabled_with_the_reason(qtbot):
    from app.ui.chat.empty_state import EmptyState

    page = EmptyState()
    qtbot.addWidget(page)
    page.show()
    page.set_demo_available(False, "The demo model is not installed.")
    page.set_loading(True)
    page.set_loading(False)  # a load from the Model tab ended: still nothing to load here
    assert not page.demo_button.isEnabled() and page.demo_button.toolTip() == "The demo model is not installed."
    page.set_demo_available(False, "The demo model is not installed.")
    assert page.status.isVisible() and "not installed" in page.status.text()


@pytest.mark.demo
def test_demo_button_loads_the_built_in_model_with_the_default_drafter(qtbot, data_dir):
    window = open_window(qtbot)
    page = window.panel.empty_state
    qtbot.mouseClick(page.demo_button, Qt.MouseButton.LeftButton)
    assert not page.demo_button.isEnabled() and page.demo_button.text() == "Loading…"
    save_shot(window, "empty-loading")
    qtbot.waitUntil(lambda: window.loaded_facts is not None and not window.panel.empty_state_shown(), timeout=WAIT_MS)
    facts = window.loaded_facts
    assert facts.main_path == str(builtin_path("smollm2-135m")) and facts.drafter == DEFAULT_DRAFTER
    assert window.panel.view.isVisible()
    assert window.picker.loaded_spec().drafter == DEFAULT_DRAFTER
    save_shot(window, "empty-after-demo-loaded")
