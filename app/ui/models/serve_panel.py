"""The "Local API server" box: serve the loaded pair to other tools, as `specula serve` does.

The box remembers (QSettings) whether the user left it on: the server then starts again with the
next loaded model, also after a restart, as LM Studio's does. An API key is not stored; a server
that had one waits for it to be typed again rather than starting without it.
"""

from __future__ import annotations

from PySide6.QtCore import QSettings, Qt, Signal
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
            "127.0.0.1 only. Any model name in a request means the loaded model. Left on, it "
            "starts again with the next model loaded."
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
        self._settings: QSettings | None = None
        self._wanted_on = False  # the user's last choice: serve each model loaded
        self._available = False  # a model is loaded
        self._key_needed = False  # it was on with a key, which is not stored
        self.set_available(False)

    def remember_in(self, settings: QSettings) -> None:
        """Keep the on/off choice and the port in `settings`, starting from what they hold."""
        self._settings = settings
        port = str(settings.value("server/port", "") or "")
        if port.isdigit() and 1 <= int(port) <= 65535:
            self.port.setValue(int(port))
        was_on = str(settings.value("server/on", "false")).lower() == "true"
        self._key_needed = was_on and str(settings.value("server/keyed", "false")).lower() == "true"
        self._wanted_on = was_on and not self._key_needed
        self.set_available(False)

    def _remember(self, on: bool) -> None:
        self._wanted_on = on
        self._key_needed = False
        if self._settings is not None:
            self._settings.setValue("server/on", on)
            self._settings.setValue("server/port", self.port.value())
            self._settings.setValue("server/keyed", bool(self.key.text().strip()))

    def _on_toggled(self, on: bool) -> None:
        self.port.setEnabled(not on)
        self.key.setEnabled(not on)
        self._remember(on)
        if on:
            self.status.setText("Starting…")
            self.startRequested.emit(self.port.value(), self.key.text().strip())
        else:
            self.status.setText("Stopping…")
            self.stopRequested.emit()

    def set_available(self, available: bool, reason: str = "load a model to serve it") -> None:
        """A model was loaded (available) or is gone; a server left on starts with the new one."""
        self._available = available
        self.toggle.setEnabled(available or self.toggle.isChecked())
        if available and self._wanted_on and not self.toggle.isChecked():
            self.toggle.setChecked(True)  # starts it (toggled)
        elif not available and not self.toggle.isChecked():
            waits = " · starts with it, as it was on" if self._wanted_on else ""
            self.status.setText(f"Off ({reason}{waits})")
        elif available and not self.toggle.isChecked():
            self.status.setText("Off (it was on with an API key: type the key and tick to serve again)"
                                if self._key_needed else "Off")

    def set_running(self, url: str) -> None:
        self._set_checked(True)  # also when it started after the replaced model's server stopped
        self.status.setText(f"Serving at {url}/v1 (OpenAI API; any model name means the loaded one)")

    def set_stopped(self, note: str = "") -> None:
        self._set_checked(False)
        self.status.setText(f"Off{f' ({note})' if note else ''}")
        if self._available and self._wanted_on:  # the replaced model's server: serve the new one
            self.toggle.setChecked(True)

    def set_failed(self, message: str) -> None:
        self._set_checked(False)
        self.status.setText(f"Could not start: {message}")

    def _set_checked(self, on: bool) -> None:
        self.toggle.blockSignals(True)
        self.toggle.setChecked(on)
        self.toggle.blockSignals(False)
        self.port.setEnabled(not on)
        self.key.setEnabled(not on)
