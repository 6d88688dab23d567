"""Which main model Discover judges drafts against: a list of the models the user has, the chat's
chosen main model first in line, and any hub model the user asked drafts for.

A verdict against whatever main model happens to be selected misleads: fetching Qwen2.5-Coder 0.5B
for the 1.5B, Discover judged it against the demo SmolLM2 the chat had loaded ("will not pay: 468%
of its size"). So the user picks the main model here; it follows the chat's choice whenever that
changes and otherwise stays, and without one it is the largest model in the library.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QComboBox, QHBoxLayout, QLabel, QPushButton, QSizePolicy, QWidget

from app.engine.gguf.info import GGUFInfo


@dataclass(frozen=True)
class MainCandidate:
    key: str  # a local file's path, or "hub:repo/file"
    title: str  # as the library names it
    info: GGUFInfo
    path: str | None  # the file on this disk (its measured steps price drafts); None on the hub
    repo_id: str | None = None  # its repository on the hub, left out of its own draft search


class MainChooser(QWidget):
    """'As a draft for: [model ▾] [Find drafts]'. changed() when the judged model changes;
    findRequested() asks for a hub search of drafts for it."""

    changed = Signal()
    findRequested = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._library: list[MainCandidate] = []
        self._chat: MainCandidate | None = None
        self._hub: list[MainCandidate] = []  # hub models the user asked drafts for
        self.combo = QComboBox()
        self.combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.combo.setMinimumContentsLength(12)  # long titles never set the panel's width
        self.combo.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.combo.setToolTip("The main model the selected file is judged against as a draft: the chat's "
                              "main model unless you pick another")
        self.combo.currentIndexChanged.connect(self._on_index)
        self.find_button = QPushButton("Find drafts")
        self.find_button.setToolTip("Search the hub for smaller models of this one's family that can draft for it, "
                                    "same vocabulary first")
        self.find_button.clicked.connect(self.findRequested)
        row = QHBoxLayout(self)
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(QLabel("As a draft for:"))
        row.addWidget(self.combo, 1)
        row.addWidget(self.find_button)
        self._fill(None)

    def current(self) -> MainCandidate | None:
        key = self.combo.currentData()
        return next((c for c in self._candidates() if c.key == key), None)

    def set_library(self, candidates: list[MainCandidate]) -> None:
        self._library = candidates
        self._fill(self.combo.currentData())

    def set_chat_main(self, candidate: MainCandidate | None) -> None:
        """The chat's chosen main model: judged against from now on when it is another one."""
        moved = (candidate.key if candidate else None) != (self._chat.key if self._chat else None)
        self._chat = candidate
        self._fill(candidate.key if moved and candidate else self.combo.currentData())

    def library_model(self, title: str) -> MainCandidate | None:
        return next((c for c in self._library if c.title == title), None)

    def select(self, key: str) -> None:
        self._fill(key)

    def add_hub_model(self, candidate: MainCandidate) -> None:
        """A model the user asked drafts for: listed and judged against."""
        self._hub = [c for c in self._hub if c.key != candidate.key] + [candidate]
        self._fill(candidate.key)

    def _candidates(self) -> list[MainCandidate]:
        out = list(self._library)
        for extra in ([self._chat] if self._chat else []) + self._hub:
            if all(c.key != extra.key for c in out):
                out.append(extra)
        return out

    def _default(self) -> str | None:
        if self._chat is not None:
            return self._chat.key
        return max(self._library, key=lambda c: c.info.n_params).key if self._library else None

    def _fill(self, wanted: str | None) -> None:
        before = self.combo.currentData()
        candidates = self._candidates()
        keys = [c.key for c in candidates]
        chosen = wanted if wanted in keys else before if before in keys else self._default()
        self.combo.blockSignals(True)
        self.combo.clear()
        for c in candidates:
            label = c.title + (" (on the hub)" if c.path is None and c.repo_id else "")
            self.combo.addItem(label, c.key)
            self.combo.setItemData(self.combo.count() - 1, f"{label}\n{c.path or c.key}",
                                   Qt.ItemDataRole.ToolTipRole)
        if not candidates:
            self.combo.addItem("no main model: choose one in the Model tab", None)
        self.combo.setCurrentIndex(keys.index(chosen) if chosen in keys else 0)
        self.combo.blockSignals(False)
        self.combo.setEnabled(bool(candidates))
        self.find_button.setEnabled(bool(candidates))
        if self.combo.currentData() != before:
            self.changed.emit()

    def _on_index(self, _index: int) -> None:
        self.changed.emit()


def candidate_for(info: GGUFInfo, title: str | None, path: str | None = None) -> MainCandidate:
    """A local model (a library entry, the chat's main model) as a candidate."""
    where = path or str(info.path)
    return MainCandidate(where, title or Path(where).name, info, where if Path(where).is_file() else None)
