"""The Library tab: every local model with its header facts; add files and folders.

Headers are read on a background thread (the built-in Gemma is assembled from its parts the first
time, which takes seconds), so the window never waits for a disk. The real main + draft pair is
offered here too (its 1.6 GB are made ready on request: app.ui.shell.pair_offer). Files and folders the user adds
are remembered in the settings. A file that cannot be used stays listed, greyed, with the reason.
"""

from __future__ import annotations

import html
import logging
from pathlib import Path

from PySide6.QtCore import QSettings, Qt, Signal
from PySide6.QtGui import QBrush, QPalette
from PySide6.QtWidgets import (
    QFileDialog,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QPushButton,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.hub.builtin import PAIR_SIZE_TEXT
from app.hub.library_entries import BUILTIN, CACHE, FILE, FOLDER, LibraryEntry, count_text, scan_library
from app.ui.common.elide import ModelNameDelegate
from app.ui.common.style import small_muted_label
from app.worker.tasks import BackgroundTask

log = logging.getLogger(__name__)

COLUMNS = ["Model", "Source", "Arch", "Params", "Quant"]  # the rest: in the details line
SOURCE_TEXT = {BUILTIN: "built-in", CACHE: "HF cache", FOLDER: "folder", FILE: "file"}
FILES_KEY, FOLDERS_KEY = "library/files", "library/folders"
PATH_ROLE = Qt.ItemDataRole.UserRole
PAIR_BUTTON = f"Load a real main + draft pair ({PAIR_SIZE_TEXT})"


def row_texts(entry: LibraryEntry) -> list[str]:
    info = entry.info
    source = SOURCE_TEXT.get(entry.source, entry.source)
    if entry.same_as:  # a download of a built-in model: it was already here
        source += " (= built-in)"
    if info is None:
        return [entry.title, source, "unusable", "", ""]
    return [entry.title, source, info.architecture, count_text(info.n_params), info.file_type or "?"]


def copies_text(entry: LibraryEntry) -> str:
    """Where else this very file is (a download of a built-in model), one line each."""
    return "".join(f"\nalso here: {path} (the same file, listed once)" for path in entry.copies)


def settings_list(settings: QSettings, key: str) -> list[str]:
    """A list from the INI file (where a one-item list reads back as a plain string)."""
    value = settings.value(key, [])
    if isinstance(value, str):
        return [value] if value else []
    return [str(v) for v in value or []]


class LibraryPanel(QWidget):
    """entriesChanged(list[LibraryEntry]) after each scan; mainChosen(path) on double-click;
    message(str) for the status bar (e.g. why an added file was refused); pairRequested() from
    the real pair's offer (app.ui.shell.pair_offer), which also cancels it while it runs."""

    entriesChanged = Signal(list)
    mainChosen = Signal(str)
    message = Signal(str)
    pairRequested = Signal()

    def __init__(self, settings: QSettings, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._settings = settings
        self._entries: list[LibraryEntry] = []
        self._task: BackgroundTask | None = None
        self._rescan_again = False
        self._just_added: set[str] = set()

        self.tree = QTreeWidget()
        self.tree.setHeaderLabels(COLUMNS)
        self.tree.setRootIsDecorated(False)
        self.tree.setAlternatingRowColors(True)
        self.tree.setUniformRowHeights(True)
        # Names shortened to the column, each told apart from the others: "qwen2.5-coder-1.5b… (Q4_K_M)"
        # beside "…0.5b…", where a middle cut read "FA…M)" for both; whole in the tooltip.
        self.tree.setItemDelegateForColumn(0, ModelNameDelegate(self.tree, self._titles))
        header = self.tree.header()
        header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        header.setStretchLastSection(False)
        self.tree.itemDoubleClicked.connect(self._on_double_click)
        self.tree.currentItemChanged.connect(self._show_details)
        self.details = QLabel()
        self.details.setWordWrap(True)
        self.details.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.details.setMinimumHeight(self.fontMetrics().lineSpacing() * 3)

        self.add_file_button = QPushButton("Add GGUF file…")
        self.add_file_button.clicked.connect(self.choose_files)
        self.add_folder_button = QPushButton("Add folder…")
        self.add_folder_button.clicked.connect(self.choose_folder)
        self.remove_button = QPushButton("Remove")
        self.remove_button.setToolTip("Forget the selected file or folder (nothing is deleted from disk)")
        self.remove_button.clicked.connect(self.remove_selected)
        self.status = small_muted_label("Reading model headers…", selectable=False)
        self.pair_button = QPushButton(PAIR_BUTTON)
        self.pair_button.clicked.connect(self.pairRequested)
        self.pair_note = small_muted_label("", selectable=True)
        self._pair_note_text = ""

        buttons = QHBoxLayout()
        for button in (self.add_file_button, self.add_folder_button, self.remove_button):
            buttons.addWidget(button)
        buttons.addStretch(1)
        pair = QHBoxLayout()
        pair.addWidget(self.pair_button, 0, Qt.AlignmentFlag.AlignTop)
        pair.addWidget(self.pair_note, 1)
        layout = QVBoxLayout(self)
        layout.addLayout(buttons)
        layout.addLayout(pair)
        layout.addWidget(self.tree, 1)
        layout.addWidget(self.details)
        layout.addWidget(self.status)

    # --- what the library holds ---------------------------------------------------------------

    def entries(self) -> list[LibraryEntry]:
        return list(self._entries)

    def files(self) -> list[str]:
        return settings_list(self._settings, FILES_KEY)

    def folders(self) -> list[str]:
        return settings_list(self._settings, FOLDERS_KEY)

    def add_files(self, paths: list[str]) -> None:
        known = self.files()
        new = [str(Path(p)) for p in paths if str(Path(p)) not in known]
        self._settings.setValue(FILES_KEY, known + new)
        self._just_added.update(new)
        self.rescan()

    def add_folder(self, folder: str) -> None:
        known = self.folders()
        if folder not in known:
            self._settings.setValue(FOLDERS_KEY, known + [folder])
        self.rescan()

    def remove_selected(self) -> None:
        item = self.tree.currentItem()
        if item is None:
            return
        path = item.data(0, PATH_ROLE)
        entry = self._entry(path)
        paths = [path, *(entry.copies if entry is not None else ())]  # a copy added by hand goes too
        files = [f for f in self.files() if f not in paths]
        folders = [f for f in self.folders() if not any(Path(p).is_relative_to(f) for p in paths)]
        if files == self.files() and folders == self.folders():
            self.message.emit("only files and folders you added can be removed from the list")
            return
        self._settings.setValue(FILES_KEY, files)
        self._settings.setValue(FOLDERS_KEY, folders)
        self.rescan()

    def choose_files(self) -> None:
        paths, _ = QFileDialog.getOpenFileNames(
            self, "Add GGUF model files", str(Path.home()), "GGUF models (*.gguf);;All files (*)"
        )
        if paths:
            self.add_files(paths)

    def choose_folder(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Add a folder of GGUF models", str(Path.home()))
        if folder:
            self.add_folder(folder)

    # --- the real pair's offer ------------------------------------------------------------------

    def set_pair_note(self, text: str) -> None:
        self._pair_note_text = text
        self.pair_note.setText(html.escape(text))

    def set_pair_status(self, text: str) -> None:
        """How far getting the pair ready is, or why it failed; the offer's note when empty."""
        self.pair_note.setText(html.escape(text or self._pair_note_text))

    def set_pair_busy(self, busy: bool) -> None:
        self.pair_button.setText("Cancel" if busy else PAIR_BUTTON)
        self.pair_button.setToolTip("Stop getting the pair ready (a download keeps what arrived)" if busy else "")

    # --- scanning -----------------------------------------------------------------------------

    def rescan(self) -> None:
        if self._task is not None:
            self._rescan_again = True  # one scan at a time; the latest request wins
            return
        self.status.setText("Reading model headers…")
        self._task = BackgroundTask(scan_library, self.files(), self.folders())
        self._task.signals.done.connect(self._on_scanned)
        self._task.signals.failed.connect(self._on_scan_failed)
        self._task.start()

    def is_scanning(self) -> bool:
        return self._task is not None

    def _on_scanned(self, entries: list[LibraryEntry]) -> None:
        self._task = None
        if self._rescan_again:
            self._rescan_again = False
            self.rescan()
            return
        self._entries = entries
        self._fill(entries)
        usable = sum(e.usable for e in entries)
        self.status.setText(f"{usable} usable model{'s' if usable != 1 else ''}, {len(entries) - usable} not usable")
        refused = [e for e in entries if e.path in self._just_added and not e.usable]
        if len(refused) == 1:
            self.message.emit(f"refused {refused[0].error}")
        elif refused:
            self.message.emit(f"refused {len(refused)} files (details in the Library tab); first: {refused[0].error}")
        self._just_added.clear()
        self.entriesChanged.emit(entries)

    def _on_scan_failed(self, message: str) -> None:
        self._task = None
        self.status.setText(f"could not read the library: {message}")
        self.message.emit(f"could not read the library: {message}")

    def _fill(self, entries: list[LibraryEntry]) -> None:
        self.tree.clear()
        grey = QBrush(self.palette().color(QPalette.ColorGroup.Disabled, QPalette.ColorRole.Text))
        for entry in entries:
            item = QTreeWidgetItem(row_texts(entry))
            item.setData(0, PATH_ROLE, entry.path)
            tip = f"{entry.title}\n{entry.path or 'built-in'}{copies_text(entry)}\n{entry.facts()}"
            for column in range(len(COLUMNS)):
                item.setToolTip(column, tip)
                if not entry.usable:
                    item.setForeground(column, grey)
            self.tree.addTopLevelItem(item)
        self.details.setText("Double-click a model to make it the main model.")

    def _show_details(self, item: QTreeWidgetItem | None, _previous=None) -> None:
        entry = self._entry(item.data(0, PATH_ROLE)) if item is not None else None
        if entry is None:
            return
        where = {BUILTIN: "built-in model", CACHE: f"Hugging Face cache: {entry.path}"}.get(entry.source, entry.path)
        if entry.usable:
            copies = html.escape(copies_text(entry)).replace("\n", "<br>")
            self.details.setText(f"<b>{html.escape(entry.title)}</b> · {html.escape(where)}{copies}<br>"
                                 f"{html.escape(entry.facts())}")
        else:
            self.details.setText(f"<b>{html.escape(entry.title)}</b> · {html.escape(where)}<br>"
                                 f"<span style='color:#b91c1c'>{html.escape(entry.error or 'unusable')}</span>")

    def _titles(self) -> list[str]:
        return [e.title for e in self._entries]

    def _entry(self, path: str) -> LibraryEntry | None:
        return next((e for e in self._entries if e.path == path), None)

    def _on_double_click(self, item: QTreeWidgetItem, _column: int) -> None:
        path = item.data(0, PATH_ROLE)
        entry = self._entry(path)
        if entry is not None and entry.usable:
            self.mainChosen.emit(path)
        elif entry is not None:
            self.message.emit(entry.error or "this file cannot be used")
