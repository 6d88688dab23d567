"""The conversation: one read-only rich-text view of a chat's messages, streaming the last one.

Each message is a frame (a soft "bubble") holding a header line (who, plus action links), the
Markdown body with accepted draft text highlighted, and, under a reply, its stats line. Actions
are links ("action:edit:<id>", "action:regenerate:<id>") so the whole chat stays one selectable,
scrollable document. While a reply streams, only its body is re-rendered, by the caller's timer,
never per token.
"""

from __future__ import annotations

import html
import time
from typing import Any, Sequence

from PySide6.QtCore import QEvent, QUrl, Signal
from PySide6.QtGui import QTextBlockFormat, QTextCharFormat, QTextCursor, QTextFrame, QTextFrameFormat
from PySide6.QtWidgets import QTextBrowser, QWidget

from app.ui.chat.render import Theme, insert_reply, theme_for
from app.ui.common.budget import FrameBudget
from app.ui.common.format import stats_line

ROLE_TITLES = {"user": "You", "assistant": "Assistant", "system": "System"}


def ending_note(message: Any) -> str:
    """The grey lines under a reply: its stats, or why there are none; and where the schedule
    declined to draft, why (RunSummary.schedule_note), on a line of its own."""
    if not message.complete:
        return "partial reply: generation was interrupted"
    if message.stats and message.stats.get("stop_reason") == "error":
        return f"stopped by an error: {message.stats.get('error', 'unknown')}"
    if message.stats:
        line = stats_line(message.stats) or "no stats"
        declined = message.stats.get("schedule_note")
        return f"{line}\n{declined}" if isinstance(declined, str) and declined else line
    return ""


class ConversationView(QTextBrowser):
    """Shows a chat; `actionRequested(action, message_id)` when an edit/regenerate link is hit."""

    actionRequested = Signal(str, int)
    messagesChanged = Signal()  # a chat was shown (or emptied): the empty state may change

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setOpenLinks(False)
        self.setOpenExternalLinks(False)
        self.anchorClicked.connect(self._on_anchor)
        self.document().setDocumentMargin(10)
        self.setPlaceholderText("Pick a model pair, press Load, then type a message below.")
        self._messages: list[Any] = []
        self.theme: Theme = theme_for(self.palette())
        self._mark = True
        self._streaming_id: int | None = None
        self._stream_frame: QTextFrame | None = None
        self._stream_body_start = 0
        self._stream_note_start = 0  # where the "generating…" line under the streamed text starts
        # Told how long each paint took: the streamed text's cost is its re-render and the paint
        # that follows it, as much as both (the controller's rate of showing the reply keeps to it).
        self.paint_budget: FrameBudget | None = None

    def paintEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        started = time.perf_counter()
        super().paintEvent(event)
        if self.paint_budget is not None:
            self.paint_budget.spent(time.perf_counter() - started)

    # --- whole-chat rendering ---------------------------------------------------------------

    def set_messages(self, messages: Sequence[Any], streaming_id: int | None = None) -> None:
        """Render these messages (history rows: id, role, content, draft_spans, stats, complete).
        `streaming_id` is the reply being generated: update_stream() re-renders its body, and the
        edit/regenerate links are hidden meanwhile."""
        self._messages = list(messages)
        self._streaming_id = streaming_id
        self._render_all()
        self.messagesChanged.emit()

    def is_empty(self) -> bool:
        return not self._messages

    def set_mark_drafts(self, on: bool) -> None:
        if on != self._mark:
            self._mark = on
            self._render_all()

    def mark_drafts(self) -> bool:
        return self._mark

    def changeEvent(self, event: QEvent) -> None:  # noqa: N802 (Qt's name)
        if event.type() in (QEvent.Type.PaletteChange, QEvent.Type.ApplicationPaletteChange):
            self.theme = theme_for(self.palette())
            if self._stream_frame is None:  # a streaming reply re-renders with it anyway
                self._render_all()
        super().changeEvent(event)

    def _render_all(self) -> None:
        at_bottom = self._at_bottom()
        scroll = self.verticalScrollBar().value()
        self._stream_frame = None
        doc = self.document()
        doc.clear()
        cursor = QTextCursor(doc)
        # A document always starts with a block, before the first message's frame: make it tiny.
        cursor.setBlockFormat(_spacer_format())
        cursor.setCharFormat(_spacer_char_format())
        for message in self._messages:
            self._insert_message(cursor, message)
        self._restore_scroll(at_bottom, scroll)

    def _insert_message(self, cursor: QTextCursor, message: Any) -> None:
        root_end = QTextCursor(self.document())
        root_end.movePosition(QTextCursor.MoveOperation.End)
        frame = root_end.insertFrame(_bubble_format(message.role, self.theme))
        cursor.setPosition(frame.firstPosition())
        streaming = message.id == self._streaming_id
        cursor.insertHtml(self._header_html(message))
        cursor.insertBlock(QTextBlockFormat(), QTextCharFormat())
        body_start = cursor.position()
        if message.role == "user":  # as typed: Markdown would join the lines of a Shift+Enter
            cursor.insertText(message.content)
        else:
            insert_reply(cursor, message.content, message.draft_spans, self._mark, self.theme)
        if streaming:
            self._stream_frame, self._stream_body_start = frame, body_start
            self._insert_generating_note(cursor)
        elif message.role == "assistant":
            note = ending_note(message)
            if note:
                cursor.insertBlock(_note_block_format(), QTextCharFormat())
                lines = "<br>".join(html.escape(line) for line in note.split("\n"))
                cursor.insertHtml(f"<span style='color:{self.theme.muted}; font-size:small'>{lines}</span>")

    def _header_html(self, message: Any) -> str:
        title = ROLE_TITLES.get(message.role, message.role)
        colour = {"user": self.theme.user_title, "assistant": self.theme.assistant_title}.get(message.role, self.theme.muted)
        links = []
        actions = self._streaming_id is None
        style = f"style='color:{self.theme.muted}'"  # the palette's link blue is unreadable on dark
        if actions and message.role == "user":
            links.append(f"<a {style} href='action:edit:{message.id}'>edit &amp; resend</a>")
        versions = ""
        if message.role == "assistant" and getattr(message, "n_versions", 1) > 1:
            versions = "&nbsp;&nbsp;" + self._versions_html(message, actions, style)
        if actions and message.role == "assistant":
            links.append(f"<a {style} href='action:regenerate:{message.id}'>regenerate</a>")
        tail = "&nbsp;&nbsp;" + "&nbsp;&nbsp;".join(links) if links else ""
        return f"<b style='color:{colour}'>{title}</b>{versions}<span style='font-size:small'>{tail}</span>"

    def _versions_html(self, message: Any, actions: bool, style: str) -> str:
        """"‹ 2/3 ›": which version of a regenerated reply is shown, arrows to the others (as in
        LM Studio and ChatGPT); the arrows are plain text at either end and while streaming."""
        version, count = message.version, message.n_versions
        link = f"style='color:{self.theme.assistant_title}; text-decoration:none; font-weight:bold'"
        older = f"<a {link} href='action:older:{message.id}'>&nbsp;&#8249;&nbsp;</a>" \
            if actions and version > 1 else "&nbsp;&#8249;&nbsp;"
        newer = f"<a {link} href='action:newer:{message.id}'>&nbsp;&#8250;&nbsp;</a>" \
            if actions and version < count else "&nbsp;&#8250;&nbsp;"
        return f"<span style='color:{self.theme.muted}'>{older}{version}/{count}{newer}</span>"

    # --- streaming --------------------------------------------------------------------------

    def update_stream(self, text: str, spans: Sequence[Sequence[int]]) -> None:
        """Re-render the body of the reply being streamed (the last, incomplete message)."""
        frame = self._stream_frame
        if frame is None:
            return
        at_bottom = self._at_bottom()
        scroll = self.verticalScrollBar().value()
        cursor = QTextCursor(self.document())
        cursor.setPosition(self._stream_body_start)
        cursor.setPosition(frame.lastPosition(), QTextCursor.MoveMode.KeepAnchor)
        cursor.removeSelectedText()
        cursor.setBlockFormat(QTextBlockFormat())
        cursor.setCharFormat(QTextCharFormat())
        insert_reply(cursor, text, spans, self._mark, self.theme)
        self._insert_generating_note(cursor)
        self._restore_scroll(at_bottom, scroll)

    def _insert_generating_note(self, cursor: QTextCursor) -> None:
        cursor.insertBlock(_note_block_format(), QTextCharFormat())
        self._stream_note_start = cursor.position()
        cursor.insertHtml(f"<span style='color:{self.theme.muted}; font-size:small'>generating…</span>")

    def streamed_text(self) -> str:
        """The plain text shown for the streaming reply (tests read it)."""
        if self._stream_frame is None:
            return ""
        end = max(self._stream_body_start, self._stream_note_start - 1)
        return self.document().toRawText()[self._stream_body_start:end]

    # --- helpers ----------------------------------------------------------------------------

    def _at_bottom(self) -> bool:
        bar = self.verticalScrollBar()
        return bar.value() >= bar.maximum() - 4

    def _restore_scroll(self, at_bottom: bool, value: int) -> None:
        bar = self.verticalScrollBar()
        bar.setValue(bar.maximum() if at_bottom else value)

    def _on_anchor(self, url: QUrl) -> None:
        parts = url.toString().split(":")
        if len(parts) == 3 and parts[0] == "action" and parts[2].isdigit():
            self.actionRequested.emit(parts[1], int(parts[2]))


def _bubble_format(role: str, theme: Theme) -> QTextFrameFormat:
    fmt = QTextFrameFormat()
    fmt.setBackground(theme.user_bubble if role == "user" else theme.reply_bubble)
    fmt.setBorder(1)
    fmt.setBorderBrush(theme.border)
    fmt.setBorderStyle(QTextFrameFormat.BorderStyle.BorderStyle_Solid)
    fmt.setPadding(8)
    fmt.setMargin(4)
    fmt.setBottomMargin(8)
    return fmt


def _spacer_format() -> QTextBlockFormat:
    fmt = QTextBlockFormat()
    fmt.setLineHeight(1, QTextBlockFormat.LineHeightTypes.FixedHeight.value)
    return fmt


def _spacer_char_format() -> QTextCharFormat:
    fmt = QTextCharFormat()
    fmt.setFontPointSize(1)
    return fmt


def _note_block_format() -> QTextBlockFormat:
    fmt = QTextBlockFormat()
    fmt.setTopMargin(6)
    return fmt
