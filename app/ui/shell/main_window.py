"""The main window: chats on the left, the conversation in the middle, models and charts on the right.

It wires the parts together and owns the lifetimes: the model host's thread, the history store
and the settings. Closing it during a reply stops the reply, waits for the host to say so (the
reply's last text and stats are saved), and only then closes the history.
"""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QByteArray, QCoreApplication, QEvent, QObject, QSize, Qt, QTimer
from PySide6.QtGui import QAction, QCloseEvent, QKeySequence, QShortcut, QShowEvent
from PySide6.QtWidgets import (
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QMainWindow,
    QPushButton,
    QSplitter,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from app.compare.fastest import Fastest
from app.compare.results import ENGINE_KINDS
from app.ui.chat.history import HistoryStore
from app.ui.chat.charts import LiveCharts
from app.ui.chat.why import WhyPanel
from app.ui.chat.chat_list import ChatList
from app.ui.chat.controller import ChatController
from app.ui.chat.panel import ChatPanel
from app.ui.compare.choice import applied_text
from app.ui.discover.panel import DiscoverPanel
from app.ui.models.gen_form import WINDOW_DEFAULTS, GenSettingsForm
from app.ui.models.library_panel import LibraryPanel
from app.ui.models.pair_picker import PairPicker
from app.ui.models.serve_panel import ServePanel
from app.ui.chat.empty_state import EmptyStateController
from app.ui.common.elide import fit_text
from app.ui.common.paths import history_path, open_settings
from app.ui.common.style import scrolling
from app.ui.shell.pair_offer import PairOffer
from app.ui.common.popup_fit import fit_popups
from app.ui.common.screen_fit import place_new, refit_shown, restore_within
from app.ui.shell.wheel_guard import guard_wheel
from app.worker.host import HostThread
from app.worker.requests import AT_URL, DRAFTER_TEXT, NONE, GenSettings, PairChoice
from app.worker.serving import ServerControl
from app.worker.tasks import wait_for_tasks

if TYPE_CHECKING:
    from app.engine.session import Facts

log = logging.getLogger(__name__)

STOP_TIMEOUT_S = 20.0  # closing waits this long for a load or a reply to stop
PAIR_LABEL_MAX_PX = 420  # the status bar's "what runs" label; messages get the rest
MIN_PAIR_LABEL_PX = 120  # narrower than this, the label hides while a message shows
DEFAULT_SIZE = QSize(1440, 900)  # a new window's size where the screen has room (less where not)
CHAT_LIST_MIN_PX = 170  # the chat list keeps room for a title and its time ("W..." was unreadable)
REFIT_DELAY_MS = 500  # the window manager's frame is known a moment after the window shows


class MainWindow(QMainWindow):
    def __init__(self) -> None:
        super().__init__()
        self.setWindowTitle("Specula")
        self.settings = open_settings()
        self.store = HistoryStore(history_path())
        self.host_thread = HostThread()
        self.host = self.host_thread.host
        self.loaded_facts: Facts | None = None  # app.engine.session.Facts of the open session
        self.thread_stuck = False
        self._loading_spec: PairChoice | None = None
        self._restored_pair = False
        self._pending_choice: Fastest | None = None  # a comparison's fastest, waiting for the library
        self._closed = False
        self._given_size: QSize | None = None  # the size fitted to the screen, until the user resizes

        self._build()
        self._connect()
        self._restore()
        if self.store.notice:  # a history moved aside or rows that could not be read
            self.show_message(self.store.notice)
        self.host.probe_devices()
        self.library.rescan()
        self.panel.input.setFocus()
        guard_wheel(self)  # the wheel scrolls the panels, never a setting it passes over
        fit_popups(self)  # a combo box's list never runs past the window's edge

    # --- construction -------------------------------------------------------------------------

    def _build(self) -> None:
        self.chat_list = ChatList(self.store, self)
        self.chat_list.setMinimumWidth(CHAT_LIST_MIN_PX)
        # Titles are elided to the width: a horizontal scroll bar would only waste a row.
        self.chat_list.list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.panel = ChatPanel()
        self.charts = LiveCharts()
        self.picker = PairPicker()
        self.gen_form = GenSettingsForm()
        self.library = LibraryPanel(self.settings)
        self.controller = ChatController(
            self.store, self.host, self.panel, self.charts, self.settings,
            self.gen_form.settings, self.loaded_main_path,
        )

        model_page = QWidget()
        model_layout = QVBoxLayout(model_page)
        model_layout.addWidget(self.picker)
        model_layout.addWidget(self.gen_form)
        self.serve_panel = ServePanel()
        self.serve_panel.remember_in(self.settings)  # left on, it serves the next model loaded
        self.server = ServerControl(self)
        model_layout.addWidget(self.serve_panel)
        model_layout.addStretch(1)
        self.models_tabs = QTabWidget()
        # The right column's panels scroll (Discover within itself): text it gains (a download's result, a long
        # error) never raises the window's minimum height past the screen (issue 52 item 1).
        self.models_tabs.addTab(_with_footer(scrolling(model_page), self._load_row()), "Model")
        self.models_tabs.addTab(self.library, "Library")
        self.discover = DiscoverPanel()
        self.add_models_tab(self.discover, "Discover")

        self.save_chart_button = QPushButton("Save chart…")
        self.save_chart_button.setToolTip("Save the three charts as one PNG image")
        self.save_chart_button.clicked.connect(self.save_chart)
        charts_box = QWidget()
        charts_layout = QVBoxLayout(charts_box)
        charts_layout.setContentsMargins(4, 0, 4, 0)
        header = QHBoxLayout()
        header.addWidget(QLabel("<b>Live charts</b> of the current reply"))
        header.addStretch(1)
        header.addWidget(self.save_chart_button)
        charts_layout.addLayout(header)
        # First in sight: whether the draft pays here is the question the charts below answer.
        self.why = WhyPanel()
        charts_layout.addWidget(self.why)
        charts_layout.addWidget(self.charts, 1)

        self.right_splitter = QSplitter(Qt.Orientation.Vertical)
        self.right_splitter.addWidget(self.models_tabs)
        self.right_splitter.addWidget(scrolling(charts_box))
        # One height for every tab (no jump when switching): the Model tab's settings scroll above
        # its Load row, which stays in sight; the charts keep the rest.
        self.right_splitter.setSizes([540, 360])
        self.main_splitter = QSplitter(Qt.Orientation.Horizontal)
        self.main_splitter.addWidget(self.chat_list)
        self.main_splitter.addWidget(self.panel)
        self.main_splitter.addWidget(self.right_splitter)
        self.main_splitter.setStretchFactor(1, 1)
        self.main_splitter.setSizes([230, 700, 470])
        self.setCentralWidget(self.main_splitter)

        self.pair_label = QLabel("no model loaded")
        self._pair_text, self._pair_name = "no model loaded", None
        self.statusBar().addPermanentWidget(self.pair_label)
        # A message takes the room it needs, the "what runs" label beside it what is left.
        self.statusBar().messageChanged.connect(lambda _text: self._fit_status_bar())
        self.statusBar().installEventFilter(self)
        self._build_menus()

    def _build_menus(self) -> None:
        file_menu = self.menuBar().addMenu("&File")
        self.new_chat_action = _action(self, "&New chat", QKeySequence.StandardKey.New, self.controller.new_chat)
        file_menu.addAction(self.new_chat_action)
        file_menu.addAction(_action(self, "Add GGUF &file…", None, self.library.choose_files))
        file_menu.addAction(_action(self, "Add &folder…", None, self.library.choose_folder))
        file_menu.addAction(_action(self, "&Save chart…", None, self.save_chart))
        file_menu.addSeparator()
        file_menu.addAction(_action(self, "&Quit", QKeySequence.StandardKey.Quit, self.close))
        view_menu = self.menuBar().addMenu("&View")
        mark = QAction("&Mark accepted draft tokens", self, checkable=True, checked=True)
        mark.toggled.connect(self.panel.mark_toggle.setChecked)
        self.panel.mark_toggle.toggled.connect(mark.setChecked)
        view_menu.addAction(mark)
        view_menu.addAction(_action(self, "&Compare drafts…", "Ctrl+Shift+D", self.open_compare))
        escape = QShortcut(QKeySequence(Qt.Key.Key_Escape), self)
        escape.activated.connect(self.on_escape)

    def _load_row(self) -> QWidget:
        """The picker's Load, Cancel, progress and state line, pinned under the Model tab's
        scrolling settings so that Load is always in sight (1440x900 left it below the fold)."""
        row = QWidget()
        layout = QVBoxLayout(row)
        layout.setContentsMargins(8, 4, 8, 4)
        buttons = QHBoxLayout()
        for widget in (self.picker.load_button, self.picker.cancel_button):
            buttons.addWidget(widget)
        buttons.addWidget(self.picker.progress, 1)
        layout.addWidget(self.picker.pending_label)
        layout.addLayout(buttons)
        # A long load error scrolls in four lines: the pinned row never outgrows the screen.
        state = scrolling(self.picker.state_label)
        state.setMaximumHeight(4 * self.picker.state_label.fontMetrics().lineSpacing() + 6)
        layout.addWidget(state)
        return row

    def add_models_tab(self, widget: QWidget, title: str) -> None:
        """Where the Discover panel (hub search and downloads) goes."""
        self.models_tabs.addTab(widget, title)

    def _connect(self) -> None:
        self.library.entriesChanged.connect(self._on_library)
        self.library.entriesChanged.connect(self.discover.set_library)  # the main models Discover judges drafts for
        self.library.mainChosen.connect(self._on_main_chosen)
        self.library.message.connect(self.show_message)
        self.discover.statusMessage.connect(self.show_message)
        self.discover.downloaded.connect(self._on_downloaded)
        self.models_tabs.currentChanged.connect(self._on_models_tab)
        self.serve_panel.startRequested.connect(self._start_server)
        self.serve_panel.stopRequested.connect(self.server.stop)
        self.server.started.connect(self.serve_panel.set_running)
        self.server.stopped.connect(self.serve_panel.set_stopped)
        self.server.failed.connect(self.serve_panel.set_failed)
        self.server.failed.connect(self.show_message)
        self.host.devicesFound.connect(self.picker.set_devices)
        self.host.loadProgress.connect(self.picker.set_progress)
        self.host.loaded.connect(self._on_loaded)
        self.host.loadFailed.connect(self._on_load_failed)
        self.picker.loadRequested.connect(self.load_pair)
        self.picker.cancelRequested.connect(self.cancel_load)
        self.controller.message.connect(self.show_message)
        self.controller.busyChanged.connect(self._on_busy)
        self.controller.replyFinished.connect(self._on_reply_finished)
        self.controller.replyFinished.connect(lambda summary, _error: self.why.show_summary(summary))
        self.controller.busyChanged.connect(lambda busy: busy and self.why.reset())
        self.host.steps.connect(self.why.add_steps)
        self.controller.chatOpened.connect(self._on_chat_opened)
        self.chat_list.chatSelected.connect(self._on_chat_selected)
        self.chat_list.newChatRequested.connect(self.controller.new_chat)
        self.chat_list.chatDeleted.connect(self.controller.chat_deleted)
        self.chat_list.errorOccurred.connect(self.show_message)
        self.pair_offer = PairOffer(self)  # the real main + draft pair, from the welcome card and the Library
        self.library.pairRequested.connect(self.pair_offer.toggle)
        self.pair_offer.busyChanged.connect(self.library.set_pair_busy)
        self.pair_offer.status.connect(self.library.set_pair_status)
        self.library.set_pair_note(self.pair_offer.note())
        self.empty_state = EmptyStateController(self)  # first launch: what to do, in the chat area

    # --- models -------------------------------------------------------------------------------

    def loaded_main_path(self) -> str | None:
        return self.loaded_facts.main_path if self.loaded_facts else None

    def load_pair(self, spec: PairChoice) -> None:
        if self.controller.busy:
            self.show_message("a reply is being generated: stop it (Esc) before loading")
            return
        self._loading_spec = spec
        self.loaded_facts = None
        if self.server.running:  # it serves the pair being replaced
            self.server.stop()
            self.show_message("the API server stopped with the model it served; it serves the new one once loaded")
        self.serve_panel.set_available(False, "loading")
        self._set_pair_label("loading…")
        self.picker.set_loading(True)
        self.panel.set_model_loaded(False)
        self.host.load(spec)

    def _set_pair_label(self, text: str, name: str | None = None) -> None:
        """The status bar's "what runs" line, whole in the tooltip; `name`, the main model's in
        it, is shortened first where the bar is short of room."""
        self._pair_text, self._pair_name = text, name
        self.pair_label.setToolTip(text)
        self._fit_status_bar()

    def _fit_status_bar(self) -> None:
        """The message shown gets the width it needs (one longer than the whole bar is whole in
        the bar's tooltip); the "what runs" label, at most PAIR_LABEL_MAX_PX, gets the rest, and
        hides while too little is left to read it."""
        bar = self.statusBar()
        metrics = self.pair_label.fontMetrics()
        message = bar.currentMessage()
        room = bar.width() - 24  # the size grip and the bar's margins
        needed = metrics.horizontalAdvance(message) + 16 if message else 0
        width = min(PAIR_LABEL_MAX_PX, room - needed)
        text = fit_text(self._pair_text, metrics, width - 8, self._pair_name)
        shown = width >= MIN_PAIR_LABEL_PX
        self.pair_label.setVisible(shown)
        if shown:
            self.pair_label.setText(text)
            self.pair_label.setFixedWidth(min(width, metrics.horizontalAdvance(text) + 8))

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:  # noqa: N802 (Qt's name)
        if watched is self.statusBar() and event.type() == QEvent.Type.Resize:
            self._fit_status_bar()
        return super().eventFilter(watched, event)

    def _start_server(self, port: int, api_key: str) -> None:
        self.server.start(self.host.current_session(), self.gen_form.settings(), port, api_key)

    def cancel_load(self) -> None:
        # A direct call: a signal connected to the host's method would be queued behind the
        # very load it is meant to stop (the host lives on its own thread).
        self.host.cancel()

    def _on_loaded(self, facts: Facts) -> None:
        spec, self._loading_spec = self._loading_spec, None
        swap_error = facts.swap_error  # only the drafter was to change, and it did not
        if swap_error:
            spec = self.picker.loaded_spec()
        # The library's titles, as the pickers show them (a file's general.name can be cryptic).
        facts = replace(facts, main_name=self._title(facts.main_path, facts.main_name),
                        draft_name=self._title(facts.draft_path, facts.draft_name))
        self.loaded_facts = facts
        self._judge_drafts_for_loaded()
        self.picker.set_loading(False)
        self.picker.set_loaded(facts, spec)
        self.charts.set_acceptance_note(None)
        if facts.engine_line:
            self._on_server_loaded(facts)
            return
        self.serve_panel.set_available(True)
        self.panel.set_model_loaded(True)
        self.panel.set_base_model(not facts.chat_template)  # base models: plain completion
        self.panel.input.setFocus()  # the next step is typing (not the spin box focus fell to)
        self.charts.set_reference_tps(self.controller.reference_tps(facts.main_path))
        drafter = DRAFTER_TEXT.get(facts.drafter, facts.draft_name)
        if facts.draft_text_level:
            drafter = f"{drafter} (text-level)"
        self._set_pair_label(f"{facts.main_name} · {drafter} · {facts.main_plan}", facts.main_name)
        if swap_error:
            self.show_message(f"the drafter did not change: {swap_error}; {facts.main_name} runs with {drafter}")
        elif facts.main_kept:
            change = "drafting off" if facts.drafter == NONE else f"now drafting with {drafter}"
            self.show_message(f"{change} ({facts.swap_s:.1f} s); {facts.main_name} stayed loaded")
        else:
            self.show_message(f"loaded {facts.main_name} in {facts.load_s:.1f} s")
        if spec is not None and not swap_error:
            self.settings.setValue("pair/last", json.dumps(spec.__dict__))

    def _on_server_loaded(self, facts: Facts) -> None:
        """llama-server started here, or the server at a URL answered: the chat replies on it."""
        self.serve_panel.set_available(True)  # it serves through the same engine (worker.serving)
        self.panel.set_model_loaded(True)
        self.panel.set_base_model(not facts.chat_template)
        self.panel.input.setFocus()
        self.charts.set_reference_tps(self.controller.reference_tps(facts.main_path))
        at_url = facts.where == AT_URL  # the line names the URL, which is its name
        self._set_pair_label(facts.engine_line if at_url else f"{facts.main_name} · {facts.engine_line}",
                             None if at_url else facts.main_name)
        how = "connected to" if at_url else "started"
        self.show_message(f"{how} {facts.engine_line} in {facts.load_s:.1f} s")
        spec = self.picker.loaded_spec()
        if spec is not None:
            self.settings.setValue("pair/last", json.dumps(spec.__dict__))

    def _on_reply_finished(self, summary: dict | None, error: str) -> None:
        """A server at a URL that counted no drafts, or counted them only for the whole reply
        (its /metrics): the acceptance charts say so, not zeros or empty axes."""
        facts = self.loaded_facts
        if facts is None or facts.where != AT_URL or summary is None:
            return
        drafted, accepted = summary.get("n_drafted"), summary.get("n_accepted")
        if drafted is None:
            self.charts.set_acceptance_note("this server reports no draft counts: tok/s only")
        elif not drafted:
            self.charts.set_acceptance_note("this server drafted nothing in this reply: tok/s only")
        elif not self.charts.acceptance_points() and accepted is not None:
            self.charts.set_acceptance_note(f"this server counts drafts for the whole reply only (its /metrics): "
                                            f"{accepted} of {drafted} accepted ({accepted / drafted:.0%})")

    def _title(self, path: str | None, fallback: str | None) -> str | None:
        entry = next((e for e in self.library.entries() if path and e.path == path), None)
        return entry.title if entry is not None else fallback

    def _on_load_failed(self, message: str) -> None:
        self._loading_spec = None
        self.loaded_facts = None
        self.serve_panel.set_available(False)
        self.picker.set_loading(False)
        self.picker.set_failed(message)
        self.picker.load_button.setFocus()
        self.panel.set_model_loaded(False)
        self._set_pair_label("no model loaded")
        self.show_message(message)

    def _on_library(self, entries: list) -> None:
        self.picker.set_entries(entries)
        if not self._restored_pair:
            self._restored_pair = True
            self._restore_pair()
        if self._pending_choice is not None:
            choice, self._pending_choice = self._pending_choice, None
            self._apply_choice(choice)

    def _on_downloaded(self, path: str) -> None:
        self.library.rescan()  # Discover downloads into the HF cache, which the library scans
        self.show_message(f"downloaded {Path(path).name}: it is in the library")

    def _on_models_tab(self, index: int) -> None:
        """The tabs share one height (the column does not jump when switching); the user's
        splitter position is the same for all of them."""

    def _judge_drafts_for_loaded(self) -> None:
        """Discover judges files as drafts for the main model the chat loaded (not for whatever
        the picker shows: in a fresh window that is the demo model nobody chose)."""
        path = self.loaded_facts.main_path if self.loaded_facts is not None else None
        main = next((e for e in self.library.entries() if e.usable and e.path == path), None)
        self.discover.set_main_model(main.info if main is not None else None, main.title if main is not None else None)

    def _on_main_chosen(self, path: str) -> None:
        self.picker.select_main(path)
        self.models_tabs.setCurrentIndex(0)

    # --- chats --------------------------------------------------------------------------------

    def _on_chat_selected(self, chat_id: int) -> None:
        if chat_id != self.controller.chat_id:
            self.controller.open_chat(chat_id)

    def _on_chat_opened(self, chat_id: int | None) -> None:
        self.chat_list.refresh(select_id=chat_id)

    def _on_busy(self, busy: bool) -> None:
        self.picker.set_replying(busy)
        if not busy:
            self.panel.input.setFocus()
        if not busy and self.controller.chat_id is not None:
            self.chat_list.refresh(select_id=self.controller.chat_id)

    def on_escape(self) -> None:
        """Esc stops a reply, else cancels a load, else leaves editing."""
        if self.controller.busy:
            self.controller.stop()
        elif self._loading_spec is not None:
            self.cancel_load()
        else:
            self.controller.cancel_edit()

    # --- misc ---------------------------------------------------------------------------------

    def show_message(self, text: str) -> None:
        self.statusBar().showMessage(text, 15000)
        self.statusBar().setToolTip(text)  # a message longer than the bar is still readable whole

    def open_compare(self) -> None:
        """View ▸ Compare drafts: a window of its own (grouped bars, curves and a table need room),
        fed by the library and starting from the main model chosen here."""
        from app.ui.compare.view import CompareWindow

        if getattr(self, "compare_window", None) is None:
            self.compare_window = CompareWindow(self.library.entries(), self)
            self.library.entriesChanged.connect(self.compare_window.set_entries)
            self.compare_window.useInChat.connect(self.use_compare_choice)
            guard_wheel(self.compare_window)
        self.compare_window.select_main(self.loaded_main_path() or self.picker.main_path())
        self.compare_window.show()
        self.compare_window.raise_()
        self.compare_window.activateWindow()

    def use_compare_choice(self, choice: Fastest) -> None:
        """The Compare view's "Use in chat": its fastest configuration into the pair picker and the
        draft settings. A file the library lacks (a hub draft the comparison downloaded) is added
        to it first, and the choice applied once it has been read."""
        known = {e.path for e in self.library.entries()}
        missing = [p for p in (choice.main_path, choice.draft_path) if p and p not in known]
        gone = [p for p in missing if not Path(p).is_file()]
        if gone:
            self.show_message(f"cannot use it in the chat: {gone[0]} is no longer there")
        elif missing:
            self._pending_choice = choice
            self.library.add_files(missing)
            self.show_message(f"adding {', '.join(Path(p).name for p in missing)} to the library…")
        else:
            self._apply_choice(choice)

    def _apply_choice(self, choice: Fastest) -> None:
        problem = self.picker.apply(choice.main_path, choice.drafter, choice.draft_path, choice.server_types,
                                    choice.server_url)
        if problem is not None:
            self.show_message(f"cannot use the comparison's fastest in the chat: {problem}")
            return
        if choice.pays_off and choice.drafter not in ENGINE_KINDS:  # another engine: its own lengths
            self.gen_form.set_settings(replace(
                self.gen_form.settings(), draft_max=choice.draft_max, draft_min=choice.draft_min,
                draft_p_min=choice.draft_p_min, adaptive_draft=choice.adaptive))
        self.models_tabs.setCurrentIndex(0)  # the Model tab: the picker beside the chat
        self.raise_()
        self.activateWindow()
        text = applied_text(choice, self._title(choice.main_path, None) or Path(choice.main_path).stem,
                            self._title(choice.draft_path, None))
        # The picker's action for this change: Apply where only the drafter changes.
        action = (f"press {self.picker.load_button.text()}" if self.picker.pending_change()
                  or self.picker.loaded_spec() is None else "it is what runs now")
        self.show_message(text.replace("press Load", action))

    def save_chart(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Save chart", "specula-chart.png", "PNG images (*.png)")
        if path:
            try:
                self.charts.save_png(path)
                self.show_message(f"chart saved to {path}")
            except Exception as exc:  # a one-line message, never a crash
                self.show_message(str(exc))

    # --- settings -----------------------------------------------------------------------------

    def _restore(self) -> None:
        geometry = self.settings.value("window/geometry")
        # Within the screen it opens on: a geometry saved on a larger screen is clipped to this one.
        if isinstance(geometry, QByteArray):
            self._given_size = restore_within(self, geometry)
        if self._given_size is None and not (self.isMaximized() or self.isFullScreen()):
            self._given_size = place_new(self, DEFAULT_SIZE)
        for key, splitter in (("window/main_splitter", self.main_splitter), ("window/right_splitter", self.right_splitter)):
            state = self.settings.value(key)
            if isinstance(state, QByteArray):
                splitter.restoreState(state)
        self.gen_form.set_settings(GenSettings.from_dict(_json(self.settings.value("gen/settings")), WINDOW_DEFAULTS))
        self.panel.mark_toggle.setChecked(str(self.settings.value("view/mark_drafts", "true")).lower() == "true")
        last_chat = self.settings.value("chat/last")
        self.controller.open_chat(int(last_chat) if str(last_chat or "").isdigit() else None)

    def _restore_pair(self) -> None:
        last = _json(self.settings.value("pair/last"))
        if not last:
            return
        engine = self.picker.engine
        engine.set_runs_on(str(last.get("runs_on", "here")))
        engine.set_spec_type(str(last.get("spec_type") or "ngram-mod"))
        engine.url.setText(str(last.get("server_url") or ""))
        engine.rpc.setText(str(last.get("rpc") or ""))
        if self.picker.select_main(str(last.get("main_path", ""))):
            self.picker.select_draft(str(last.get("drafter", "lookup")), last.get("draft_path"))
            self.picker.main_offload.set_gpu_layers(last.get("main_gpu_layers"))
            self.picker.draft_offload.set_gpu_layers(last.get("draft_gpu_layers"))
            self.picker.set_backend(str(last.get("backend", "auto")))

    def save_settings(self) -> None:
        self.settings.setValue("window/geometry", self.saveGeometry())
        self.settings.setValue("window/main_splitter", self.main_splitter.saveState())
        self.settings.setValue("window/right_splitter", self.right_splitter.saveState())
        self.settings.setValue("gen/settings", json.dumps(self.gen_form.settings().to_dict()))
        self.settings.setValue("view/mark_drafts", self.panel.mark_toggle.isChecked())
        if self.controller.chat_id is not None:
            self.settings.setValue("chat/last", self.controller.chat_id)
        self.settings.sync()

    # --- showing and closing ------------------------------------------------------------------

    def showEvent(self, event: QShowEvent) -> None:  # noqa: N802 (Qt's name)
        super().showEvent(event)
        if not event.spontaneous():  # shown by the program, not restored from minimized
            QTimer.singleShot(REFIT_DELAY_MS, self, lambda: refit_shown(self, self._given_size))

    def closeEvent(self, event: QCloseEvent) -> None:  # noqa: N802 (Qt's name)
        if not self._closed:
            self.shutdown()
        event.accept()

    def shutdown(self) -> None:
        """Stop the reply or load, keep everything received, and release the history."""
        self._closed = True
        self.panel.flush_system_prompt()
        self.save_settings()
        self.discover.shutdown()  # a download in flight keeps its partial for next time
        self.pair_offer.shutdown()
        self.server.stop_now()
        stopped = self.host_thread.stop(STOP_TIMEOUT_S)
        # The reply's last steps and its end are queued for this thread: deliver them, so the
        # controller saves the final text and stats before the history closes.
        QCoreApplication.processEvents()
        if self.controller.busy:
            self.controller.finish_now()
        self.thread_stuck = not stopped
        wait_for_tasks(3000)
        self.store.close()


def _with_footer(body: QWidget, footer: QWidget) -> QWidget:
    page = QWidget()
    layout = QVBoxLayout(page)
    layout.setContentsMargins(0, 0, 0, 0)
    layout.setSpacing(0)
    layout.addWidget(body, 1)
    layout.addWidget(footer)
    return page


def _action(parent: QWidget, text: str, shortcut, slot) -> QAction:
    action = QAction(text, parent)
    if shortcut is not None:
        action.setShortcut(QKeySequence(shortcut))
    action.triggered.connect(slot)
    return action


def _json(value: Any) -> dict:
    if not value:
        return {}
    try:
        data = json.loads(str(value))
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}
