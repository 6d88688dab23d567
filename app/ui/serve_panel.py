"""The "Local API server" box: serve the loaded pair to other tools, as `specula serve` does."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QCheckBox, QGroupBox, QHBoxLayout, QLabel, QLineEdit, QSpinBox, QVBoxLayout

from app.worker.serving import DEFAULT_PORT


class ServePanel(QGroupBox):
    """startRequested(port, api_key) when ticked, stopRequested() when unticked."""

    startRequested = Signal(int, str)
    stopRequested = Signal()

    def __init__(self, parent=None) -> None:
        super().__init__("Local API server", parent)
        self.toggle = QCheckBox("Serve the loaded model (OpenAI-compatible API)")
        self.toggle.setToolTip(
            "Lets other programs on this computer (Open WebUI, editors, scripts) use the loaded "
            "model and its draft through /v1/chat/completions, as llama-server does. Listens on "
            "127.0.0.1 only."
        )
        self.port = QSpinBox()
        self.port.setRange(1, 65535)
        self.port.setValue(DEFAULT_PORT)
        self.port.setToolTip("TCP port on 127.0.0.1")
        self.key = QLineEdit()
        self.key.setEchoMode(QLineEdit.EchoMode.Password)
        self.key.setPlaceholderText("API key (optional)")
        self.key.setToolTip("When set, requests must send 'Authorization: Bearer KEY'")
        self.status = QLabel("Off")
        self.status.setWordWrap(True)
        self.status.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        row = QHBoxLayout()
        row.addWidget(QLabel("Port"))
        row.addWidget(self.port)
        row.addWidget(self.key, 1)
        layout = QVBoxLayout(self)
        layout.addWidget(self.toggle)
        layout.addLayout(row)
        layout.addWidget(self.status)
        self.toggle.toggled.connect(self._on_toggled)
        self.set_available(False)

    def _on_toggled(self, on: bool) -> None:
        self.port.setEnabled(not on)
        self.key.setEnabled(not on)
        if on:
            self.status.setText("Starting…")
            self.startRequested.emit(self.port.value(), self.key.text().strip())
        else:
            self.status.setText("Stopping…")
            self.stopRequested.emit()

    def set_available(self, available: bool, reason: str = "load a model to serve it") -> None:
        self.toggle.setEnabled(available or self.toggle.isChecked())
        if not available and not self.toggle.isChecked():
            self.status.setText(f"Off ({reason})")
        elif available and not self.toggle.isChecked():
            self.status.setText("Off")

    def set_running(self, url: str) -> None:
        self.status.setText(f"Serving at {url}/v1 (OpenAI API)")

    def set_stopped(self, note: str = "") -> None:
        self._set_checked(False)
        self.status.setText(f"Off{f' ({note})' if note else ''}")

    def set_failed(self, message: str) -> None:
        self._set_checked(False)
        self.status.setText(f"Could not start: {message}")

    def _set_checked(self, on: bool) -> None:
        self.toggle.blockSignals(True)
        self.toggle.setChecked(on)
        self.toggle.blockSignals(False)
        self.port.setEnabled(not on)
        self.key.setEnabled(not on)
