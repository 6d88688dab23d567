"""Pick the pair: a main model, and a draft model, prompt lookup, the n-gram cache that learns
from the user's chats (alone or with prompt lookup) or none; GPU offload for each; Load with
progress and Cancel.

How a model can draft is decided on GGUF headers (app.engine.drafting.compat.check_draft) before anything
is loaded: the main model's vocabulary drafts token by token (llama.cpp's rules); another
vocabulary drafts through text, marked "text-level"; a model neither way can use stays in the
list, greyed, with the reason.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QStandardItem, QStandardItemModel
from PySide6.QtWidgets import (
    QComboBox,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QProgressBar,
    QPushButton,
    QSizePolicy,
    QVBoxLayout,
    QWidget,
)

from app.engine.backends import AUTO, LLAMA_CPP, TORCH
from app.engine.drafting.compat import DraftCheck, check_draft
from app.engine.llama_server.drafts import TOKEN_BY_TOKEN, server_usable, why_not_on_server
from app.engine.llama_server.keys import keys_path, read_key, save_key
from app.ui.models.draft_labels import draft_title, draft_tooltip, is_same_model
from app.ui.models.draft_order import draft_rank
from app.ui.models.engine_panel import EnginePanel
from app.hub.library_entries import LibraryEntry, entry_path
from app.ui.models.offload import OffloadControl
from app.ui.common.paths import data_dir
from app.ui.common.style import small_muted_label
from app.worker.engine_calls import keeps_main
from app.compare.results import LLAMA_SERVER as LLAMA_SERVER_ROW, SERVER_URL as SERVER_URL_ROW
from app.worker.requests import (AT_URL, DEFAULT_DRAFTER, DRAFTER_TEXT, HERE, LEARNING, LLAMA_SERVER, LOOKUP,
                                 LOOKUP_CACHE, MODEL, NGRAM_CACHE,
                                 NONE, PairChoice)

if TYPE_CHECKING:
    from app.engine.session import Facts

KIND_ROLE = Qt.ItemDataRole.UserRole + 1
PATH_ROLE = Qt.ItemDataRole.UserRole + 2
LOOKUP_TEXT = "Prompt lookup (no draft model)"
NGRAM_TEXT = "N-gram cache (learns from your chats)"
LOOKUP_NGRAM_TEXT = "Prompt lookup + n-gram cache"
LEARNING_TEXT = "Prompt lookup + n-gram cache + ngram-mod (learns as you chat; the default)"
NONE_TEXT = "None (plain decoding)"
NGRAM_FOLDER = "ngram-cache"  # in the data folder, beside the chat history: one file per vocabulary
DRAFT_FACTS = {
    LOOKUP: "Drafts by copying what followed the last few tokens earlier in the chat.",
    NGRAM_CACHE: "Drafts what followed the last 2-4 tokens in your earlier chats and replies. It learns "
                 "from every finished reply of a main model with this vocabulary, whichever drafter "
                 "wrote it (kept beside the history, at most 100,000 short word sequences, or n-grams).",
    LEARNING: "Prompt lookup, the n-gram cache and llama.cpp's ngram-mod pool together: the longest match "
              "drafts; the cache learns from each finished reply and is kept beside the history, the pool "
              "from every reply while the model is loaded (a regenerated or repeated answer drafts whole). "
              "The fastest of these across the bench on both demo models.",
    LOOKUP_CACHE: "Prompt lookup and the n-gram cache together: the longer match drafts (this chat "
                  "first on a tie); the cache learns from each finished reply.",
    NONE: "No drafting: plain decoding, the speed reference.",
}


class PairPicker(QWidget):
    """loadRequested(PairChoice) when Load is pressed; cancelRequested() for Cancel."""

    loadRequested = Signal(object)
    cancelRequested = Signal()
    selectionChanged = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._entries: list[LibraryEntry] = []
        self._loaded_spec: PairChoice | None = None
        self._loaded_facts = None  # app.engine.session.Facts of what runs
        self._loading = False
        self._replying = False
        self._draft_pref: tuple[str, str | None] = (DEFAULT_DRAFTER, None)  # the user's last draft choice
        self._replaced: str | None = None  # why the draft model above gave way to prompt lookup
        self._server_drafts = False  # the draft list was made for llama-server's draft-* types

        self.main_combo = _combo()
        self.main_combo.setToolTip("The model that writes the reply. Its output is what you get, drafts or not.")
        self.main_combo.currentIndexChanged.connect(self._on_main_changed)
        self.main_facts = _small_label()
        self.main_offload = OffloadControl()
        self.backend_combo = _combo()
        for label, value in BACKEND_LABELS:
            self.backend_combo.addItem(label, value)
        self.backend_combo.setToolTip(
            "What runs the models. Auto: llama.cpp wherever it runs here (it passed its self-test on "
            "this CPU and has the device asked for), else torch; the line below says which and why. "
            "Specula's drafters, schedule and charts work the same on both."
        )
        self.backend_combo.currentIndexChanged.connect(self._on_backend_changed)
        self.plan_label = _small_label(PLAN_BEFORE_LOAD)
        self.plan_label.setWordWrap(True)
        # Beside each control whose change needs a reload: what still runs until then.
        self.backend_note = _note_label()

        self.draft_combo = _combo()
        self.draft_combo.setToolTip(
            "What guesses the next tokens for the main model to check in one pass: a small model "
            "with the same vocabulary, prompt lookup (copies from the conversation, no second "
            "model), the n-gram cache (learns from your chats), or none. A model with another "
            "vocabulary drafts through text (marked text-level: re-tokenized, each step costs "
            "more); one that cannot draft is greyed, with the reason."
        )
        self.draft_combo.currentIndexChanged.connect(self._on_draft_changed)
        self.draft_combo.setPlaceholderText("no draft model llama-server can use")  # shown with none chosen
        self.draft_facts = _small_label()
        self.draft_offload = OffloadControl()

        self.load_button = QPushButton("Load")
        self.load_button.setDefault(True)
        self.load_button.clicked.connect(self._on_load)
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setEnabled(False)
        self.cancel_button.clicked.connect(self.cancelRequested)
        self.progress = QProgressBar()
        self.progress.setRange(0, 1000)
        self.progress.setTextVisible(True)
        self.progress.setFormat("")
        self.state_label = _small_label("Nothing loaded.")
        # A choice that differs from what runs: said plainly above Load/Apply (issue 43 item 1).
        self.pending_label = _note_label()
        self.pending_label.setObjectName("pendingChange")

        self.engine = EnginePanel()
        self.engine.changed.connect(self._on_engine_changed)
        self.engine.url.textChanged.connect(self._show_key_stored)

        main_box = self.main_box = QGroupBox("Main model")
        main_layout = QVBoxLayout(main_box)
        for widget in (self.main_combo, self.main_facts, self.main_offload, self.backend_combo, self.backend_note,
                       self.plan_label):
            main_layout.addWidget(widget)
        draft_box = self.draft_box = QGroupBox("Draft")
        draft_layout = QVBoxLayout(draft_box)
        for widget in (self.draft_combo, self.draft_facts, self.draft_offload):
            draft_layout.addWidget(widget)
        buttons = QHBoxLayout()
        buttons.addWidget(self.load_button)
        buttons.addWidget(self.cancel_button)
        buttons.addWidget(self.progress, 1)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.engine)
        layout.addWidget(main_box)
        layout.addWidget(draft_box)
        layout.addWidget(self.pending_label)
        layout.addLayout(buttons)
        layout.addWidget(self.state_label)
        self._refresh_draft_controls()
        self.selectionChanged.connect(self._refresh_pending)
        self.main_offload.changed.connect(self._refresh_pending)
        self.draft_offload.changed.connect(self._refresh_pending)

    # --- library and devices ------------------------------------------------------------------

    def set_entries(self, entries: list[LibraryEntry]) -> None:
        """Fill the main list from the library, keeping the current choices where possible."""
        main_path, (kind, draft_path) = self.main_path(), self._draft_pref
        self._entries = list(entries)
        model = QStandardItemModel(self.main_combo)
        for entry in entries:
            item = QStandardItem(main_title(entry))
            item.setData(entry.path, PATH_ROLE)
            item.setToolTip(entry.facts() if entry.usable else entry.error or "")
            item.setEnabled(entry.usable)
            model.appendRow(item)
        self.main_combo.blockSignals(True)
        self.main_combo.setModel(model)
        self.main_combo.setCurrentIndex(-1)
        self.main_combo.blockSignals(False)
        if not self.select_main(main_path or ""):
            first = next((i for i, e in enumerate(entries) if e.usable), -1)
            self.main_combo.setCurrentIndex(first)
            self._on_main_changed()
        self.select_draft(kind, draft_path)

    def set_devices(self, facts: dict[str, Any]) -> None:
        self.main_offload.set_devices(facts)
        self.draft_offload.set_devices(facts)

    # --- the selection ------------------------------------------------------------------------

    def main_entry(self) -> LibraryEntry | None:
        path = self.main_path()
        return next((e for e in self._entries if e.path == path and e.usable), None)

    def main_path(self) -> str | None:
        return self.main_combo.currentData(PATH_ROLE) if self.main_combo.currentIndex() >= 0 else None

    def draft_choice(self) -> tuple[str, str | None]:
        """(NONE | LOOKUP | MODEL, the draft's path for MODEL)."""
        if self.draft_combo.currentIndex() < 0:
            return NONE, None
        return self.draft_combo.currentData(KIND_ROLE) or NONE, self.draft_combo.currentData(PATH_ROLE)

    def select_main(self, path: str) -> bool:
        path = entry_path(self._entries, path)  # a copy of a listed file selects its entry
        for row in range(self.main_combo.count()):
            item = self.main_combo.model().item(row)
            if item.data(PATH_ROLE) == path and item.isEnabled():
                self.main_combo.setCurrentIndex(row)
                return True
        return False

    def select_draft(self, kind: str, path: str | None = None) -> bool:
        path = entry_path(self._entries, path)
        for row in range(self.draft_combo.count()):
            item = self.draft_combo.model().item(row)
            if item.data(KIND_ROLE) == kind and (kind != MODEL or item.data(PATH_ROLE) == path):
                if item.isEnabled():
                    self.draft_combo.setCurrentIndex(row)
                    return True
        return False

    def apply(self, main_path: str, drafter: str, draft_path: str | None = None, server_types: str = "",
              server_url: str = "") -> str | None:
        """Select a pair chosen elsewhere (the Compare view's fastest, whichever engine ran it):
        None when it is selected, else why not, in one line. Nothing is loaded: that stays the
        user's Load."""
        if drafter == SERVER_URL_ROW:
            self.engine.set_runs_on(AT_URL)
            self.engine.url.setText(server_url)
            return None
        self.engine.set_runs_on(LLAMA_SERVER if drafter == LLAMA_SERVER_ROW else HERE)
        if drafter == LLAMA_SERVER_ROW:
            return self._apply_server_types(main_path, server_types, draft_path)
        if not self.select_main(main_path):
            return f"{Path(main_path).name} is not a usable main model in the library"
        if self.select_draft(drafter, draft_path):
            return None
        if drafter != MODEL:  # an n-gram kind the chat does not offer (ngram-mod)
            return f"the chat does not draft with {drafter}; the command line does (specula run --spec-type)"
        return f"{Path(draft_path or drafter).name} cannot be the chat's draft: {self._draft_row_tip(draft_path)}"

    def _draft_row_tip(self, draft_path: str | None) -> str:
        """Why a draft model's row cannot be chosen: its tooltip, or that it is not listed."""
        rows = [self.draft_combo.model().item(r) for r in range(self.draft_combo.count())]
        item = next((i for i in rows if i.data(PATH_ROLE) == draft_path and draft_path), None)
        return item.toolTip() if item is not None else "it is not in the library"

    def _apply_server_types(self, main_path: str, server_types: str, draft_path: str | None) -> str | None:
        """llama-server with the comparison's --spec-type (the Model tab runs one type)."""
        if not self.select_main(main_path):
            return f"{Path(main_path).name} is not a usable main model in the library"
        types = [t for t in server_types.split(",") if t] or ["none"]
        self.engine.set_spec_type(types[0])
        if draft_path and not self.select_draft(MODEL, draft_path):
            return f"{Path(draft_path).name} cannot be llama-server's draft: {self._draft_row_tip(draft_path)}"
        if len(types) > 1:
            return (f"the Model tab runs one llama.cpp type at a time: {types[0]} is chosen; "
                    f"specula run --engine llama-server --spec-type {server_types} runs them all")
        return None

    def draft_items(self) -> list[tuple[str, bool, str]]:
        """(text, enabled, tooltip) of each draft choice: what the user sees in the list."""
        model = self.draft_combo.model()
        return [(model.item(r).text(), model.item(r).isEnabled(), model.item(r).toolTip())
                for r in range(self.draft_combo.count())]

    def backend(self) -> str:
        return str(self.backend_combo.currentData() or "auto")

    def set_backend(self, value: str) -> None:
        index = self.backend_combo.findData(value)
        self.backend_combo.setCurrentIndex(max(index, 0))

    def _on_backend_changed(self, _index: int) -> None:
        self.main_offload.set_backend(self.backend())
        self.draft_offload.set_backend(self.backend())
        self.selectionChanged.emit()

    def spec(self) -> PairChoice | None:
        runs_on = self.engine.runs_on()
        if runs_on == AT_URL:  # the server's own model and speculation
            url = self.engine.server_url()
            if self.engine.problem():
                return None
            return PairChoice(main_path=url, runs_on=AT_URL, server_url=url, key_store=str(keys_path(data_dir())))
        main = self.main_entry()
        if main is None or self.engine.problem():
            return None
        kind, draft_path = self.draft_choice()
        if runs_on == LLAMA_SERVER:
            if not self.engine.needs_draft_model():
                kind, draft_path = NONE, None
            elif kind != MODEL:
                return None
        return PairChoice(
            main_path=main.path,
            drafter=kind,
            draft_path=draft_path if kind == MODEL else None,
            main_gpu_layers=self.main_offload.gpu_layers(),
            draft_gpu_layers=self.draft_offload.gpu_layers() if kind == MODEL else None,
            backend=self.backend() if runs_on == HERE else "auto",
            ngram_dir=str(data_dir() / NGRAM_FOLDER) if runs_on == HERE else None,  # every drafter's replies teach it
            runs_on=runs_on,
            spec_type=self.engine.spec_type_value() if runs_on == LLAMA_SERVER else "none",
            rpc=self.engine.rpc_text(),
        )

    def problem(self) -> str | None:
        """Why Load cannot start what is chosen (one line), or None."""
        problem = self.engine.problem()
        if problem is None and self.engine.runs_on() != AT_URL and self.main_entry() is None:
            problem = "choose a main model (add a GGUF file in the Library tab)"
        if problem is None and self.engine.needs_draft_model() and self.draft_choice()[0] != MODEL:
            problem = self.no_server_draft() or (
                f"--spec-type {self.engine.spec_type_value()} needs a draft model: choose one under Draft "
                "(a small model with the main model's vocabulary)")
        return problem

    # --- loading state ------------------------------------------------------------------------

    def set_loading(self, loading: bool) -> None:
        self._loading = loading
        for widget in (self.engine, self.main_combo, self.draft_combo, self.main_offload, self.draft_offload,
                       self.backend_combo):
            widget.setEnabled(not loading)
        self._refresh_load_enabled()
        self.cancel_button.setEnabled(loading)
        if loading:
            self.progress.setValue(0)
            self.progress.setFormat("starting…")
        self._refresh_draft_controls()
        self._refresh_pending()

    def set_progress(self, stage: str, fraction: float) -> None:
        self.progress.setValue(int(max(0.0, min(1.0, fraction)) * 1000))
        # The stage in words on the wrapping line under the bar: cut to the bar's width it read
        # "main model: meas…(once per model)" (issue 60 item 10).
        self.progress.setFormat("%p%")
        self.progress.setToolTip(stage)
        self.state_label.setText(_escape(stage))

    def set_loaded(self, facts: Facts, spec: PairChoice | None) -> None:
        self._loaded_spec, self._loaded_facts = spec, facts
        self.progress.setValue(1000)
        self.progress.setFormat("loaded")
        self.state_label.setText(loaded_text(facts))
        self.state_label.setToolTip(loaded_text(facts))
        self.plan_label.setText(plan_text(facts))
        self.plan_label.setToolTip(str(facts.backend_reason or ""))
        self.main_offload.set_loaded(facts.main_weights)
        self.draft_offload.set_loaded(facts.draft_weights)
        self._refresh_pending()

    def set_failed(self, message: str) -> None:
        self.progress.setValue(0)
        self.progress.setFormat("")
        kept = " (the previous pair was unloaded)" if self._loaded_spec is not None else ""
        self._loaded_spec, self._loaded_facts = None, None
        self.main_offload.set_loaded(None)
        self.draft_offload.set_loaded(None)
        self.state_label.setText(f"<span style='color:#b91c1c'>Not loaded: {_escape(message)}</span>{kept}")
        self.plan_label.setText(PLAN_BEFORE_LOAD)
        self._refresh_pending()

    def loaded_spec(self) -> PairChoice | None:
        return self._loaded_spec

    def pending_change(self) -> bool:
        """True when the chosen pair is not the one running (Load or Apply would change it)."""
        return not self.pending_label.isHidden()

    def _refresh_pending(self) -> None:
        """Say what runs and what is only chosen: the pending line and the action's name, and a
        note beside each control whose value is not the running one (issue 43 items 1 and 2)."""
        loaded, chosen = self._loaded_spec, self.spec()
        live = loaded is not None and chosen is not None and not self._loading
        same_main = live and chosen.main_path == loaded.main_path
        notes = pending_notes(loaded, chosen) if same_main else {}
        self.backend_note.setText(notes.get("backend", ""))
        self.main_offload.set_note(notes.get("main_gpu", ""))
        self.draft_offload.set_note(notes.get("draft_gpu", ""))
        self.backend_note.setVisible(bool(self.backend_note.text()))
        pending = live and chosen != loaded
        swap = pending and keeps_main(loaded, chosen)
        self.load_button.setText("Apply" if swap else ("Reload" if live and not pending else "Load"))
        self.load_button.setToolTip(
            "Change only the drafter: the main model stays loaded" if swap else
            "Load the chosen pair; what runs now keeps running until it is loaded")
        self.pending_label.setVisible(pending)
        if pending:
            names = self._names()
            self.pending_label.setText(pending_text(loaded, chosen, names, swap))
        if live:  # the bar and the plan line describe what runs, never the choice
            self.progress.setValue(0 if pending else 1000)
            self.progress.setFormat("change not applied yet" if pending else "loaded")
            running = self._loaded_facts.main_name or Path(loaded.main_path).name
            prefix = "" if same_main else f"Running now: {running} — "
            self.plan_label.setText(prefix + plan_text(self._loaded_facts))

    def _names(self) -> dict[str, str]:
        """path -> the library's title, for the pending line."""
        return {e.path: e.title for e in self._entries}

    # --- reactions ----------------------------------------------------------------------------

    def _on_load(self) -> None:
        problem = self.problem()
        if problem is None and self.engine.runs_on() == AT_URL and self.engine.typed_key():
            problem = self._store_key()
        spec = None if problem else self.spec()
        if spec is None:
            self.state_label.setText(f"<span style='color:#b91c1c'>{_escape(problem or 'nothing to load')}</span>")
            return
        self.loadRequested.emit(spec)

    def _store_key(self) -> str | None:
        """Keep the typed key for the URL (owner-only file) and clear the field: it is never shown
        back. None, or why it could not be stored."""
        try:
            save_key(keys_path(data_dir()), self.engine.server_url(), self.engine.typed_key())
        except (OSError, ValueError) as exc:
            return f"the API key could not be stored: {getattr(exc, 'strerror', None) or exc}"
        self.engine.key.clear()
        self._show_key_stored()
        return None

    def _show_key_stored(self) -> None:
        url = self.engine.server_url()
        self.engine.set_key_stored(bool(url) and read_key(keys_path(data_dir()), url) is not None)

    def _on_engine_changed(self) -> None:
        """Show the parts the chosen engine uses: no main model or draft for a server at a URL
        (its own), no backend for llama-server (llama.cpp is it), the draft list for llama.cpp's
        draft-* types only, offering draft models alone."""
        runs_on = self.engine.runs_on()
        self.main_box.setVisible(runs_on != AT_URL)
        self.backend_combo.setVisible(runs_on == HERE)
        self.draft_box.setVisible(runs_on == HERE or self.engine.needs_draft_model())
        if self.engine.needs_draft_model() != self._server_drafts:  # llama-server takes fewer drafts
            self._fill_drafts(self.main_entry())
        self._refresh_load_enabled()
        self.selectionChanged.emit()

    def set_replying(self, replying: bool) -> None:
        """A reply is running: Load waits for it."""
        self._replying = replying
        self._refresh_load_enabled()

    def _refresh_load_enabled(self) -> None:
        """Load is off while loading or replying, without a main model, and where llama-server's
        draft-* type has no draft it can use (said under Draft before anything starts)."""
        runs_on = self.engine.runs_on()
        ready = runs_on == AT_URL or (self.main_entry() is not None and self.no_server_draft() is None)
        self.load_button.setEnabled(not self._loading and not self._replying and ready)

    def _show_draft_rows(self) -> None:
        """For llama.cpp's draft-* types only the draft models are offered."""
        models_only = self.engine.needs_draft_model()
        view = self.draft_combo.view()
        model = self.draft_combo.model()
        for row in range(self.draft_combo.count()):
            view.setRowHidden(row, models_only and model.item(row).data(KIND_ROLE) != MODEL)

    def _choose_server_draft(self) -> None:
        """For llama.cpp's draft-* types a draft model is chosen: the best one llama.cpp can use
        (the list is in rank order), none where none can (then the list says so)."""
        if self.draft_choice()[0] == MODEL:
            return
        model = self.draft_combo.model()
        first = next((r for r in range(self.draft_combo.count()) if model.item(r).data(KIND_ROLE) == MODEL
                      and model.item(r).isEnabled()), -1)
        self.draft_combo.setCurrentIndex(first)

    def _server_drafts_line(self) -> str:
        """How many of the library's draft models llama-server can use (the others are greyed)."""
        model = self.draft_combo.model()
        rows = [model.item(r) for r in range(self.draft_combo.count()) if model.item(r).data(KIND_ROLE) == MODEL]
        usable = sum(item.isEnabled() for item in rows)
        return (f"llama.cpp drafts token by token: {usable} of {len(rows)} models here share the main model's "
                "vocabulary (the best first; the others are greyed, the reason in their tooltip).")

    def no_server_draft(self) -> str | None:
        """Where llama-server's draft-* type has no draft model it can use: why, in one line."""
        if not self.engine.needs_draft_model() or self.draft_choice()[0] == MODEL:
            return None
        main = self.main_entry()
        if main is None:
            return None
        return (f"No model in the library drafts token by token for {main.title}, as llama-server's "
                f"{self.engine.spec_type_value()} needs (the main model's vocabulary): add a smaller model "
                "of its family, or choose an ngram-* type, or This computer (Specula's loop drafts through text)")

    def _on_main_changed(self, _index: int = 0) -> None:
        main = self.main_entry()
        self.main_facts.setText(main_facts_text(main))
        self.main_offload.set_model(main.info if main is not None else None)
        self._fill_drafts(main)
        self._refresh_load_enabled()
        self.selectionChanged.emit()

    def _fill_drafts(self, main: LibraryEntry | None) -> None:
        kind, path = self._draft_pref
        model = QStandardItemModel(self.draft_combo)
        for text, item_kind in ((NONE_TEXT, NONE), (LOOKUP_TEXT, LOOKUP), (NGRAM_TEXT, NGRAM_CACHE),
                                (LOOKUP_NGRAM_TEXT, LOOKUP_CACHE), (LEARNING_TEXT, LEARNING)):
            item = QStandardItem(text)
            item.setData(item_kind, KIND_ROLE)
            model.appendRow(item)
        itself = set()  # copies of the main model's weights: offered, marked, never kept as the choice
        self._server_drafts = server = self.engine.needs_draft_model()
        ranked = []
        for entry in self._entries:
            if main is None or not entry.usable or entry.path == main.path:
                continue
            same = is_same_model(entry, main)
            if same:
                itself.add(entry.path)
            check = check_draft(main.info, entry.info)
            usable = server_usable(check) if server else bool(check)
            ranked.append((draft_rank(main.info, entry.info, check, usable, same), entry, check, same))
        for _, entry, check, same in sorted(ranked, key=lambda row: row[0]):  # the best first
            model.appendRow(_draft_item(entry, main, check, same, server))
        self.draft_combo.blockSignals(True)
        self.draft_combo.setModel(model)
        self.draft_combo.blockSignals(False)
        self.draft_combo.blockSignals(True)
        self._replaced = None
        if (kind == MODEL and path in itself) or not self.select_draft(kind, path):
            self.select_draft(DEFAULT_DRAFTER)
            self._replaced = self._why_not_kept(kind, path, main, itself)
        if server:  # chosen here, not by the user: their choice returns with Specula's own loop
            self._choose_server_draft()
        self.draft_combo.blockSignals(False)
        self._show_draft_rows()
        self._show_draft()

    def _why_not_kept(self, kind: str, path: str | None, main: LibraryEntry | None, itself: set) -> str | None:
        """Why the user's draft model gave way to prompt lookup for this main model (one line,
        shown beside the drafter); None where there was no draft model to keep."""
        entry = next((e for e in self._entries if e.path == path), None) if kind == MODEL else None
        if entry is None or main is None:
            return None
        if entry.path == main.path:
            return f"{entry.title} is now the main model"
        if entry.path in itself:
            return f"{entry.title} has the main model's own weights"
        if entry.info is None:
            return f"{entry.title} cannot draft for {main.title} (unreadable)"
        check = check_draft(main.info, entry.info)
        if self._server_drafts and check:
            return f"llama-server cannot draft with {entry.title} for {main.title} ({TOKEN_BY_TOKEN})"
        return f"{entry.title} cannot draft for {main.title} ({check.reason})"

    def _on_draft_changed(self, _index: int = 0) -> None:
        self._draft_pref = self.draft_choice()
        self._replaced = None  # the user chose: nothing was replaced
        self._show_draft()

    def _show_draft(self) -> None:
        self.draft_combo._show_whole_text()  # its model may have changed with signals blocked
        kind, path = self.draft_choice()
        entry = next((e for e in self._entries if e.path == path), None) if kind == MODEL else None
        facts = DRAFT_FACTS[kind] if kind in DRAFT_FACTS else (entry.facts() if entry is not None else "")
        instead = entry.title if entry is not None else DRAFTER_TEXT.get(kind, kind)
        missing = self.no_server_draft()
        if missing:
            facts = f"<span style='color:#b91c1c'>{_escape(missing)}.</span>"
        elif self._replaced or self._server_drafts:  # said beside the drafter, not only in the pending line
            replaced = (f"<span style='color:#b45309'>{_escape(self._replaced)}: {_escape(instead)} instead</span><br>"
                        if self._replaced else "")
            server = f"{_escape(self._server_drafts_line())}<br>" if self._server_drafts else ""
            facts = f"{replaced}{server}{_escape(facts)}"
        self.draft_facts.setText(facts)
        self._refresh_load_enabled()
        self.draft_offload.set_model(entry.info if entry is not None else None)
        self._refresh_draft_controls()
        self.selectionChanged.emit()

    def _refresh_draft_controls(self) -> None:
        self.draft_offload.setVisible(self.draft_choice()[0] == MODEL and self.engine.runs_on() != AT_URL)


def _draft_item(entry: LibraryEntry, main: LibraryEntry, check: DraftCheck, same: bool = False,
                server: bool = False) -> QStandardItem:
    """A draft model's row; `server`: for llama-server's draft-* types, which draft token by token
    only (another vocabulary is greyed there, with llama.cpp's reason)."""
    refused = why_not_on_server(check) if server else None
    item = QStandardItem(f"{entry.title} — {SERVER_REFUSED}" if refused and check else draft_title(entry.title, check, same))
    item.setData(MODEL, KIND_ROLE)
    item.setData(entry.path, PATH_ROLE)
    item.setEnabled(bool(check) and not refused)
    item.setToolTip(f"llama-server cannot draft with it for {main.title}: {refused}" if refused and check
                    else draft_tooltip(entry, main, check, same))
    return item


SERVER_REFUSED = "other vocabulary: not for llama-server"


BASE_MODEL_NOTE = ("Base model: it has no chat template, so it was not trained to answer; it continues "
                   "the text it is given. The chat sends your text as plain completion for it.")


def main_title(entry: LibraryEntry) -> str:
    """A main model's line in the list: its title, marked when it is unusable or a base model."""
    if not entry.usable:
        return f"{entry.title} — unusable"
    return entry.title if entry.info.has_chat_template else f"{entry.title} — base model (continues text)"


# (label, PairChoice.backend) of the backend choice.
PLAN_BEFORE_LOAD = "What runs the model, and why, shows here once it is loaded."
BACKEND_LABELS = (("Backend: auto (llama.cpp where it runs)", AUTO), ("Backend: llama.cpp", LLAMA_CPP),
                  ("Backend: torch", TORCH))


def main_facts_text(main: LibraryEntry | None) -> str:
    """The facts under the main model's list, with the base-model note where it applies."""
    if main is None:
        return "Add a GGUF file in the Library tab."
    return main.facts() if main.info.has_chat_template else f"{main.facts()}\n{BASE_MODEL_NOTE}"


def plan_text(facts: Facts) -> str:
    """What the loaded main model runs on and why."""
    if facts.engine_line:  # llama-server here or at a URL
        return f"Runs on {facts.engine_line}"
    plan = facts.main_plan or "?"
    reason = facts.main_plan_reason
    if facts.backend == LLAMA_CPP:  # the plan names the backend: say why it was chosen
        tps = facts.main_plain_tps
        speed = f" · about {tps:.0f} tok/s without drafting" if tps else ""
        return f"Runs on {plan}{speed}" + (f" — {reason}" if reason and not reason.startswith("llama.cpp on") else "")
    backend = facts.backend_reason
    why = (backend or "").removeprefix("torch: ").removeprefix("torch, ")
    return f"Runs on torch ({why}) · {plan}" if backend else f"Runs on torch · {plan}" + (f" — {reason}" if reason else "")


def loaded_text(facts: Facts) -> str:
    from app.ui.common.format import format_bytes

    if facts.engine_line:
        took = "connected" if facts.where == AT_URL else "started"
        return f"{took.capitalize()} in {facts.load_s:.1f} s: {facts.engine_line}"
    draft = DRAFTER_TEXT.get(facts.drafter, facts.draft_name)
    if facts.ngram_entries is not None and facts.drafter in (NGRAM_CACHE, LOOKUP_CACHE, LEARNING):
        draft += f" ({facts.ngram_entries:,} word sequences learned)"
    took = (f"(drafter changed in {facts.swap_s:.1f} s, the main model stayed loaded)"
            if facts.main_kept else f"in {facts.load_s:.1f} s")
    text = (f"Loaded {facts.main_name} ({facts.main_plan}) with {draft} "
            f"{took}, ≈ {format_bytes(facts.memory_bytes)}")
    if facts.draft_plan:
        text += f"; draft on {facts.draft_plan}"
    return text


def pending_notes(loaded: PairChoice, chosen: PairChoice) -> dict[str, str]:
    """For the same main model: a note for each control whose value is not the running one."""
    notes = {}
    if chosen.backend != loaded.backend:
        notes["backend"] = f"Needs Load: the model runs on backend “{loaded.backend}” until then."
    if chosen.main_gpu_layers != loaded.main_gpu_layers:
        notes["main_gpu"] = f"Needs Load: {_layers(loaded.main_gpu_layers)} on the GPU in what runs now."
    same_draft = chosen.drafter == MODEL and chosen.draft_path == loaded.draft_path
    if same_draft and chosen.draft_gpu_layers != loaded.draft_gpu_layers:
        notes["draft_gpu"] = f"Needs Apply: {_layers(loaded.draft_gpu_layers)} on the GPU in what runs now."
    return notes


def pending_text(loaded: PairChoice, chosen: PairChoice, names: dict[str, str], swap: bool) -> str:
    """The pending line: what is chosen but not running, and what its action does."""
    def drafter(spec: PairChoice) -> str:
        if spec.drafter == MODEL:
            return names.get(spec.draft_path or "", Path(spec.draft_path or "").stem)
        return DRAFTER_TEXT.get(spec.drafter, spec.drafter)

    changes = []
    engine = (chosen.runs_on, chosen.spec_type, chosen.rpc, chosen.server_url)
    if engine != (loaded.runs_on, loaded.spec_type, loaded.rpc, loaded.server_url):
        changes.append(f"where it runs ({_where(chosen)})")
    if chosen.main_path != loaded.main_path and chosen.runs_on != AT_URL:
        changes.append(f"main model {names.get(chosen.main_path, Path(chosen.main_path).stem)}")
    else:
        notes = pending_notes(loaded, chosen)
        changes += [label for key, label in (("backend", f"backend {chosen.backend}"),
                                             ("main_gpu", "main model's GPU layers")) if key in notes]
    if (chosen.drafter, chosen.draft_path) != (loaded.drafter, loaded.draft_path):
        changes.append("no drafting" if chosen.drafter == NONE else f"drafting with {drafter(chosen)}")
    elif chosen.drafter == MODEL and chosen.draft_gpu_layers != loaded.draft_gpu_layers:
        changes.append("draft model's GPU layers")
    changes = changes or ["other settings"]
    running = names.get(loaded.main_path, Path(loaded.main_path).stem)
    action = ("Apply changes only the drafter: the main model stays loaded." if swap else
              f"Load replaces {running}, which runs until then.")
    return f"Chosen, not running yet: {', '.join(changes)}. {action}"


def _where(spec: PairChoice) -> str:
    if spec.runs_on == AT_URL:
        return spec.server_url or "a URL"
    if spec.runs_on == LLAMA_SERVER:
        return f"llama-server --spec-type {spec.spec_type}" + (f" over RPC workers {spec.rpc}" if spec.rpc else "")
    return "this computer"


def _layers(value: int | None) -> str:
    return "all layers" if value is None else ("no layers" if value == 0 else f"{value} layers")


def _note_label() -> QLabel:
    label = small_muted_label("")
    label.setWordWrap(True)
    label.setStyleSheet("color: #b45309")  # amber: a change waiting, not an error
    label.setVisible(False)
    return label


class _WholeTextCombo(QComboBox):
    """A combo box whose tooltip starts with its whole current text: a long title, cut to the
    panel's width ("... — same w"), can always be read (issue 52 item 9)."""

    def setToolTip(self, tip: str) -> None:  # noqa: N802 (Qt's name)
        self._about = tip
        self._show_whole_text()

    def _show_whole_text(self) -> None:
        about = getattr(self, "_about", "")
        super().setToolTip(f"{self.currentText()}\n\n{about}" if self.currentText() and about else about or self.currentText())


def _combo() -> QComboBox:
    combo = _WholeTextCombo()
    combo.currentIndexChanged.connect(combo._show_whole_text)
    combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
    combo.setMinimumContentsLength(20)
    combo.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
    return combo


def _small_label(text: str = "") -> QLabel:
    return small_muted_label(text)


def _escape(text: str) -> str:
    from app.ui.common.format import html_text  # Qt's rich text shows html.escape's &#x27; as it is

    return html_text(text)
