"""The two small widgets under the Discover panel: the download strip and the token prompt."""

from __future__ import annotations

import html

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QResizeEvent
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QProgressBar,
    QPushButton,
    QSizePolicy,
    QVBoxLayout,
    QWidget,
)

from app.ui.discover.text import BAD, GOOD, progress_line
from app.ui.common.style import small_muted_label

RUNNING, CANCELLING, STOPPED, FAILED, DONE = "running", "cancelling", "stopped", "failed", "done"
_BAR_STEPS = 1000


class DownloadStrip(QWidget):
    """One download: its name, a bar, bytes · speed · time left, and Cancel (or Resume once it
    stopped with a partial kept). Hidden until the first download starts."""

    cancelRequested = Signal()
    resumeRequested = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.state = ""
        self._name = ""
        self.last = None  # the latest DownloadProgress
        self.title = QLabel()  # plain text, elided in the middle to the width (see resizeEvent)
        self.title.setTextFormat(Qt.TextFormat.PlainText)
        self.title.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self._title_text = ""
        self.bar = QProgressBar()
        self.bar.setRange(0, _BAR_STEPS)
        self.bar.setTextVisible(True)
        self.detail = small_muted_label(selectable=False)
        self.detail.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.button = QPushButton("Cancel")
        self.button.clicked.connect(self._on_button)

        row = QHBoxLayout()
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(self.bar, 1)
        row.addWidget(self.button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 4, 0, 0)
        layout.setSpacing(2)
        layout.addWidget(self.title)
        layout.addLayout(row)
        layout.addWidget(self.detail)
        self.hide()

    def is_busy(self) -> bool:
        return self.state in (RUNNING, CANCELLING)

    def started(self, name: str, resuming: bool) -> None:
        self.state = RUNNING
        self._name = name
        self._title("Resuming" if resuming else "Downloading")
        self.bar.setValue(0)
        self.bar.setFormat("%p%")
        self.last = None
        self.detail.setText("connecting…")
        self._button("Cancel", "Stop the download; what has arrived is kept so it can be resumed")
        self.show()

    def progress(self, p) -> None:  # app.hub.progress.DownloadProgress
        if self.state not in (RUNNING, CANCELLING):
            return
        self.last = p
        self.bar.setValue(int(p.fraction * _BAR_STEPS))
        if self.state == RUNNING:
            self.detail.setText(progress_line(p))

    def cancelling(self) -> None:
        self.state = CANCELLING
        self.detail.setText("cancelling after the current chunk…")
        self.button.setEnabled(False)

    def stopped(self, message: str) -> None:
        """Cancelled or interrupted: the partial stays, the button resumes it."""
        self.state = STOPPED
        self._title("Stopped")
        self.detail.setText(html.escape(message))
        self.detail.setToolTip(message)
        self.bar.setFormat("stopped at %p%")
        self._button("Resume", "Continue the download where it stopped")

    def failed(self, message: str) -> None:
        self.state = FAILED
        self._title("Failed")
        self.detail.setText(f"<span style='color:{BAD}'>{html.escape(message)}</span>")
        self.detail.setToolTip(message)
        self.bar.setFormat("failed")
        self._button("Retry", "Try the download again")

    def done(self, path: str) -> None:
        self.state = DONE
        self._title("Downloaded")
        self.bar.setValue(_BAR_STEPS)
        self.bar.setFormat("done")
        self.detail.setText(f"<span style='color:{GOOD}'>✓ verified and added to the library</span>")
        self.detail.setToolTip(path)
        self.button.hide()

    def _title(self, verb: str) -> None:
        self._title_text = f"{verb} {self._name}"
        self.title.setToolTip(self._name)
        self._elide_title()

    def _elide_title(self) -> None:
        width = max(self.title.width(), 50)
        self.title.setText(self.title.fontMetrics().elidedText(self._title_text, Qt.TextElideMode.ElideMiddle, width))

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        self._elide_title()

    def _button(self, text: str, tip: str) -> None:
        self.button.setText(text)
        self.button.setToolTip(tip)
        self.button.setEnabled(True)
        self.button.show()

    def _on_button(self) -> None:
        if self.state == RUNNING:
            self.cancelRequested.emit()
        elif self.state in (STOPPED, FAILED):
            self.resumeRequested.emit()


class TokenPrompt(QWidget):
    """Shown when a repository is gated: a token field whose Save stores the token the way
    `hf auth login` does (checked against the hub first)."""

    tokenEntered = Signal(str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.message = QLabel()
        self.message.setWordWrap(True)
        self.message.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.field = QLineEdit()
        self.field.setEchoMode(QLineEdit.EchoMode.Password)
        self.field.setPlaceholderText("hf_… (a read token from huggingface.co/settings/tokens)")
        self.field.returnPressed.connect(self._save)
        self.save_button = QPushButton("Save token")
        self.save_button.setToolTip("Check the token with the hub and store it for every Hugging Face tool")
        self.save_button.clicked.connect(self._save)
        row = QHBoxLayout()
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(self.field, 1)
        row.addWidget(self.save_button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 4, 0, 0)
        layout.setSpacing(2)
        layout.addWidget(self.message)
        layout.addLayout(row)
        self.hide()

    def ask(self, message: str, error: bool = False) -> None:
        self.message.setText(f"<span style='color:{BAD}'>{html.escape(message)}</span>" if error
                             else html.escape(message))
        self.set_busy(False)
        self.show()
        self.field.setFocus()

    def set_busy(self, busy: bool) -> None:
        self.field.setEnabled(not busy)
        self.save_button.setEnabled(not busy)
        self.save_button.setText("Checking…" if busy else "Save token")

    def _save(self) -> None:
        token = self.field.text().strip()
        if token:
            self.set_busy(True)
            self.tokenEntered.emit(token)
