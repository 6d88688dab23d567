"""The Compare view's way from comparison to choice: under the verdict, the fastest configuration
and a "Use in chat" button.

The button only says what to use (useRequested with an app.compare.fastest.Fastest, plain frozen
data); the main window applies it to the chat's pair picker and draft settings. This widget knows
nothing of the picker.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QHBoxLayout, QLabel, QPushButton, QWidget

from app.compare.fastest import Fastest, run_command
from app.compare.results import LLAMA_SERVER, MODEL, NONE, SERVER_URL
from app.worker.requests import DRAFTER_TEXT

USE_TEXT = "Use in chat"
WIN_COLOUR = "#15803d"  # app.ui.discover.text.GOOD: readable on light and dark backgrounds


class FastestRow(QWidget):
    useRequested = Signal(object)  # Fastest

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.choice: Fastest | None = None
        self.label = QLabel("")
        self.label.setWordWrap(True)
        self.button = QPushButton(USE_TEXT)
        self.button.setToolTip("Pick the fastest configuration (main model, draft and draft length) in the "
                               "main window's Model tab; press Load there to chat with it")
        self.button.clicked.connect(self._on_use)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.label, 1)
        layout.addWidget(self.button)
        self.set_choice(None, False)

    def set_choice(self, choice: Fastest | None, ready: bool) -> None:
        """Show the fastest configuration; the button works once the run is over (`ready`)."""
        self.choice = choice
        self.setVisible(choice is not None)
        self.button.setEnabled(choice is not None and ready)
        if choice is None:
            return
        # Green only for a drafter shown faster beyond noise; "no clear winner" is not good news.
        self.label.setStyleSheet(f"color: {WIN_COLOUR}" if choice.pays_off else "")
        self.label.setText(f"Fastest: {choice.describe()}" if choice.pays_off else choice.describe().capitalize())
        self.label.setToolTip(f"The same from the command line (add -p or -f):\n{run_command(choice)}")

    def _on_use(self) -> None:
        if self.choice is not None:
            self.useRequested.emit(self.choice)


def applied_text(choice: Fastest, main_title: str, draft_title: str | None) -> str:
    """The main window's status line once the choice is in the pair picker."""
    if choice.drafter == NONE:
        return (f"From the comparison: no drafter was clearly faster than plain decoding here, so "
                f"{main_title} with no draft — press Load")
    if choice.drafter == SERVER_URL:
        return f"From the comparison ({choice.describe()}): the server at {choice.server_url} — press Load"
    if choice.drafter == LLAMA_SERVER:
        return (f"From the comparison ({choice.describe()}): {main_title} on llama-server, --spec-type "
                f"{choice.server_types or 'none'} — press Load")
    if choice.drafter == MODEL:
        draft = draft_title or Path(choice.draft_path or "").stem
    else:  # an n-gram kind: what the pair picker calls it
        draft = DRAFTER_TEXT.get(choice.drafter, choice.drafter)
    length = f"draft max {choice.draft_max}" + ("" if choice.adaptive else " (fixed)")
    return f"From the comparison ({choice.describe()}): {main_title} with {draft}, {length} — press Load"
