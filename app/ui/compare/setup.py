"""The left column of the compare window: what to compare, and Run / Cancel with progress (the
run_panel, which the window lays out under the scrolled choices).

Main model from the library; drafts as checkboxes ("None" always on: it is the baseline; the
chat's default drafter, ticked at first, and the other n-gram drafters; llama-server's types; every
library model whose vocabulary fits the main model's, decided on headers, the others
greyed with the reason); the draft length (adaptive, or a sweep of fixed lengths); the prompt set
(built-in categories, your own text as one prompt, a prompt file); tokens per reply; precision.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QButtonGroup, QCheckBox, QComboBox, QFileDialog, QFormLayout, QGridLayout, QGroupBox, QHBoxLayout,
    QLineEdit, QListWidget, QListWidgetItem, QPlainTextEdit, QProgressBar, QPushButton, QRadioButton,
    QSpinBox, QVBoxLayout, QWidget,
)

from app.compare.choices import parse_lengths, server_choice, url_choice
from app.compare.prompts import BUILTIN_PROMPTS, CATEGORIES, Prompt, builtin_prompts, own_prompt, read_prompt_file
from app.compare.results import (COMPARE_DEFAULTS, DEFAULT_DRAFT_MAX, LLAMA_SERVER, LOOKUP, MODEL, NONE,
                                 CompareRequest, DraftChoice, Progress, RunSettings)
from app.engine.drafting.compat import check_draft
from app.engine.drafting.kinds import LEARNING, LOOKUP_CACHE, NGRAM_CACHE, NGRAM_MOD
from app.engine.errors import SpeculaError
from app.engine.llama_server.programs import SERVER, find_program, missing_reason
from app.engine.llama_server.spec import check_url
from app.ui.models.draft_labels import draft_title, draft_tooltip, is_same_model
from app.hub.library_entries import LibraryEntry, entry_path
from app.ui.common.style import small_muted_label

CHOICE_ROLE = Qt.ItemDataRole.UserRole + 1  # (kind, path) of a draft item
PRECISIONS = ("auto", "float32", "bfloat16", "float16")
DEFAULT_RUNS = 3  # the fewest that show a spread with one run to spare for a slow spell
# Every drafter the chat's pair picker offers (app.ui.models.pair_picker), its default first, and our
# ngram-mod: (text, kind, tooltip). A run's n-gram cache and ngram-mod pool start empty and learn from each
# of its replies, as the chat's learn from your chats.
_LEARNS = "starts empty in each run and learns from each of its replies, as the chat's does"
NGRAM_CHOICES = (
    ("Lookup + n-gram cache + ngram-mod (the chat's default)", LEARNING,
     "The chat's default drafter: prompt lookup, the n-gram cache and the ngram-mod pool together, the longest "
     "match drafting. Its cache and pool start empty in each run and learn from each of its replies, as the "
     "chat's do."),
    ("Prompt lookup (no draft model)", LOOKUP,
     "Drafts by copying what followed the last few tokens earlier in the prompt and reply."),
    ("N-gram cache (learns from the run's replies)", NGRAM_CACHE, f"The n-gram cache {_LEARNS}."),
    ("ngram-mod (learns from the run's replies)", NGRAM_MOD,
     f"llama.cpp's ngram-mod, in our loop: a pool of 24-token n-grams that {_LEARNS}; a repeated answer "
     "drafts whole."),
    ("Prompt lookup + n-gram cache", LOOKUP_CACHE,
     f"Prompt lookup and the n-gram cache together; the cache {_LEARNS}."),
)
DEFAULT_CHECKED = LEARNING  # what a first run compares with plain decoding: the chat's default
# llama.cpp's own speculation, the peer: llama-server started here per round on the same prompt ids.
# (its --spec-type list; "" is its plain decoding). The draft-* types need a draft model: the CLI's -md.
SERVER_CHOICES = (("llama-server: plain decoding", ""), ("llama-server: ngram-mod", "ngram-mod"),
                  ("llama-server: ngram-simple", "ngram-simple"), ("llama-server: ngram-map-k", "ngram-map-k"),
                  ("llama-server: ngram-map-k4v", "ngram-map-k4v"), ("llama-server: ngram-cache", "ngram-cache"))


class CompareSetup(QWidget):
    runRequested = Signal(object)  # CompareRequest
    cancelRequested = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._entries: list[LibraryEntry] = []
        self._file_prompts: list[Prompt] = []
        self._file_name = ""

        self.main_combo = QComboBox()
        self.main_combo.setToolTip("The model whose output you get; it stays loaded for the whole run.")
        self.main_combo.currentIndexChanged.connect(self._fill_drafts)
        self.drafts = QListWidget()
        self.drafts.setToolTip("Each checked drafter runs every prompt; None is the baseline of every speedup.")
        self.drafts.setMinimumHeight(90)
        self.drafts.setTextElideMode(Qt.TextElideMode.ElideMiddle)  # each item's tooltip has it whole
        self.drafts.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)  # elided, not scrolled
        self.drafts.setMaximumHeight(150)

        self.server_url = QLineEdit()
        self.server_url.setPlaceholderText("Also ask a server at URL (optional), e.g. http://127.0.0.1:8080")
        self.server_url.setToolTip("A llama-server or any OpenAI-compatible server answers the same prompts with its "
                                   "own model and speculation: one more row")

        self.adaptive = QRadioButton(f"Adaptive length (up to {DEFAULT_DRAFT_MAX})")
        self.adaptive.setToolTip("The engine's default: the draft length follows the measured acceptance and cost.")
        self.sweep = QRadioButton("Fixed lengths:")
        self.sweep.setToolTip("Run each drafter once per length, always drafting that many tokens (llama.cpp's way).")
        self.sweep_lengths = QLineEdit("4,8,16")
        self.sweep_lengths.setEnabled(False)
        group = QButtonGroup(self)
        group.addButton(self.adaptive)
        group.addButton(self.sweep)
        self.adaptive.setChecked(True)
        self.sweep.toggled.connect(self.sweep_lengths.setEnabled)

        self.category_boxes: dict[str, QCheckBox] = {}
        for prompt in BUILTIN_PROMPTS:
            box = QCheckBox(prompt.category)
            box.setChecked(True)
            box.setToolTip(prompt.text)
            self.category_boxes[prompt.category] = box
        self.own_text = QPlainTextEdit()
        self.own_text.setPlaceholderText("Your own prompt (optional): run as one more prompt, category \"own\"")
        self.own_text.setMaximumHeight(70)
        self.file_button = QPushButton("Prompt file…")
        self.file_button.setToolTip("JSON lines {\"category\": ..., \"prompt\": ...}, or plain text with one "
                                    "prompt per paragraph")
        self.file_button.clicked.connect(self.choose_prompt_file)
        self.clear_file_button = QPushButton("Clear")
        self.clear_file_button.clicked.connect(lambda: self.set_prompt_file(None))
        self.file_label = small_muted_label("")

        self.n_predict = QSpinBox()
        self.n_predict.setRange(4, 4096)
        self.n_predict.setValue(64)
        self.n_predict.setToolTip("Tokens per reply (greedy, the same seed for every drafter)")
        self.repeats = QSpinBox()
        self.repeats.setRange(1, 20)
        self.repeats.setValue(DEFAULT_RUNS)
        self.repeats.setToolTip("How many times every drafter runs the whole prompt set (llama-bench's -r). A drafter "
                                "is called the winner only when its slowest run beats plain decoding's fastest.")
        self.precision = QComboBox()
        self.precision.addItems(PRECISIONS)
        self.precision.setToolTip("auto: the backend's own (llama.cpp keeps the file's types). Any other value runs the\n"
                                  "comparison on torch in that precision. Either way a batch of drafts can round a near-tie\n"
                                  "between two tokens otherwise than a one-token step; 'identical' says where it did")

        self.run_button = QPushButton("Run")
        self.run_button.setDefault(True)
        self.run_button.clicked.connect(self._on_run)
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setEnabled(False)
        self.cancel_button.setToolTip("Stop after the current step; the finished results are kept and saved")
        self.cancel_button.clicked.connect(self.cancelRequested)
        self.progress = QProgressBar()
        self.progress.setFormat("")
        # What runs now, under the bar (a stage such as "llama-server ngram-mod · code (2/5, run 2/3)"
        # is wider than the column): whole, wrapped, never clipped by the bar.
        self.stage = small_muted_label("")
        self.status = small_muted_label("")
        self._layout()
        self._fill_drafts()

    def _layout(self) -> None:
        main_box = QGroupBox("Main model")
        QVBoxLayout(main_box).addWidget(self.main_combo)
        draft_box = QGroupBox("Drafts")
        draft_layout = QVBoxLayout(draft_box)
        draft_layout.addWidget(self.drafts)
        draft_layout.addWidget(self.server_url)
        draft_layout.addWidget(self.adaptive)
        sweep_row = QHBoxLayout()
        sweep_row.addWidget(self.sweep)
        sweep_row.addWidget(self.sweep_lengths, 1)
        draft_layout.addLayout(sweep_row)
        prompt_box = QGroupBox("Prompts")
        prompt_layout = QVBoxLayout(prompt_box)
        grid = QGridLayout()
        for i, box in enumerate(self.category_boxes.values()):
            grid.addWidget(box, i // 3, i % 3)
        prompt_layout.addLayout(grid)
        prompt_layout.addWidget(self.own_text)
        file_row = QHBoxLayout()
        file_row.addWidget(self.file_button)
        file_row.addWidget(self.clear_file_button)
        file_row.addStretch(1)
        prompt_layout.addLayout(file_row)
        prompt_layout.addWidget(self.file_label)
        form = QFormLayout()
        form.addRow("Tokens per reply", self.n_predict)
        form.addRow("Runs of each", self.repeats)
        form.addRow("Precision", self.precision)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        for widget in (main_box, draft_box, prompt_box):
            layout.addWidget(widget)
        layout.addLayout(form)
        layout.addStretch(1)
        # Run, Cancel and the progress in a panel of their own, which the window keeps in sight
        # under the scrolled choices (on a 720-pixel screen they were below the fold).
        self.run_panel = QWidget()
        buttons = QHBoxLayout()
        buttons.addWidget(self.run_button)
        buttons.addWidget(self.cancel_button)
        run_layout = QVBoxLayout(self.run_panel)
        run_layout.setContentsMargins(0, 4, 0, 0)
        run_layout.addLayout(buttons)
        for widget in (self.progress, self.stage, self.status):
            run_layout.addWidget(widget)
        self.set_prompt_file(None)
        self.set_stage("")

    # --- the library ---------------------------------------------------------------------------

    def set_entries(self, entries: list[LibraryEntry]) -> None:
        current = self.main_path()
        self._entries = [e for e in entries if e.usable]
        self.main_combo.blockSignals(True)
        self.main_combo.clear()
        for entry in self._entries:
            self.main_combo.addItem(entry.title, entry.path)
            self.main_combo.setItemData(self.main_combo.count() - 1, entry.facts(), Qt.ItemDataRole.ToolTipRole)
        self.main_combo.blockSignals(False)
        if not current or not self.select_main(current):
            self.main_combo.setCurrentIndex(0 if self._entries else -1)
            self._fill_drafts()

    def select_main(self, path: str | None) -> bool:
        path = entry_path(self._entries, path)  # a copy of a listed file selects its entry
        index = self.main_combo.findData(path) if path else -1
        if index < 0:
            return False
        if index == self.main_combo.currentIndex():
            self._fill_drafts()
        self.main_combo.setCurrentIndex(index)
        return True

    def main_path(self) -> str | None:
        return self.main_combo.currentData()

    def _main_entry(self) -> LibraryEntry | None:
        return next((e for e in self._entries if e.path == self.main_path()), None)

    def _fill_drafts(self, _index: int = 0) -> None:
        checked = {c for c in self._checked()} if self.drafts.count() else {(DEFAULT_CHECKED, None)}
        self.drafts.clear()
        baseline = self._add_draft("None (plain decoding: the baseline)", (NONE, None), True)
        baseline.setFlags(baseline.flags() & ~Qt.ItemFlag.ItemIsUserCheckable)
        for text, kind, tip in NGRAM_CHOICES:
            self._add_draft(text, (kind, None), (kind, None) in checked).setToolTip(f"{text}\n{tip}")
        server_missing = None if find_program(SERVER) else missing_reason(SERVER)
        for text, types in SERVER_CHOICES:
            item = self._add_draft(text, (LLAMA_SERVER, types), (LLAMA_SERVER, types) in checked)
            plain = "" if not types else ("; its plain decoding runs beside it, to tell its drafting from its "
                                          "engine's own speed")
            item.setToolTip(server_missing or f"{text}: llama.cpp's own engine and speculation, started here "
                                              f"for each run on the same prompt ids (the peer to beat){plain}")
            if server_missing:
                item.setFlags(item.flags() & ~Qt.ItemFlag.ItemIsEnabled)
        main = self._main_entry()
        for entry in self._entries:
            if main is None or entry.path == main.path:
                continue
            result = check_draft(main.info, entry.info)
            choice = (MODEL, entry.path)
            same = is_same_model(entry, main)  # offered (it can be measured), marked, never kept ticked
            item = self._add_draft(draft_title(entry.title, result, same), choice,
                                   bool(result) and choice in checked and not same)
            item.setToolTip(f"{item.text()}\n{draft_tooltip(entry, main, result, same)}")
            if not result:
                item.setFlags(item.flags() & ~Qt.ItemFlag.ItemIsEnabled)

    def _add_draft(self, text: str, choice: tuple[str, str | None], checked: bool) -> QListWidgetItem:
        item = QListWidgetItem(text, self.drafts)
        item.setToolTip(text)
        item.setData(CHOICE_ROLE, choice)
        item.setFlags(item.flags() | Qt.ItemFlag.ItemIsUserCheckable)
        item.setCheckState(Qt.CheckState.Checked if checked else Qt.CheckState.Unchecked)
        return item

    def _checked(self) -> list[tuple[str, str | None]]:
        items = [self.drafts.item(i) for i in range(self.drafts.count())]
        return [tuple(i.data(CHOICE_ROLE)) for i in items
                if i.checkState() == Qt.CheckState.Checked and i.flags() & Qt.ItemFlag.ItemIsEnabled]

    def check_draft(self, kind: str, path: str | None = None, checked: bool = True) -> bool:
        """Tick (or untick) a drafter; False if it is not offered (tests and restoring)."""
        for i in range(self.drafts.count()):
            item = self.drafts.item(i)
            if tuple(item.data(CHOICE_ROLE)) == (kind, path) and item.flags() & Qt.ItemFlag.ItemIsEnabled:
                item.setCheckState(Qt.CheckState.Checked if checked else Qt.CheckState.Unchecked)
                return True
        return False

    def draft_texts(self) -> list[tuple[str, bool]]:
        """(text, enabled) of every draft item, as shown."""
        items = [self.drafts.item(i) for i in range(self.drafts.count())]
        return [(i.text(), bool(i.flags() & Qt.ItemFlag.ItemIsEnabled)) for i in items]

    # --- prompts -------------------------------------------------------------------------------

    def choose_prompt_file(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Prompt file", "", "Prompt files (*.jsonl *.txt *.md);;All files (*)")
        if path:
            self.set_prompt_file(path)

    def set_prompt_file(self, path: str | None) -> None:
        self._file_prompts, self._file_name = [], ""
        if path:
            try:
                self._file_prompts, self._file_name = read_prompt_file(path), Path(path).name
            except SpeculaError as exc:
                self.status.setText(str(exc))
        self.clear_file_button.setVisible(bool(self._file_prompts))
        self.file_label.setVisible(bool(self._file_prompts))
        count = len(self._file_prompts)
        self.file_label.setText(f"{self._file_name}: {count} prompt{'s' * (count != 1)}")

    def prompts(self) -> list[Prompt]:
        chosen = [c for c in CATEGORIES if self.category_boxes[c].isChecked()]
        prompts = builtin_prompts(chosen)
        if self.own_text.toPlainText().strip():
            prompts.append(own_prompt(self.own_text.toPlainText()))
        return prompts + self._file_prompts

    # --- the request ---------------------------------------------------------------------------

    def request(self) -> CompareRequest:
        """What the widgets say, or a SpeculaError naming what is missing."""
        main = self._main_entry()
        if main is None:
            raise SpeculaError("pick a main model (add GGUF files in the main window's Library tab)")
        prompts = self.prompts()
        if not prompts:
            raise SpeculaError("pick at least one prompt category, or give a prompt")
        sweep = parse_lengths(self.sweep_lengths.text()) if self.sweep.isChecked() else ()
        titles = {e.path: e.title for e in self._entries}
        drafts = tuple(server_choice(path or NONE) if kind == LLAMA_SERVER
                       else DraftChoice(kind, path, titles.get(path, kind) if path else kind)
                       for kind, path in self._checked() if kind != NONE)
        if self.server_url.text().strip():
            try:
                drafts += (url_choice(check_url(self.server_url.text().strip())),)
            except ValueError as exc:
                raise SpeculaError(f"server: {exc}") from None
        settings = RunSettings(replace(COMPARE_DEFAULTS, max_tokens=self.n_predict.value()), draft_sweep=sweep,
                               repeats=self.repeats.value())
        return CompareRequest(main.path, drafts, tuple(prompts), settings, dtype=self.precision.currentText())

    def _on_run(self) -> None:
        try:
            request = self.request()
        except SpeculaError as exc:
            self.status.setText(str(exc))
            return
        self.runRequested.emit(request)

    def set_running(self, running: bool) -> None:
        for widget in (self.main_combo, self.drafts, self.server_url, self.adaptive, self.sweep, self.own_text,
                       self.file_button, self.clear_file_button, self.n_predict, self.repeats, self.precision,
                       self.run_button):
            widget.setEnabled(not running)
        self.sweep_lengths.setEnabled(not running and self.sweep.isChecked())
        for box in self.category_boxes.values():
            box.setEnabled(not running)
        self.cancel_button.setEnabled(running)
        if running:
            self.progress.setRange(0, 0)  # busy until the first progress report
            self.progress.setFormat("starting…")
        self.set_stage("")

    def set_progress(self, progress: Progress) -> None:
        self.progress.setRange(0, max(progress.total, 1))
        self.progress.setValue(progress.done)
        self.progress.setFormat("%v/%m results")
        self.set_stage(progress.stage)

    def set_stage(self, text: str) -> None:
        self.stage.setText(text)
        self.stage.setVisible(bool(text))

