"""The Compare view's headline and its way from comparison to choice: one short line (the
fastest configuration and which part of its gain is drafting, or why none won) and under it the
run's facts, a Details toggle for the per-drafter verdict, and a "Use in chat" button.

The button only says what to use (useRequested with an app.compare.fastest.Fastest, plain frozen
data); the main window applies it to the chat's pair picker and draft settings. This widget knows
nothing of the picker.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QHBoxLayout, QPushButton, QVBoxLayout, QWidget

from app.compare.fastest import Fastest
from app.compare.results import LLAMA_SERVER, MODEL, NONE, SERVER_URL
from app.ui.common.style import mute
from app.ui.common.elide import ElidedLabel
from app.worker.requests import DRAFTER_TEXT

USE_TEXT = "Use in chat"
DETAILS_TEXT = "Details"
COMMAND_TEXT = "The same from the command line (add -p or -f):"
WIN_COLOUR = "#15803d"  # app.ui.discover.text.GOOD: readable on light and dark backgrounds


class FastestRow(QWidget):
    useRequested = Signal(object)  # Fastest
    detailsToggled = Signal(bool)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.choice: Fastest | None = None
        self.label = ElidedLabel("")
        font = self.label.font()
        font.setPointSizeF(font.pointSizeF() * 1.1)
        font.setBold(True)
        self.label.setFont(font)
        self.details_button = QPushButton(DETAILS_TEXT)
        self.details_button.setCheckable(True)
        self.details_button.setToolTip("Show every drafter's verdict, the speeds' spreads and the command that "
                                       "reproduces the fastest")
        self.details_button.toggled.connect(self.detailsToggled)
        self.button = QPushButton(USE_TEXT)
        self.button.setToolTip("Pick the fastest configuration (main model, draft and draft length) in the "
                               "main window's Model tab; press Load there to chat with it")
        self.button.clicked.connect(self._on_use)
        self.facts = ElidedLabel("")  # what the run was: the model, its settings, when (the view fills it)
        font = self.facts.font()
        font.setPointSizeF(font.pointSizeF() * 0.9)
        self.facts.setFont(font)
        mute(self.facts)
        # The headline has the whole width; the buttons sit beside the facts, under it.
        under = QHBoxLayout()
        under.addWidget(self.facts, 1)
        under.addWidget(self.details_button)
        under.addWidget(self.button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(2)
        layout.addWidget(self.label)
        layout.addLayout(under)
        self.set_choice(None, False)

    def set_choice(self, choice: Fastest | None, ready: bool, headline: str = "", details: str = "") -> None:
        """Show the headline (one line, whole in its tooltip with the details); the button works
        once the run is over (`ready`) and there is a choice."""
        self.choice = choice
        self.button.setVisible(choice is not None)
        self.button.setEnabled(choice is not None and ready)
        self.details_button.setVisible(bool(details))
        # Green only for a configuration shown faster beyond noise; "no clear winner" is not good news.
        self.label.setStyleSheet(f"color: {WIN_COLOUR}" if choice is not None and choice.pays_off else "")
        self.label.set_full_text(headline, "\n\n".join(t for t in (headline, details) if t))

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
