"""The chat area: system prompt, the conversation, the draft-marking toggle and the message box.

Only widgets and keyboard handling live here; what Send, Stop, Regenerate and edit links do is
the ChatController's business.
"""

from __future__ import annotations

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QKeyEvent
from PySide6.QtWidgets import (
    QApplication,
    QCheckBox,
    QFrame,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QStackedWidget,
    QVBoxLayout,
    QWidget,
)

from app.ui.chat.conversation import ConversationView
from app.ui.chat.empty_state import EmptyState
from app.ui.common.elide import ElidedButton
from app.ui.common.style import scrolling


class MessageBox(QPlainTextEdit):
    """The message input: Enter (or Ctrl+Enter) sends, Shift+Enter is a new line, as in every
    chat app people know."""

    submitted = Signal()

    def keyPressEvent(self, event: QKeyEvent) -> None:  # noqa: N802 (Qt's name)
        if event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter):
            if event.modifiers() & Qt.KeyboardModifier.ShiftModifier:
                # QPlainTextEdit would insert a line separator (U+2028) for Shift+Enter: a real
                # newline is what the user means, and what a code block needs.
                self.textCursor().insertText("\n")
                self.ensureCursorVisible()
                return
            self.submitted.emit()
            return
        super().keyPressEvent(event)


NO_MODEL_LABEL_MAX_PX = 240
CHAT_PLACEHOLDER = "Message… (Enter sends, Shift+Enter for a new line, Esc stops)"
PLAIN_PLACEHOLDER = "Text for the model to continue… (Enter sends, Shift+Enter for a new line, Esc stops)"
PLAIN_TEXT = "Plain completion"
PLAIN_TIP = ("Send the conversation as plain text for the model to continue, with no chat roles. "
             "A base model (one without a chat template) was not trained to answer: it continues "
             "text, so plain completion is how to use it; a chat model answers better without it.")


class ChatPanel(QWidget):
    sendRequested = Signal(str)
    stopRequested = Signal()
    regenerateRequested = Signal()
    editCancelled = Signal()
    systemPromptEdited = Signal(str)  # after typing pauses (debounced)
    loadLastRequested = Signal()  # the no-model bar's "Load ..." (the pair the picker shows)
    chooseModelRequested = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.system_prompt = QPlainTextEdit()
        self.system_prompt.setPlaceholderText("System prompt (optional): instructions the model gets before this chat")
        self.system_prompt.setToolTip("Sent before the conversation in every reply of this chat; saved with the chat.")
        self.system_prompt.setFixedHeight(self.fontMetrics().lineSpacing() * 2 + 14)
        self._prompt_timer = QTimer(self)
        self._prompt_timer.setSingleShot(True)
        self._prompt_timer.setInterval(600)
        self._prompt_timer.timeout.connect(lambda: self.systemPromptEdited.emit(self.system_prompt.toPlainText()))
        self.system_prompt.textChanged.connect(self._prompt_timer.start)

        self.view = ConversationView()
        # First launch (no model, empty chat): what to do, in place of an empty page.
        self.empty_state = EmptyState()
        self.view_stack = QStackedWidget()
        self.view_stack.addWidget(self.view)
        # The welcome page scrolls in a short window rather than squeezing its rows together.
        self._empty_page = scrolling(self.empty_state)
        self.view_stack.addWidget(self._empty_page)

        self.mark_toggle = QCheckBox("Mark accepted draft tokens")
        self.mark_toggle.setChecked(True)
        self.mark_toggle.setToolTip("Highlight the text that came from accepted draft tokens "
                                    "(the rest was written by the main model itself)")
        self.mark_toggle.toggled.connect(self.view.set_mark_drafts)
        swatch = QLabel()
        swatch.setFixedSize(14, 14)
        swatch.setStyleSheet(f"background: {self.view.theme.draft.name()}; border: 1px solid {self.view.theme.border.name()}")
        self.regenerate_button = QPushButton("Regenerate")
        self.regenerate_button.setToolTip("Write a new version of the last reply; the earlier versions "
                                          "are kept (switch with ‹ › above the reply)")
        self.regenerate_button.clicked.connect(self.regenerateRequested)
        self.plain_toggle = QCheckBox(PLAIN_TEXT)
        self.plain_toggle.setToolTip(PLAIN_TIP)
        self.plain_toggle.toggled.connect(self._show_plain)
        self._base_model = False
        tools = QHBoxLayout()
        tools.addWidget(swatch)
        tools.addWidget(self.mark_toggle)
        tools.addWidget(self.plain_toggle)
        tools.addStretch(1)
        tools.addWidget(self.regenerate_button)

        self.edit_banner = QFrame()
        self.edit_banner.setStyleSheet("QFrame { background: #fff7d6; border: 1px solid #e6c95c; border-radius: 4px }")
        banner_layout = QHBoxLayout(self.edit_banner)
        banner_layout.setContentsMargins(8, 2, 8, 2)
        banner_layout.addWidget(QLabel("Editing a message: Send replaces it and every later message."))
        cancel_edit = QPushButton("Cancel edit")
        cancel_edit.clicked.connect(self.editCancelled)
        banner_layout.addStretch(1)
        banner_layout.addWidget(cancel_edit)
        self.edit_banner.hide()

        self._build_no_model_bar()
        self._model_loaded = False
        self._generating = False
        self._flash_ms: int | None = None  # the cursor's flash time, kept while a reply streams
        self._can_regenerate = False

        self.input = MessageBox()
        self.input.setPlaceholderText(CHAT_PLACEHOLDER)
        self.input.setFixedHeight(self.fontMetrics().lineSpacing() * 4 + 14)
        self.input.submitted.connect(self._on_send)
        self.send_button = QPushButton("Send")
        self.send_button.setToolTip("Send the message (Enter; Shift+Enter starts a new line)")
        self.send_button.clicked.connect(self._on_send)
        self.stop_button = QPushButton("Stop")
        self.stop_button.setToolTip("Stop the reply (Esc); what was written so far is kept")
        self.stop_button.setEnabled(False)
        self.stop_button.clicked.connect(self.stopRequested)
        buttons = QVBoxLayout()
        buttons.addWidget(self.send_button)
        buttons.addWidget(self.stop_button)
        buttons.addStretch(1)
        entry = QHBoxLayout()
        entry.addWidget(self.input, 1)
        entry.addLayout(buttons)

        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.system_prompt)
        layout.addWidget(self.view_stack, 1)
        layout.addLayout(tools)
        layout.addWidget(self.edit_banner)
        layout.addWidget(self.no_model_bar)
        layout.addLayout(entry)
        self._refresh_buttons()  # nothing is loaded yet

    def _build_no_model_bar(self) -> None:
        """Over the message box while a chat is open and nothing is loaded (after a restart):
        what to do, where Send would otherwise answer only in the status bar."""
        self.no_model_bar = QFrame()
        self.no_model_bar.setObjectName("noModelBar")
        self.no_model_bar.setStyleSheet("QFrame#noModelBar { border: 1px solid #e6c95c; border-radius: 4px }")
        layout = QHBoxLayout(self.no_model_bar)
        layout.setContentsMargins(8, 2, 8, 2)
        self.no_model_label = QLabel("No model loaded: load one to chat.")
        # The bar wraps: no text of it sets the window's width; the label keeps one line's width
        # (up to a limit) where the button beside it would take it all.
        self.no_model_label.setWordWrap(True)
        one_line = self.no_model_label.fontMetrics().horizontalAdvance(self.no_model_label.text()) + 4
        self.no_model_label.setMinimumWidth(min(one_line, NO_MODEL_LABEL_MAX_PX))
        # "Load <a long repository name> + <drafter>": cut to the room it gets, whole in its tooltip.
        self.load_last_button = ElidedButton("Load the last pair")
        self.load_last_button.clicked.connect(self.loadLastRequested)
        self.choose_model_button = QPushButton("Choose…")
        self.choose_model_button.setToolTip("Pick a main model and a drafter in the Model tab")
        self.choose_model_button.clicked.connect(self.chooseModelRequested)
        layout.addWidget(self.no_model_label, 1)
        layout.addWidget(self.load_last_button)
        layout.addWidget(self.choose_model_button)
        self.no_model_bar.hide()

    def set_no_model(self, show: bool, last_pair: str | None = None, main_title: str | None = None) -> None:
        """Show the no-model bar, offering to load `last_pair` (a title) where there is one;
        `main_title`, its main model's name in it, is what is shortened first where room is short."""
        self.no_model_bar.setVisible(show)
        self.load_last_button.setVisible(bool(last_pair))
        if last_pair:
            self.load_last_button.set_full_text(
                f"Load {last_pair}", main_title, f"Load {last_pair}, the pair chosen when the window last closed")

    def set_model_loaded(self, loaded: bool) -> None:
        """Send and Regenerate work only with a model loaded (Enter still says why not)."""
        self._model_loaded = loaded
        self._refresh_buttons()

    def enable_regenerate(self, possible: bool) -> None:
        """Whether the open chat has a reply to write again (enabled only with a model loaded)."""
        self._can_regenerate = possible
        self._refresh_buttons()

    def _refresh_buttons(self) -> None:
        ready = self._model_loaded and not self._generating
        self.send_button.setEnabled(ready)
        self.regenerate_button.setEnabled(ready and self._can_regenerate)

    def _on_send(self) -> None:
        text = self.input.toPlainText()
        if text.strip() and not self._generating:
            self.sendRequested.emit(text)

    def show_empty_state(self, show: bool) -> None:
        self.view_stack.setCurrentWidget(self._empty_page if show else self.view)

    def empty_state_shown(self) -> bool:
        return self.view_stack.currentWidget() is self._empty_page

    def set_base_model(self, base: bool) -> None:
        """A model was loaded: a base model (no chat template) turns plain completion on, and says
        why; a chat model turns it off (the user may still tick it)."""
        self._base_model = base
        self.plain_toggle.setText(PLAIN_TEXT + (" (base model: it continues your text)" if base else ""))
        self.plain_toggle.setChecked(base)
        self._show_plain(base)

    def _show_plain(self, plain: bool) -> None:
        self.input.setPlaceholderText(PLAIN_PLACEHOLDER if plain else CHAT_PLACEHOLDER)
        # Qt repaints an empty box only when its hint appears or goes, not when the hint's text
        # changes: the old hint stayed on screen until something else repainted it (New chat).
        self.input.viewport().update()

    def set_generating(self, generating: bool) -> None:
        self._generating = generating
        self._steady_cursor(generating)
        if not generating:
            self._can_regenerate = True  # the reply just written
        self._refresh_buttons()
        self.stop_button.setEnabled(generating)

    def _steady_cursor(self, steady: bool) -> None:
        """The text cursor stops blinking while a reply streams, as GTK's does after a while
        without typing: each blink repaints the box, twice a second, and on two cores every
        paint during a reply is taken from llama.cpp's spinning threads (3-8 ms of the GUI
        thread in a 0.8 s SmolLM2 reply). It still shows, and blinks again when the reply ends."""
        if steady and self._flash_ms is None:
            self._flash_ms = QApplication.cursorFlashTime()
            QApplication.setCursorFlashTime(0)
        elif not steady and self._flash_ms is not None:
            QApplication.setCursorFlashTime(self._flash_ms)
            self._flash_ms = None

    def set_editing(self, text: str | None) -> None:
        """Show the edit banner with `text` in the box, or (None) leave editing."""
        self.edit_banner.setVisible(text is not None)
        if text is not None:
            self.input.setPlainText(text)
            self.input.setFocus()

    def set_system_prompt(self, text: str) -> None:
        self.system_prompt.blockSignals(True)
        self.system_prompt.setPlainText(text)
        self.system_prompt.blockSignals(False)
        self._prompt_timer.stop()

    def flush_system_prompt(self) -> None:
        """Emit a pending (debounced) system prompt edit now."""
        if self._prompt_timer.isActive():
            self._prompt_timer.stop()
            self.systemPromptEdited.emit(self.system_prompt.toPlainText())
