"""The Model tab's "Where it runs": Specula's own loop on this computer (the default), llama.cpp's
llama-server started here (any --spec-type llama.cpp has, RPC workers to split the main model), or
a server at a URL (its key stored owner-only beside the history, never shown back in clear).

The box holds only the choice; the pair picker puts it into the PairChoice it loads."""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QComboBox, QFormLayout, QGroupBox, QLineEdit, QVBoxLayout

from app.engine.llama_server.spec import (DRAFT_MODEL_TYPES, LLAMA_SPEC_TYPES, RPC_WARNING, check_rpc_endpoints, check_url,
                                             off_loopback)
from app.ui.common.format import html_text
from app.ui.common.style import small_muted_label
from app.worker.requests import AT_URL, HERE, LLAMA_SERVER

RUNS_ON_LABELS = ((HERE, "This computer (Specula's own loop)"),
                  (LLAMA_SERVER, "llama-server here (llama.cpp's own engine)"),
                  (AT_URL, "A server at a URL"))
ABOUT = {
    HERE: "Specula's drafters, schedule and charts run in this app, on the backend chosen below.",
    LLAMA_SERVER: "llama.cpp's llama-server, started on 127.0.0.1 with the main model below and its own "
                  "speculation (every --spec-type llama.cpp has); stopped when another model loads.",
    AT_URL: "A server someone runs, here or elsewhere: llama-server, or any server speaking OpenAI's API (vLLM, "
            "SGLang, Ollama, LM Studio, another Specula). Its model and its speculation answer; draft counts come "
            "from its own timings or /metrics where it has them. The key is sent as 'Authorization: Bearer', "
            "stored only for you (file mode 0600).",
}
SPEC_TYPE_ABOUT = {
    "none": "no drafting: llama.cpp's plain decoding",
    "draft-mtp": "the main model's own multi-token-prediction heads (models that have them)",
    "ngram-mod": "drafts what followed the same tokens before, across all replies (no draft model)",
}
DEFAULT_SPEC_TYPE = "ngram-mod"  # drafts without a second model, so it works on any main model


class EnginePanel(QGroupBox):
    """changed() whenever the choice changes."""

    changed = Signal()

    def __init__(self, parent=None) -> None:
        super().__init__("Where it runs", parent)
        self.runs_combo = QComboBox()
        for value, label in RUNS_ON_LABELS:
            self.runs_combo.addItem(label, value)
        self.runs_combo.setToolTip("Which engine writes the replies. The chat, stats and charts work on each.")
        self.about = small_muted_label("")
        self.about.setWordWrap(True)
        self.spec_type = QComboBox()
        for value in LLAMA_SPEC_TYPES:
            self.spec_type.addItem(value, value)
        self.spec_type.setCurrentIndex(LLAMA_SPEC_TYPES.index(DEFAULT_SPEC_TYPE))
        self.spec_type.setToolTip("llama-server's --spec-type: how llama.cpp drafts. The draft-* types use "
                                  "the draft model chosen under Draft.")
        self.rpc = QLineEdit()
        self.rpc.setPlaceholderText("none (HOST:PORT,... of specula rpc-worker)")
        self.rpc.setToolTip("Split the main model's layers across llama.cpp rpc-server workers (specula rpc-worker "
                            "on each machine), as llama.cpp's --rpc does.")
        self.rpc_note = small_muted_label("")
        self.rpc_note.setWordWrap(True)
        self.url = QLineEdit()
        self.url.setPlaceholderText("http://127.0.0.1:8080")
        self.key = QLineEdit()
        self.key.setEchoMode(QLineEdit.EchoMode.Password)
        self.key.setToolTip("Sent as 'Authorization: Bearer KEY'; stored owner-only when you press Load, never "
                            "shown again (type a new one to replace it).")
        self.form = QFormLayout()
        self.form.addRow("Speculative type", self.spec_type)
        self.form.addRow("RPC workers", self.rpc)
        self.form.addRow("URL", self.url)
        self.form.addRow("API key", self.key)
        layout = QVBoxLayout(self)
        layout.addWidget(self.runs_combo)
        layout.addWidget(self.about)
        layout.addLayout(self.form)
        layout.addWidget(self.rpc_note)  # outside the form: a wrapped label in a form row is cut off
        self._key_stored = False
        self.runs_combo.currentIndexChanged.connect(self._refresh)
        self.spec_type.currentIndexChanged.connect(self._refresh)
        self.rpc.textChanged.connect(self._refresh)
        self.url.textChanged.connect(self.changed)
        self._refresh()

    # --- the choice ---------------------------------------------------------------------------

    def runs_on(self) -> str:
        return str(self.runs_combo.currentData() or HERE)

    def set_runs_on(self, value: str) -> None:
        self.runs_combo.setCurrentIndex(max(self.runs_combo.findData(value), 0))

    def spec_type_value(self) -> str:
        return str(self.spec_type.currentData() or "none")

    def set_spec_type(self, value: str) -> None:
        index = self.spec_type.findData(value)
        if index >= 0:
            self.spec_type.setCurrentIndex(index)

    def needs_draft_model(self) -> bool:
        return self.runs_on() == LLAMA_SERVER and self.spec_type_value() in DRAFT_MODEL_TYPES

    def server_url(self) -> str:
        return self.url.text().strip().rstrip("/")

    def rpc_text(self) -> str:
        return self.rpc.text().strip() if self.runs_on() == LLAMA_SERVER else ""

    def problem(self) -> str | None:
        """Why the choice cannot load as it stands (one line), or None."""
        if self.runs_on() == AT_URL:
            try:
                check_url(self.server_url())
            except ValueError:
                return "type the server's URL (http://HOST:PORT or https://...)"
        if self.rpc_text():
            try:
                check_rpc_endpoints(self.rpc_text())
            except ValueError as exc:
                return f"RPC workers: {exc}"
        return None

    def set_key_stored(self, stored: bool) -> None:
        """Say whether a key is stored for the URL (never the key itself)."""
        self._key_stored = stored
        self.key.setPlaceholderText("a key is stored (type to replace it)" if stored else "API key (optional)")

    def typed_key(self) -> str:
        return self.key.text().strip()

    # --- reactions ----------------------------------------------------------------------------

    def _refresh(self) -> None:
        runs_on = self.runs_on()
        self.about.setText(ABOUT[runs_on] + self._type_note())
        for widget, shown in ((self.spec_type, runs_on == LLAMA_SERVER), (self.rpc, runs_on == LLAMA_SERVER),
                              (self.url, runs_on == AT_URL), (self.key, runs_on == AT_URL)):
            self.form.setRowVisible(widget, shown)
        self.rpc_note.setVisible(runs_on == LLAMA_SERVER and bool(self._rpc_note()))
        self.rpc_note.setText(self._rpc_note())
        self.changed.emit()

    def _type_note(self) -> str:
        if self.runs_on() != LLAMA_SERVER:
            return ""
        kind = self.spec_type_value()
        about = ("the draft model chosen under Draft" if kind in DRAFT_MODEL_TYPES
                 else SPEC_TYPE_ABOUT.get(kind, "llama.cpp's n-gram drafting (no draft model)"))
        return f" {kind}: {about}."

    def _rpc_note(self) -> str:
        text = self.rpc_text()
        if not text:
            return ""
        try:
            endpoints = check_rpc_endpoints(text)
        except ValueError as exc:
            return f"<span style='color:#b91c1c'>{html_text(str(exc))}</span>"
        if off_loopback(endpoints):
            return f"<span style='color:#b45309'>{html_text(RPC_WARNING)}</span>"
        return f"the main model's layers are split across {len(endpoints)} worker(s) on this computer"


