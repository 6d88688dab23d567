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

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QFont, QResizeEvent, QShowEvent
from PySide6.QtWidgets import (
    QComboBox,
    QHBoxLayout,
    QHeaderView,
    QLineEdit,
    QPushButton,
    QSplitter,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.engine.gguf.info import GGUFInfo
from app.hub.names import model_title
from app.ui.discover import text
from app.ui.discover.file_pane import FilePane, ListsAndFile
from app.ui.discover.judge import MainCandidate, candidate_for
from app.ui.discover.tasks import DraftSearch, drafts_for, price_for
from app.ui.discover.widgets import DONE, STOPPED
from app.ui.common.elide import ModelNameDelegate
from app.ui.common.format import format_bytes
from app.ui.common.style import small_muted_label
from app.worker.hub_tasks import (CANCELLED, DOWNLOAD, GATED, INTERRUPTED, NOT_GGUF, FileFacts, HubCalls, HubFailure,
                                  RepoFiles, check_draft, list_repo_files, local_copies, read_file_facts, save_hub_token,
                                  search_repos)

log = logging.getLogger(__name__)

SEARCH, FILES, STATES, HEADER, COMPAT, TOKEN = "search", "files", "states", "header", "compat", "token"
PRICE, DRAFTS = "price", "drafts"
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
        self._main_path: str | None = None  # the judged main model's file here (its measured steps)
        self._price = None  # app.hub.draft_price.DraftPrice of the shown file as a draft, if known
        self._pricing = False  # a price is being read
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
        self.query.setToolTip("Search Hugging Face for GGUF models: each word must be in the repository's name, "
                              "e.g. qwen coder or Llama-3.2; empty lists the most popular")
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
        # Repository ids shortened so that two never read the same (issue 60 item 8: cut in the
        # middle, two sizes of one model both read "FAKEORG/qwen2.5-...ruct-q4_k_m-GGUF").
        self.repos.setItemDelegateForColumn(0, ModelNameDelegate(self.repos, self._repo_names))
        self.repos.currentItemChanged.connect(self._on_repo_changed)
        self.files = _tree(["File", "Size", "Here"])
        self.files.currentItemChanged.connect(self._on_file_changed)
        self.lists = QSplitter(Qt.Orientation.Vertical)
        self.lists.setChildrenCollapsible(False)
        self.lists.addWidget(self.repos)
        self.lists.addWidget(self.files)

        search_row = QHBoxLayout()
        search_row.addWidget(self.query, 1)
        search_row.addWidget(self.sort)
        search_row.addWidget(self.search_button)
        self._build_file_pane()
        # The lists above, the selected file below (file_pane.ListsAndFile): the lists give up
        # height first, so that the file's facts, Download and the progress stay in sight.
        self.split = ListsAndFile(self.lists, (self.repos, self.files), self.file_pane)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addLayout(search_row)
        layout.addWidget(self.status)
        layout.addWidget(self.split, 1)
        self._show_file(None)

    def _build_file_pane(self) -> None:
        """The selected file's pane (file_pane.FilePane), its parts named here as the panel uses them."""
        pane = self.file_pane = FilePane()
        self.chooser, self.details, self.details_box = pane.chooser, pane.details, pane.details_box
        self.download_button, self.draft_button, self.download_note = (pane.download_button, pane.draft_button,
                                                                       pane.download_note)
        self.token, self.strip = pane.token, pane.strip
        self.chooser.changed.connect(self._on_judged_main_changed)
        self.chooser.findRequested.connect(self.find_drafts)
        self.download_button.clicked.connect(self.download_selected)
        self.draft_button.clicked.connect(self._find_drafts_for_file)
        self.token.tokenEntered.connect(self._save_token)
        self.strip.cancelRequested.connect(self.cancel_download)
        self.strip.resumeRequested.connect(self._resume)
        self.calls.downloadProgress.connect(self.strip.progress)

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        wide = event.size().width() >= SIDE_BY_SIDE_WIDTH
        orientation = Qt.Orientation.Horizontal if wide else Qt.Orientation.Vertical
        if self.lists.orientation() != orientation:
            self.lists.setOrientation(orientation)
        self.split.fit()

    def showEvent(self, event: QShowEvent) -> None:
        super().showEvent(event)
        self.split.fit()

    # --- public API ---------------------------------------------------------------------------

    def set_main_model(self, info: GGUFInfo | None, title: str | None = None) -> None:
        """The chat's chosen main model: its header, and its name as the library shows it (never
        the file's internal general.name). Drafts are judged against it from now on; the user may
        pick another in the chooser."""
        self.chooser.set_chat_main(candidate_for(info, title) if info is not None else None)

    def set_library(self, entries: list) -> None:
        """The library's models (app.hub.library_entries.LibraryEntry): the main models a draft can
        be judged against, the largest by default where the chat has none."""
        self.chooser.set_library([candidate_for(e.info, e.title, e.path) for e in entries if e.usable and e.path])

    def find_drafts(self) -> None:
        """Search the hub for models that can draft for the judged main model: they replace the
        repository list (models in the library already are named in the status line)."""
        main = self.chooser.current()
        if main is None:
            return
        self._set_status(f"Looking for drafts for {main.title}: searching the hub for its family and reading "
                         f"the headers of its smaller models…")
        self.calls.forget(SEARCH)
        self.repos.clear()
        self._repos = {}
        self._clear_files()
        self.calls.submit(DRAFTS, drafts_for, main.key, main.info, main.repo_id)

    def shutdown(self, timeout_ms: int = 3000) -> None:
        """Cancel the download (its partial is kept) and wait for the hub calls to end."""
        self.calls.shutdown(timeout_ms)

    def search(self) -> None:
        query = self.query.text().strip()
        self._set_status(f"Searching for “{query}”…" if query else "Listing the most popular GGUF models…")
        self.calls.forget(DRAFTS)
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

    def _fill_repos(self, repos: list, notes: dict[str, str] | None = None) -> None:
        """Rows for RepoResults; `notes`: a line per repository id for its tooltip."""
        self._repos = {r.repo_id: r for r in repos}
        for repo in repos:
            item = QTreeWidgetItem(text.repo_row(repo))
            item.setData(0, KEY_ROLE, repo.repo_id)
            note = (notes or {}).get(repo.repo_id)
            tip = text.repo_tooltip(repo) + (f"\n{note}" if note else "")
            for column in range(4):
                item.setToolTip(column, tip)
            for column in (1, 2):
                item.setTextAlignment(column, Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
            self.repos.addTopLevelItem(item)

    def _show_repos(self, repos: list) -> None:
        self._fill_repos(repos)
        query = self.query.text().strip()
        if repos:
            self._set_status(f"{len(repos)} repositor{'ies' if len(repos) != 1 else 'y'}"
                             f"{f' for “{query}”' if query else ''}: pick one to see its GGUF files")
        else:
            self._set_status(f"No GGUF repository has all of “{query}” in its name." if query
                             else "No GGUF repositories found.")

    def _show_drafts(self, found: DraftSearch) -> None:
        main = self.chooser.current()
        title = main.title if main is not None and main.key == found.main_key else found.main_key
        self._fill_repos([s.repo for s in found.hub if s.repo is not None],
                         {s.repo_id: f"can draft for {title}: {text.suggestion_line(s)}" for s in found.hub if s.repo_id})
        self._set_status(text.drafts_status(title, found.query, found.hub, found.local))

    def _repo_names(self) -> list[str]:
        return [self.repos.topLevelItem(i).text(0) for i in range(self.repos.topLevelItemCount())]

    def _on_repo_changed(self, item: QTreeWidgetItem | None, _previous=None) -> None:
        self._clear_files()
        if item is None:
            return
        repo_id = item.data(0, KEY_ROLE)
        self._placeholder(self.files, f"Listing the files of {repo_id}…")
        self.calls.submit(FILES, list_repo_files, repo_id)

    # --- files ----------------------------------------------------------------------------------

    def _clear_files(self) -> None:
        for channel in (FILES, STATES, HEADER, COMPAT, PRICE):
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
        self._forget_price()
        self.calls.submit(HEADER, read_file_facts, f.repo_id, f.filename, self._main, self._machine)

    # --- the judged main model and the price of a draft -------------------------------------

    def _on_judged_main_changed(self) -> None:
        """Another main model to judge drafts against: the shown file is checked against it."""
        main = self.chooser.current()
        self._main = main.info if main is not None else None
        self._main_path = main.path if main is not None else None
        if self._facts is None:
            return
        self._forget_price()
        if main is None:
            self.calls.forget(COMPAT)
            self._facts = dataclasses.replace(self._facts, compat=None)
            self._show_facts()
        else:
            self._pricing = True
            self.calls.submit(COMPAT, check_draft, main.info, self._facts.info)

    def _price_facts(self) -> None:
        """Ask what this machine's measured steps predict for the shown file as a draft."""
        facts = self._facts
        if facts is None or self._main is None or facts.compat is None or not facts.compat.compatible:
            self._forget_price()
            return
        here = self._listing.local.get(facts.filename) if self._listing is not None else None
        self._pricing = True
        self.calls.submit(PRICE, price_for, self._main, self._main_path, facts.info, here)

    def _forget_price(self) -> None:
        self.calls.forget(PRICE)
        self._price, self._pricing = None, False

    def _find_drafts_for_file(self) -> None:
        """"Find a draft for it" on a file's page: judge drafts against this file from now on,
        and look for them on the hub."""
        f, facts = self._file, self._facts
        if f is None or facts is None:
            return
        here = self._listing.local.get(f.filename) if self._listing is not None else None
        twin = self.chooser.library_model(facts.same_as) if facts.same_as and not here else None
        if twin is not None:  # a built-in model is this one: judge against it (its steps were measured)
            self.chooser.select(twin.key)
        else:
            self.chooser.add_hub_model(MainCandidate(here or f"hub:{f.repo_id}/{f.filename}",
                                                     model_title(f.repo_id, f.filename, facts.info.file_type),
                                                     facts.info, here, f.repo_id))
        self.find_drafts()

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
        body = text.facts_html(self._facts, self._file.size_bytes, self._main, here, self._price, self._pricing)
        item = self._file_item(self._file.filename)
        if self._facts.same_as and item is not None and not item.text(2):
            item.setText(2, "built-in")
        self._update_download_button()
        note = text.split_note(self._file)
        if note:
            body += f"<br><span style='color:{text.BAD}'>{html.escape(note)}</span>"
        self._set_details(body)  # the file is named by its highlighted row above

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
            note = "no need to download it"  # the facts say which built-in model it is
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
        self.draft_button.setEnabled(self._facts is not None and not self._unusable)
        self.split.fit()  # the progress strip or the token prompt may have come or gone

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
        resuming = (listing is not None and listing.repo_id == repo_id and filename in listing.partial
                    # stopped a moment ago: the listing may not be re-read yet
                    or self._download == (repo_id, filename) and self.strip.state == STOPPED)
        self._download = (repo_id, filename)
        self.strip.started(f"{repo_id}/{filename}", resuming)
        # Replaces the status bar's "cancelled ... download it again to resume", which still
        # showed while the resumed download ran.
        self.statusMessage.emit(f"resuming {repo_id}/{filename} where it stopped" if resuming
                                else f"downloading {repo_id}/{filename}")
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
                self._on_judged_main_changed()
            else:
                self._price_facts()
            self._show_facts()
        elif channel == COMPAT and self._facts is not None:
            self._facts = dataclasses.replace(self._facts, compat=result)
            self._price_facts()
            self._show_facts()
        elif channel == PRICE:
            self._price, self._pricing = result, False
            self._show_facts()
        elif channel == DRAFTS:
            self._show_drafts(result)
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
        elif channel == PRICE:  # the verdict stands on the sizes alone
            log.info("draft price not read: %s", failure.message)
            self._price, self._pricing = None, False
            self._show_facts()
        elif channel == DRAFTS:
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
        self.split.fit()

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
