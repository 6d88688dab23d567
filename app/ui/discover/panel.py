"""The Discover tab: find GGUF models on Hugging Face, see before downloading whether one fits
this machine and can draft for the chosen main model, and download it with progress and cancel.

Every hub call runs on a worker (app.worker.hub_tasks.HubCalls); a result for a search, repository
or file the user has already left is dropped there, so the panel only shows what is selected now.
Errors are one line in the panel (and on the status bar for downloads), never a dialog. A gated
repository brings up a token field; once the token is saved, what failed is tried again.
"""

from __future__ import annotations

import dataclasses
import html
import logging
from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QFont, QResizeEvent
from PySide6.QtWidgets import (
    QComboBox,
    QFrame,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QPushButton,
    QScrollArea,
    QSplitter,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.engine.gguf.info import GGUFInfo
from app.ui.discover import text
from app.ui.discover.widgets import DONE, DownloadStrip, TokenPrompt
from app.ui.common.format import format_bytes
from app.ui.common.style import scrolling, small_muted_label
from app.worker.hub_tasks import (CANCELLED, DOWNLOAD, GATED, INTERRUPTED, NOT_GGUF, FileFacts, HubCalls, HubFailure,
                                  RepoFiles, check_draft, list_repo_files, local_copies, read_file_facts, save_hub_token,
                                  search_repos)

log = logging.getLogger(__name__)

SEARCH, FILES, STATES, HEADER, COMPAT, TOKEN = "search", "files", "states", "header", "compat", "token"
SORTS = [("Most downloaded", "downloads"), ("Most liked", "likes"), ("Recently updated", "recent")]
SEARCH_LIMIT = 50
SIDE_BY_SIDE_WIDTH = 760  # wider than this, repositories and files sit side by side
KEY_ROLE = Qt.ItemDataRole.UserRole
TOKEN_PROMPT = ("This repository needs a Hugging Face token with access to it: accept its terms on its "
                "page, then paste a read token here.")


def _tree(columns: list[str]) -> QTreeWidget:
    tree = QTreeWidget()
    tree.setHeaderLabels(columns)
    tree.setUniformRowHeights(True)
    tree.setAlternatingRowColors(True)
    tree.setTextElideMode(Qt.TextElideMode.ElideMiddle)  # an owner and a name's end both stay
    header = tree.header()
    header.setStretchLastSection(False)
    header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
    header.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
    return tree


class DiscoverPanel(QWidget):
    downloaded = Signal(str)  # path of a verified, complete GGUF now in the HF cache
    statusMessage = Signal(str)  # one-line messages for the status bar

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.calls = HubCalls(self)
        self.calls.finished.connect(self._on_finished)
        self.calls.failed.connect(self._on_failed)
        self._main: GGUFInfo | None = None
        self._main_name: str | None = None
        self._machine = None  # app.hub.fit.MachineMemory, measured on the first header read
        self._repos: dict[str, object] = {}  # repo id -> RepoResult of the last search
        self._listing: RepoFiles | None = None
        self._file = None  # the selected GGUFModelFile
        self._facts: FileFacts | None = None
        self._header_main: GGUFInfo | None = None  # the main model the running header read checks
        self._download: tuple[str, str] | None = None  # (repo id, filename) of the strip's download
        self._retry: Callable[[], None] | None = None  # what to try again once a token is saved
        self._unusable: str | None = None  # why the selected file is not worth downloading
        self._build()

    # --- construction -------------------------------------------------------------------------

    def _build(self) -> None:
        self.query = QLineEdit()
        self.query.setPlaceholderText("Search GGUF models")  # on Hugging Face: the tooltip says how
        self.query.setToolTip("Search Hugging Face for GGUF models by a model's name or part of it, e.g. Qwen2.5 or Llama-3.2; empty lists the most popular")
        self.query.setClearButtonEnabled(True)
        self.query.returnPressed.connect(self.search)
        self.sort = QComboBox()
        for label, key in SORTS:
            self.sort.addItem(label, key)
        self.sort.setToolTip("Order of the results")
        self.sort.currentIndexChanged.connect(self._on_sort_changed)
        self.search_button = QPushButton("Search")
        self.search_button.clicked.connect(self.search)
        self.status = small_muted_label("Search the hub for GGUF models to download.", selectable=True)

        self.repos = _tree(["Repository", "Downloads", "Likes", "Updated"])
        self.repos.setRootIsDecorated(False)
        self.repos.currentItemChanged.connect(self._on_repo_changed)
        self.files = _tree(["File", "Size", "Here"])
        self.files.currentItemChanged.connect(self._on_file_changed)
        self.lists = QSplitter(Qt.Orientation.Vertical)
        self.lists.setChildrenCollapsible(False)
        self.lists.addWidget(self.repos)
        self.lists.addWidget(self.files)

        self.details = QLabel()
        self.details.setWordWrap(True)
        self.details.setTextFormat(Qt.TextFormat.RichText)
        self.details.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.details.setAlignment(Qt.AlignmentFlag.AlignTop | Qt.AlignmentFlag.AlignLeft)
        self.details.setContentsMargins(0, 4, 0, 0)
        self.download_button = QPushButton("Download")
        self.download_button.clicked.connect(self.download_selected)
        self.download_note = small_muted_label(selectable=False)
        self.token = TokenPrompt()
        self.token.tokenEntered.connect(self._save_token)
        self.strip = DownloadStrip()
        self.strip.cancelRequested.connect(self.cancel_download)
        self.strip.resumeRequested.connect(self._resume)
        self.calls.downloadProgress.connect(self.strip.progress)

        search_row = QHBoxLayout()
        search_row.addWidget(self.query, 1)
        search_row.addWidget(self.sort)
        search_row.addWidget(self.search_button)
        button_row = QHBoxLayout()
        button_row.addWidget(self.download_button)
        button_row.addWidget(self.download_note, 1)
        body = QWidget()
        layout = QVBoxLayout(body)
        layout.addLayout(search_row)
        layout.addWidget(self.status)
        # The details take the height of their text, up to a third of the panel; past that
        # they scroll, so a short tab still shows a few rows of each list.
        self.details_box = QScrollArea()
        self.details_box.setWidgetResizable(True)
        self.details_box.setFrameShape(QFrame.Shape.NoFrame)
        self.details_box.setWidget(self.details)
        layout.addWidget(self.lists, 1)
        layout.addWidget(self.details_box)
        layout.addLayout(button_row)
        layout.addWidget(self.token)
        layout.addWidget(self.strip)
        # All of it scrolls: a finished download or a long error never makes the panel (and so
        # the window) taller than the screen (issue 52 item 1).
        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 0)
        outer.addWidget(scrolling(body))
        self._show_file(None)

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        self._fit_details()
        wide = event.size().width() >= SIDE_BY_SIDE_WIDTH
        orientation = Qt.Orientation.Horizontal if wide else Qt.Orientation.Vertical
        if self.lists.orientation() != orientation:
            self.lists.setOrientation(orientation)

    # --- public API ---------------------------------------------------------------------------

    def set_main_model(self, info: GGUFInfo | None, title: str | None = None) -> None:
        """The chosen main model's header, and its name as the library shows it (never the
        file's internal general.name): the selected file is re-checked as a draft for it."""
        self._main = info
        self._main_name = (title or Path(info.path).name) if info is not None else None
        if self._facts is None:
            return
        if info is None:
            self.calls.forget(COMPAT)
            self._facts = dataclasses.replace(self._facts, compat=None)
            self._show_facts()
        else:
            self.calls.submit(COMPAT, check_draft, info, self._facts.info)

    def shutdown(self, timeout_ms: int = 3000) -> None:
        """Cancel the download (its partial is kept) and wait for the hub calls to end."""
        self.calls.shutdown(timeout_ms)

    def search(self) -> None:
        query = self.query.text().strip()
        self._set_status(f"Searching for “{query}”…" if query else "Listing the most popular GGUF models…")
        self.repos.clear()
        self._repos = {}
        self._clear_files()
        self.calls.submit(SEARCH, search_repos, query, self.sort.currentData(), SEARCH_LIMIT)

    def download_selected(self) -> None:
        f = self._file
        if f is None:
            return
        if self.strip.is_busy():
            self.statusMessage.emit("one download at a time: cancel the running one first")
            return
        self._start_download(f.repo_id, f.filename)

    def cancel_download(self) -> None:
        if self.strip.is_busy():
            self.strip.cancelling()
            self.calls.cancel_download()

    # --- search results -----------------------------------------------------------------------

    def _on_sort_changed(self) -> None:
        if self._repos or self.query.text().strip():
            self.search()

    def _show_repos(self, repos: list) -> None:
        self._repos = {r.repo_id: r for r in repos}
        for repo in repos:
            item = QTreeWidgetItem(text.repo_row(repo))
            item.setData(0, KEY_ROLE, repo.repo_id)
            tip = text.repo_tooltip(repo)
            for column in range(4):
                item.setToolTip(column, tip)
            for column in (1, 2):
                item.setTextAlignment(column, Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
            self.repos.addTopLevelItem(item)
        query = self.query.text().strip()
        if repos:
            self._set_status(f"{len(repos)} repositor{'ies' if len(repos) != 1 else 'y'}"
                             f"{f' for “{query}”' if query else ''}: pick one to see its GGUF files")
        else:
            self._set_status(f"No GGUF repositories match “{query}”." if query else "No GGUF repositories found.")

    def _on_repo_changed(self, item: QTreeWidgetItem | None, _previous=None) -> None:
        self._clear_files()
        if item is None:
            return
        repo_id = item.data(0, KEY_ROLE)
        self._placeholder(self.files, f"Listing the files of {repo_id}…")
        self.calls.submit(FILES, list_repo_files, repo_id)

    # --- files ----------------------------------------------------------------------------------

    def _clear_files(self) -> None:
        for channel in (FILES, STATES, HEADER, COMPAT):
            self.calls.forget(channel)
        self._listing = None
        self.files.clear()
        self._show_file(None)

    def _show_listing(self, listing: RepoFiles) -> None:
        self._listing = listing
        self.files.clear()
        if not listing.groups:
            self._placeholder(self.files, "No GGUF model files in this repository.")
            return
        bold = QFont(self.files.font())
        bold.setBold(True)
        for quant, members in listing.groups:
            group = QTreeWidgetItem([f"{quant} · {len(members)} file{'s' if len(members) != 1 else ''}", "", ""])
            group.setFont(0, bold)
            group.setFlags(Qt.ItemFlag.ItemIsEnabled)  # a heading, not a choice
            for f in members:
                child = QTreeWidgetItem([text.file_label(f), format_bytes(f.size_bytes), text.file_state(listing, f)])
                child.setData(0, KEY_ROLE, f.filename)
                child.setToolTip(0, f"{f.repo_id}/{f.filename}")
                child.setTextAlignment(1, Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
                group.addChild(child)
            self.files.addTopLevelItem(group)
            group.setExpanded(True)
        n = len(listing.files)
        self._set_status(f"{listing.repo_id}: {n} GGUF model{'s' if n != 1 else ''} in "
                         f"{len(listing.groups)} quantization{'s' if len(listing.groups) != 1 else ''}")

    def _on_file_changed(self, item: QTreeWidgetItem | None, _previous=None) -> None:
        filename = item.data(0, KEY_ROLE) if item is not None else None
        f = next((f for f in self._listing.files if f.filename == filename), None) if self._listing else None
        self._show_file(f)
        if f is not None:
            self._read_header()

    def _read_header(self) -> None:
        f = self._file
        self._facts = None
        self._header_main = self._main
        self._set_details(f"<b>{html.escape(text.file_label(f))}</b> · {format_bytes(f.size_bytes)}"
                          f"<br><i>reading header…</i>")
        self.calls.forget(COMPAT)
        self.calls.submit(HEADER, read_file_facts, f.repo_id, f.filename, self._main, self._machine)

    def _show_file(self, f) -> None:
        """Select a file (or none): details, the Download button and its note."""
        self._file, self._facts, self._unusable = f, None, None
        self.token.hide()
        if f is None:
            self._set_details("Pick a file to see its header facts, whether it fits this machine "
                              "and whether it can draft for your main model.")
        self._update_download_button()

    def _show_facts(self) -> None:
        if self._facts is None or self._file is None:
            return
        here = self._listing is not None and text.file_state(self._listing, self._file) == "downloaded"
        body = text.facts_html(self._facts, self._file.size_bytes, self._main, self._main_name, here)
        item = self._file_item(self._file.filename)
        if self._facts.same_as and item is not None and not item.text(2):
            item.setText(2, "built-in")
        self._update_download_button()
        note = text.split_note(self._file)
        if note:
            body += f"<br><span style='color:{text.BAD}'>{html.escape(note)}</span>"
        self._set_details(f"<b>{html.escape(text.file_label(self._file))}</b><br>{body}")

    def _update_download_button(self) -> None:
        f, listing = self._file, self._listing
        state = text.file_state(listing, f) if f is not None and listing is not None else ""
        label, note = "Download", ""
        twin = self._facts.same_as if self._facts is not None else None
        usable = True
        if state == "downloaded":  # the library lists the Hugging Face cache: nothing to add
            label, usable = "Downloaded", False
            note = "" if self._strip_shows(f) else "in the library (the Hugging Face cache)"
        elif twin:  # a second copy would be the same model under a second name
            label, usable = "Already here", False
            note = f"the built-in {twin} is this model: no need to download it"
        elif state.startswith("partial"):
            label, note = "Resume download", f"{state.removeprefix('partial ')} kept from an earlier try"
        elif f is not None:
            note = f"{format_bytes(f.size_bytes)} into the Hugging Face cache"
        if self._unusable:
            note = "not a usable GGUF model: nothing to download"
        elif self.strip.is_busy():
            note = "a download is running (one at a time)"
        self.download_button.setText(label)
        self.download_button.setEnabled(f is not None and f.complete and usable and not self._unusable
                                        and not self.strip.is_busy())
        self.download_note.setText(note)

    def _strip_shows(self, f) -> bool:
        """Whether the download strip already says this file was downloaded and verified."""
        return self.strip.state == DONE and self._download == (f.repo_id, f.filename)

    def _refresh_states(self) -> None:
        """After a download ends, re-read from disk what the shown repository has here."""
        if self._listing is not None and self._download is not None and self._listing.repo_id == self._download[0]:
            self.calls.submit(STATES, local_copies, self._listing)

    def _apply_states(self, listing: RepoFiles) -> None:
        if self._listing is None or self._listing.repo_id != listing.repo_id:
            return
        self._listing = listing
        for f in listing.files:
            item = self._file_item(f.filename)
            if item is not None:
                item.setText(2, text.file_state(listing, f))
        self._update_download_button()
        self._show_facts()  # "to download" becomes "downloaded"

    def _file_item(self, filename: str) -> QTreeWidgetItem | None:
        for group in range(self.files.topLevelItemCount()):
            parent = self.files.topLevelItem(group)
            for row in range(parent.childCount()):
                if parent.child(row).data(0, KEY_ROLE) == filename:
                    return parent.child(row)
        return None

    # --- downloads ------------------------------------------------------------------------------

    def _start_download(self, repo_id: str, filename: str) -> None:
        listing = self._listing
        resuming = bool(listing and listing.repo_id == repo_id and filename in listing.partial)
        self._download = (repo_id, filename)
        self.strip.started(f"{repo_id}/{filename}", resuming)
        self.calls.start_download(repo_id, filename)
        self._update_download_button()

    def _resume(self) -> None:
        if self._download is not None and not self.strip.is_busy():
            self._start_download(*self._download)

    def _download_finished(self, path: str) -> None:
        repo_id, filename = self._download or ("", "")
        self.strip.done(path)
        self._refresh_states()
        self._update_download_button()
        self.statusMessage.emit(f"downloaded {repo_id}/{filename} (SHA-256 verified)")
        self.downloaded.emit(path)

    def _download_failed(self, failure: HubFailure) -> None:
        self._refresh_states()
        if failure.kind in (CANCELLED, INTERRUPTED):
            self.strip.stopped(failure.message)  # says how much was kept
        else:
            self.strip.failed(failure.message)
            if failure.kind == GATED:
                self._retry = self._resume
                self.token.ask(TOKEN_PROMPT)
        self._update_download_button()
        self.statusMessage.emit(failure.message)

    # --- tokens ---------------------------------------------------------------------------------

    def _save_token(self, token: str) -> None:
        self.calls.submit(TOKEN, save_hub_token, token)

    def _token_saved(self, checked: bool) -> None:
        self.token.field.clear()
        self.token.hide()
        self._set_status("Token saved (checked with the hub)." if checked else
                         "Token saved without a check: the hub could not be reached.")
        retry, self._retry = self._retry, None
        if retry is not None:
            retry()

    # --- results from the workers ---------------------------------------------------------------

    def _on_finished(self, channel: str, _request: int, result: object) -> None:
        if channel == SEARCH:
            self._show_repos(result)
        elif channel == FILES:
            self._show_listing(result)
        elif channel == HEADER:
            self._facts, self._machine = result, result.machine
            if self._header_main is not self._main:  # the main model changed while reading
                self.set_main_model(self._main, self._main_name)
            self._show_facts()
        elif channel == COMPAT and self._facts is not None:
            self._facts = dataclasses.replace(self._facts, compat=result)
            self._show_facts()
        elif channel == STATES:
            self._apply_states(result)
        elif channel == TOKEN:
            self._token_saved(bool(result))
        elif channel == DOWNLOAD:
            self._download_finished(result)

    def _on_failed(self, channel: str, _request: int, failure: HubFailure) -> None:
        if channel == SEARCH:
            self._set_status(failure.message, error=True)
            self.statusMessage.emit(failure.message)
        elif channel == FILES:
            self.files.clear()
            self._placeholder(self.files, failure.message)
            self._set_status(failure.message, error=True)
        elif channel in (HEADER, COMPAT):
            self._set_details(f"<b>{html.escape(text.file_label(self._file))}</b><br>"
                              f"<span style='color:{text.BAD}'>{html.escape(failure.message)}</span>"
                              if self._file is not None else html.escape(failure.message))
            if failure.kind == NOT_GGUF and channel == HEADER:
                self._unusable = failure.message
                self._update_download_button()
            if failure.kind == GATED and channel == HEADER:
                self._retry = self._read_header_again
                self.token.ask(TOKEN_PROMPT)
        elif channel == TOKEN:
            self.token.ask(failure.message, error=True)
        elif channel == DOWNLOAD:
            self._download_failed(failure)

    def _read_header_again(self) -> None:
        if self._file is not None:
            self._read_header()

    # --- small helpers --------------------------------------------------------------------------

    def _set_details(self, rich_text: str) -> None:
        self.details.setText(rich_text)
        self._fit_details()

    def _fit_details(self) -> None:
        width = max(self.details_box.viewport().width(), 100)
        wanted = self.details.heightForWidth(width)
        line = self.fontMetrics().lineSpacing()
        cap = max(3 * line, self.height() // 3)
        self.details_box.setFixedHeight(min(max(wanted, 2 * line), cap) + 2)

    def _set_status(self, message: str, error: bool = False) -> None:
        self.status.setText(f"<span style='color:{text.BAD}'>{html.escape(message)}</span>" if error
                            else html.escape(message))
        self.status.setToolTip(message)

    @staticmethod
    def _placeholder(tree: QTreeWidget, message: str) -> None:
        item = QTreeWidgetItem([message])
        item.setFlags(Qt.ItemFlag.NoItemFlags)
        tree.addTopLevelItem(item)
        item.setFirstColumnSpanned(True)
