"""What Send, Stop, Regenerate, edit-and-resend and New chat do, and where replies are saved.

A reply is saved while it streams: its history row is created empty (complete=False) before the
first token, its text and draft spans are written every SAVE_EVERY_S, and the last write (with
the stats and complete=True) happens when the host reports the end, also after Stop or an error.
A crash therefore loses at most the last SAVE_EVERY_S of a reply, and a restart shows what was
saved as a partial reply.
"""

from __future__ import annotations

import hashlib
import logging
import time
from typing import Any, Callable

from PySide6.QtCore import QCoreApplication, QEvent, QObject, QSettings, QTimer, Signal

from app.engine.llama_server.notes import server_draft_note
from app.ui.chat.history import DEFAULT_TITLE, HistoryError, HistoryStore, title_from
from app.ui.chat.panel import ChatPanel
from app.ui.common.budget import FrameBudget
from app.ui.common.format import PLAIN_DRAFTERS
from app.worker.host import ModelHost
from app.worker.requests import ChatRequest, GenSettings

log = logging.getLogger(__name__)

SHOW_HZ = 10  # the streaming reply is re-rendered at most this often...
SHOW_SHARE = 0.02  # ...and less often where rendering it would take more of a core (app.ui.common.budget)
SAVE_EVERY_S = 1.0  # and saved this often while it streams (whole and complete when it ends)
_NOT_SAVED = ("tokens", "text")  # bulky summary fields: the text is the message itself


class StreamingReply:
    """The reply being received: its text and the [start, end) spans of accepted draft text."""

    def __init__(self, chat_id: int, message_id: int) -> None:
        self.chat_id, self.message_id = chat_id, message_id
        self.text = ""
        self.spans: list[list[int]] = []
        self.dirty = False  # text not saved yet
        self.unshown = False  # text not rendered yet
        self.n_steps = 0
        self.stopping = False  # Stop was asked for

    def add(self, event: Any) -> None:
        """One StepEvent: the first draft_chars characters of its text are accepted draft text."""
        start = len(self.text)
        n_draft = min(event.draft_chars, len(event.text))
        if n_draft:
            if self.spans and self.spans[-1][1] == start:
                self.spans[-1][1] = start + n_draft
            else:
                self.spans.append([start, start + n_draft])
        self.text += event.text
        self.n_steps += 1
        self.dirty = self.unshown = True


class ChatController(QObject):
    message = Signal(str)  # for the status bar
    busyChanged = Signal(bool)
    chatOpened = Signal(object)  # chat id or None
    replyFinished = Signal(object, str)  # summary dict or None, error line

    def __init__(self, store: HistoryStore, host: ModelHost, panel: ChatPanel, charts, settings: QSettings,
                 gen_settings: Callable[[], GenSettings], loaded_main: Callable[[], str | None]) -> None:
        super().__init__(panel)
        self.store, self.host, self.panel, self.charts = store, host, panel, charts
        self._settings = settings
        self._gen_settings = gen_settings
        self._loaded_main = loaded_main
        self.chat_id: int | None = None
        self.stream: StreamingReply | None = None
        self.editing_id: int | None = None

        self._show_budget = FrameBudget(SHOW_HZ, SHOW_SHARE)
        panel.view.paint_budget = self._show_budget
        self._saved_at = 0.0
        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.setInterval(self._show_budget.interval_ms())
        self._timer.timeout.connect(self._tick)

        host.steps.connect(self._on_steps)
        host.finished.connect(self._on_finished)
        panel.sendRequested.connect(self.send)
        panel.stopRequested.connect(self.stop)
        panel.regenerateRequested.connect(lambda: self.regenerate(None))
        panel.editCancelled.connect(self.cancel_edit)
        panel.systemPromptEdited.connect(self._save_system_prompt)
        panel.view.actionRequested.connect(self._on_action)

    @property
    def busy(self) -> bool:
        return self.stream is not None

    # --- chats --------------------------------------------------------------------------------

    def open_chat(self, chat_id: int | None) -> None:
        """Show a chat (also while a reply streams into another one: it keeps being saved)."""
        self.panel.flush_system_prompt()
        self.cancel_edit()
        if chat_id is not None and self.store.chat(chat_id) is None:
            chat_id = None
        self.chat_id = chat_id
        self.panel.set_system_prompt(self.store.system_prompt(chat_id) if chat_id is not None else "")
        self._render()
        self.chatOpened.emit(chat_id)

    def new_chat(self) -> None:
        """Ctrl+N: an empty chat (the current one when it is still empty)."""
        self.panel.flush_system_prompt()
        if self.chat_id is not None and not self.store.messages(self.chat_id):
            self.panel.input.setFocus()
            return
        chat_id = self.store.new_chat(DEFAULT_TITLE, "", self._gen_settings().to_dict())
        self.open_chat(chat_id)
        self.panel.input.setFocus()

    def chat_deleted(self, chat_id: int) -> None:
        if self.stream is not None and self.stream.chat_id == chat_id:
            self.stop()
        if chat_id == self.chat_id:
            self.chat_id = None
            self.open_chat(None)

    def _save_system_prompt(self, text: str) -> None:
        if self.chat_id is not None:
            try:
                self.store.set_system_prompt(self.chat_id, text)
            except HistoryError as exc:
                self.message.emit(str(exc))

    # --- sending ------------------------------------------------------------------------------

    def send(self, text: str) -> bool:
        """Send `text` as the user (replacing the message being edited). False if refused."""
        if self.busy:
            self.message.emit("a reply is being generated: wait for it or stop it (Esc)")
            return False
        if not text.strip():
            return False
        if not self._loaded_main():
            self.message.emit("no model is loaded: pick a pair and press Load first")
            return False
        try:
            self.panel.flush_system_prompt()
            if self.chat_id is None:
                self.chat_id = self.store.new_chat(title_from(text), self.panel.system_prompt.toPlainText(),
                                                   self._gen_settings().to_dict())
                self.chatOpened.emit(self.chat_id)
            if self.editing_id is not None:
                self.store.delete_from(self.chat_id, self.editing_id)
            history = self._history()
            chat = self.store.chat(self.chat_id)
            if chat is not None and chat.title == DEFAULT_TITLE and not history:
                self.store.rename_chat(self.chat_id, title_from(text))
            self.store.add_message(self.chat_id, "user", text)
        except HistoryError as exc:
            self.message.emit(str(exc))
            return False
        self.cancel_edit()
        self.panel.input.clear()
        self._start(history, text)
        return True

    def regenerate(self, message_id: int | None) -> None:
        """A new version of an assistant reply (the last one when None), replacing everything
        after it; its earlier versions are kept, to switch back to (show_version)."""
        if self.busy:
            self.message.emit("a reply is being generated: wait for it or stop it (Esc)")
            return
        if self.chat_id is None:
            return
        if not self._loaded_main():
            self.message.emit("no model is loaded: pick a pair and press Load first")
            return
        rows = self.store.messages(self.chat_id)
        replies = [m for m in rows if m.role == "assistant" and (message_id is None or m.id == message_id)]
        if not replies:
            self.message.emit("there is no reply to regenerate")
            return
        target = replies[-1]
        before = [m for m in rows if m.id < target.id]
        users = [i for i, m in enumerate(before) if m.role == "user"]
        if not users:
            return
        user = before[users[-1]]
        try:
            self.store.new_version(self.chat_id, target.id)
        except HistoryError as exc:
            self.message.emit(str(exc))
            return
        history = [(m.role, m.content) for m in before[:users[-1]] if m.role in ("user", "assistant")]
        self._start(history, user.content, reply_id=target.id)

    def show_version(self, message_id: int, step: int) -> None:
        """Show the reply's previous (step -1) or next (+1) version; the next turn's context is
        the versions shown."""
        if self.busy or self.chat_id is None:
            return
        row = next((m for m in self.store.messages(self.chat_id) if m.id == message_id), None)
        if row is None or row.n_versions < 2:
            return
        try:
            self.store.show_version(message_id, min(max(row.version + step, 1), row.n_versions))
        except HistoryError as exc:
            self.message.emit(str(exc))
        self._render()

    def edit(self, message_id: int) -> None:
        row = next((m for m in self.store.messages(self.chat_id) if m.id == message_id), None) if self.chat_id else None
        if row is None or row.role != "user" or self.busy:
            return
        self.editing_id = message_id
        self.panel.set_editing(row.content)

    def cancel_edit(self) -> None:
        if self.editing_id is not None:
            self.editing_id = None
            self.panel.input.clear()
        self.panel.set_editing(None)

    def stop(self) -> None:
        if self.busy:
            self.host.cancel()
            self.stream.stopping = True
            self.message.emit("stopping…")

    def _history(self) -> list[tuple[str, str]]:
        return [(m.role, m.content) for m in self.store.messages(self.chat_id) if m.role in ("user", "assistant")]

    def _start(self, history: list[tuple[str, str]], user_text: str, reply_id: int | None = None) -> None:
        """Generate a reply into a new row, or into `reply_id` (a new version made ready for it)."""
        settings = self._gen_settings()
        message_id = reply_id if reply_id is not None else self.store.add_message(
            self.chat_id, "assistant", "", complete=False)
        self.stream = StreamingReply(self.chat_id, message_id)
        self.panel.set_generating(True)
        self._render()
        self.charts.reset(time.monotonic())
        self.charts.set_reference_tps(self.reference_tps(self._loaded_main()))
        request = ChatRequest(tuple(history), user_text, self.panel.system_prompt.toPlainText(), settings,
                              plain=self.panel.plain_toggle.isChecked())
        self._saved_at = time.monotonic()  # the empty row was just written
        self._timer.start(self._show_budget.interval_ms())
        self.busyChanged.emit(True)
        self._paint_now()
        self.host.generate(request)

    def _paint_now(self) -> None:
        """Paint what the start of a reply changed (the message sent, the cleared charts, the
        buttons) before the model starts: painted later, it fell on the first decoding steps of
        a small model, where llama.cpp's threads wait for the core it takes (20-40 ms of paints
        in SmolLM2's 0.8 s reply, on two cores). Only pending paints run here, not the event
        loop: no click can arrive in the middle of starting a reply."""
        self.charts.paint_now()
        QCoreApplication.sendPostedEvents(self.panel.window(), QEvent.Type.UpdateRequest)

    # --- streaming ----------------------------------------------------------------------------

    def _on_steps(self, events: tuple) -> None:
        if self.stream is None:
            return
        for event in events:
            self.stream.add(event)
            self.charts.add_step(event)

    def _tick(self) -> None:
        self._show_budget.timed(lambda: self.flush(save=time.monotonic() - self._saved_at >= SAVE_EVERY_S))
        if self.stream is not None:
            self._timer.start(self._show_budget.interval_ms())

    def flush(self, save: bool = True) -> None:
        """Show what arrived since the last flush, and save it unless `save` is False (the timer
        saves once a second: the reply is saved whole when it ends)."""
        stream = self.stream
        if stream is None:
            return
        if stream.unshown and stream.chat_id == self.chat_id:
            self.panel.view.update_stream(stream.text, stream.spans)
            stream.unshown = False
        if not save or not stream.dirty:
            return
        stream.dirty = False
        self._saved_at = time.monotonic()
        try:
            self.store.update_message(stream.message_id, stream.text, draft_spans=stream.spans)
        except HistoryError as exc:  # e.g. the chat was deleted meanwhile: keep streaming on screen
            log.warning("could not save the reply: %s", exc)

    def _on_finished(self, summary: dict | None, error: str) -> None:
        stream, self.stream = self.stream, None
        self._timer.stop()
        if stream is None:
            return
        stats: dict[str, Any] | None = None
        if summary is not None:
            summary = self._with_server_note(summary)
            stats = {k: v for k, v in summary.items() if k not in _NOT_SAVED}
        elif error:
            stats = {"stop_reason": "error", "error": error}
        try:
            if not stream.text and error:
                # nothing was written: a new version gives way to the earlier one, a new reply goes
                self.store.discard_version(stream.chat_id, stream.message_id)
            else:
                self.store.update_message(stream.message_id, stream.text, draft_spans=stream.spans,
                                          stats=stats, complete=True)
        except HistoryError as exc:
            log.warning("could not save the reply: %s", exc)
        if error:
            self.message.emit(f"reply failed: {error}")
        elif summary is not None:
            self._remember_reference(summary)
        if not error and stream.stopping:  # "stopping…" must not outlive the stop
            self.message.emit("stopped: the reply so far is kept")
        self.panel.set_generating(False)
        self.charts.redraw()
        if stream.chat_id == self.chat_id:
            self._render()
        self.busyChanged.emit(False)
        self.replyFinished.emit(summary, error)

    def finish_now(self) -> None:
        """At close, when the host could not report the end: save what arrived as partial."""
        stream, self.stream = self.stream, None
        self._timer.stop()
        self.panel.set_generating(False)  # the cursor's blinking too: the flash time is the application's
        if stream is not None:
            try:
                self.store.update_message(stream.message_id, stream.text, draft_spans=stream.spans)
            except HistoryError as exc:
                log.warning("could not save the reply: %s", exc)

    # --- reference speed (the no-draft decode speed of a main model) --------------------------

    def reference_tps(self, main_path: str | None) -> float | None:
        if not main_path:
            return None
        value = self._settings.value(_reference_key(main_path))
        try:
            return float(value) if value is not None else None
        except (TypeError, ValueError):
            return None

    def _remember_reference(self, summary: dict) -> None:
        main = self._loaded_main()
        tps = summary.get("decode_tps") or 0.0
        if main and summary.get("drafter") in PLAIN_DRAFTERS and tps > 0 and summary.get("n_predicted", 0) >= 8:
            self._settings.setValue(_reference_key(main), float(tps))
            self.charts.set_reference_tps(float(tps))

    def _with_server_note(self, summary: dict) -> dict:
        """A llama-server reply slower than this model's plain speed, or one whose type drafted
        nothing, with why in words from llama-server's own counts (the line our loop's schedule
        writes for its own replies)."""
        if summary.get("schedule_note"):
            return summary
        counts = [summary.get(k) for k in ("n_predicted", "n_drafted", "n_accepted", "n_steps", "decode_tps")]
        if not all(isinstance(v, (int, float)) for v in counts):  # a server that did not say
            return summary
        note = server_draft_note(str(summary.get("drafter", "")), *counts, self.reference_tps(self._loaded_main()))
        return {**summary, "schedule_note": note} if note else summary

    # --- view ---------------------------------------------------------------------------------

    def _render(self) -> None:
        rows = self.store.messages(self.chat_id) if self.chat_id is not None else []
        stream = self.stream
        streaming = stream.message_id if stream is not None and stream.chat_id == self.chat_id else None
        self.panel.view.set_messages(rows, streaming_id=streaming)
        if streaming is not None and stream.text:
            self.panel.view.update_stream(stream.text, stream.spans)
        self.panel.enable_regenerate(not self.busy and any(m.role == "assistant" for m in rows))

    def _on_action(self, action: str, message_id: int) -> None:
        if action == "edit":
            self.edit(message_id)
        elif action == "regenerate":
            self.regenerate(message_id)
        elif action in ("older", "newer"):
            self.show_version(message_id, -1 if action == "older" else 1)


def _reference_key(main_path: str) -> str:
    return "reference_tps/" + hashlib.sha1(main_path.encode("utf-8")).hexdigest()[:16]
