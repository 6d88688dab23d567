"""What the window's tests share: the real MainWindow opened offscreen, models added and loaded
through its own controls, a reply sent with Ctrl+Enter, screenshots (SPECULA_SHOTS=/some/folder
saves them) and the settings they reply with. The data_dir fixture is conftest.py's."""

from __future__ import annotations

import os
from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication

from app.ui.chat.history import HistoryStore
from app.ui.shell.main_window import MainWindow
from app.worker.requests import NONE, GenSettings

WAIT_MS = 120_000
GREEDY = GenSettings(temperature=0.0, max_tokens=48)
# A tiny main model's step costs about what its tiny draft's does, so whether the adaptive length
# drafts there at all depends on the machine's measured costs: tests that must see drafts draft a
# fixed length (the schedule's choices are tested in test_schedule).
GREEDY_FIXED = GenSettings(temperature=0.0, max_tokens=48, adaptive_draft=False)
LONG = GenSettings(temperature=0.0, max_tokens=400)


def shot(widget, name: str) -> None:
    """Save a screenshot of a window or widget when SPECULA_SHOTS names a folder."""
    folder = os.environ.get("SPECULA_SHOTS")
    if folder:
        QApplication.processEvents()
        Path(folder).mkdir(parents=True, exist_ok=True)
        widget.grab().save(str(Path(folder) / f"{name}.png"))


def open_window(qtbot) -> MainWindow:
    window = MainWindow()
    qtbot.addWidget(window)  # closed (and shut down) at the end of the test
    window.resize(1440, 900)
    window.show()
    qtbot.waitUntil(lambda: bool(window.library.entries()) and not window.library.is_scanning(), timeout=WAIT_MS)
    return window


def add_models(qtbot, window, paths) -> None:
    window.library.add_files([str(p) for p in paths])
    wanted = {str(p) for p in paths}
    qtbot.waitUntil(lambda: not window.library.is_scanning()
                    and wanted <= {e.path for e in window.library.entries()}, timeout=WAIT_MS)


def load_pair(qtbot, window, main, kind=NONE, draft=None) -> dict:
    picker = window.picker
    assert picker.select_main(str(main)), f"{main} is not selectable"
    assert picker.select_draft(kind, str(draft) if draft else None), f"draft {kind} {draft} not selectable"
    qtbot.mouseClick(picker.load_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not picker.cancel_button.isEnabled(), timeout=WAIT_MS)
    assert window.loaded_facts is not None, picker.state_label.text()
    return window.loaded_facts


def start_reply(qtbot, window, text: str, settings: GenSettings = GREEDY) -> None:
    window.gen_form.set_settings(settings)
    window.panel.input.setPlainText(text)
    qtbot.keyClick(window.panel.input, Qt.Key.Key_Return, Qt.KeyboardModifier.ControlModifier)
    assert window.controller.busy, "Ctrl+Enter did not send"


def send(qtbot, window, text: str, settings: GenSettings = GREEDY) -> dict:
    with qtbot.waitSignal(window.controller.replyFinished, timeout=WAIT_MS) as blocker:
        start_reply(qtbot, window, text, settings)
    summary, error = blocker.args
    assert error == "", error
    return summary


def marked_chars(view) -> int:
    """Characters the conversation view shows with the accepted-draft highlight."""
    count, block = 0, view.document().begin()
    while block.isValid():
        for span in block.textFormats():
            if span.format.background().color() == view.theme.draft:
                count += span.length
        block = block.next()
    return count


def visible_text(window) -> str:
    return window.panel.view.document().toPlainText()


def reopen_store(data_dir: Path) -> HistoryStore:
    return HistoryStore(data_dir / "history.sqlite3")
