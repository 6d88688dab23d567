"""The list of chats: search, switch, rename (F2 or menu), delete (Delete or menu), new chat.

Reads and writes the HistoryStore directly; tells the window what the user did through signals.
A programmatic refresh() never emits chatSelected: only the user's own choice does, so the window
can refresh the list while a reply streams without being told to reload the chat it shows.
"""

from __future__ import annotations

from PySide6.QtCore import QEvent, QModelIndex, QObject, QPoint, QRect, QSize, Qt, QTimer, Signal
from PySide6.QtGui import QColor, QFontMetrics, QPainter, QPalette
from PySide6.QtWidgets import (
    QAbstractItemView,
    QApplication,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QMenu,
    QMessageBox,
    QPushButton,
    QStyle,
    QStyledItemDelegate,
    QStyleOptionViewItem,
    QVBoxLayout,
    QWidget,
)

from app.ui.chat.history import ChatRow, HistoryError, HistoryStore
from app.ui.common.format import date_time_text, relative_time

CHAT_ID = Qt.ItemDataRole.UserRole
UPDATED = Qt.ItemDataRole.UserRole + 1
SEARCH_DELAY_MS = 200
CLOCK_MS = 30_000  # "5 min ago" labels are repainted this often


class _ChatDelegate(QStyledItemDelegate):
    """Title on the left (elided), the relative time on the right in a muted colour."""

    def paint(self, painter: QPainter, option: QStyleOptionViewItem, index: QModelIndex) -> None:
        opt = QStyleOptionViewItem(option)
        self.initStyleOption(opt, index)
        title, opt.text = opt.text, ""
        style = opt.widget.style() if opt.widget else QApplication.style()
        style.drawControl(QStyle.ControlElement.CE_ItemViewItem, opt, painter, opt.widget)

        selected = bool(opt.state & QStyle.StateFlag.State_Selected)
        role = QPalette.ColorRole.HighlightedText if selected else QPalette.ColorRole.Text
        text_color = opt.palette.color(role)
        title_rect, shown_title, when = self.layout_texts(opt, title, index.data(UPDATED) or 0.0)
        painter.save()
        painter.setFont(opt.font)
        painter.setPen(text_color)
        painter.drawText(title_rect, Qt.AlignmentFlag.AlignVCenter | Qt.AlignmentFlag.AlignLeft, shown_title)
        muted = QColor(text_color)
        muted.setAlphaF(0.55)
        painter.setPen(muted)
        painter.drawText(opt.rect.adjusted(8, 0, -8, 0),
                         Qt.AlignmentFlag.AlignVCenter | Qt.AlignmentFlag.AlignRight, when)
        painter.restore()

    @staticmethod
    def layout_texts(option: QStyleOptionViewItem, title: str, updated: float) -> tuple[QRect, str, str]:
        """Where the title goes, the title as it fits (elided), and the relative time."""
        when = relative_time(updated)
        metrics = QFontMetrics(option.font)
        rect = option.rect.adjusted(8, 0, -8, 0)
        width = max(0, rect.width() - metrics.horizontalAdvance(when) - 12)
        title_rect = QRect(rect.left(), rect.top(), width, rect.height())
        return title_rect, metrics.elidedText(title, Qt.TextElideMode.ElideRight, width), when

    def sizeHint(self, option: QStyleOptionViewItem, index: QModelIndex) -> QSize:  # noqa: N802
        hint = super().sizeHint(option, index)
        return QSize(hint.width(), max(hint.height(), QFontMetrics(option.font).height() + 14))


class ChatList(QWidget):
    """Search box, "New chat" button and the chats, newest first."""

    chatSelected = Signal(int)  # the user picked a chat (never emitted by refresh())
    newChatRequested = Signal()
    chatDeleted = Signal(int)  # emitted after the store deleted it
    errorOccurred = Signal(str)  # a one-line message for the window (a history write failed)

    def __init__(self, store: HistoryStore, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.store = store
        self._rebuilding = False

        self.search = QLineEdit(placeholderText="Search chats", clearButtonEnabled=True)
        self.search.setToolTip("Find chats by title or by any message's text")
        self.new_button = QPushButton("New chat")
        self.new_button.setToolTip("Start a new conversation (Ctrl+N)")
        self.list = QListWidget()
        self.list.setItemDelegate(_ChatDelegate(self.list))
        self.list.setUniformItemSizes(True)
        self.list.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)  # F2: see eventFilter
        self.list.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.empty_label = QLabel(alignment=Qt.AlignmentFlag.AlignCenter, wordWrap=True)
        self.empty_label.setEnabled(False)  # drawn in the disabled (muted) colour

        top = QHBoxLayout()
        top.setContentsMargins(0, 0, 0, 0)
        top.addWidget(self.search, 1)
        top.addWidget(self.new_button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addLayout(top)
        layout.addWidget(self.list, 1)
        layout.addWidget(self.empty_label)

        self.list.installEventFilter(self)  # F2 renames, Delete deletes, while the list has focus

        self._search_timer = QTimer(self, singleShot=True, interval=SEARCH_DELAY_MS)
        self._search_timer.timeout.connect(self.refresh)
        self.search.textChanged.connect(lambda _text: self._search_timer.start())  # restarts per key
        self._clock = QTimer(self, interval=CLOCK_MS)
        self._clock.timeout.connect(self.list.viewport().update)
        self._clock.start()
        self.new_button.clicked.connect(self.newChatRequested)
        self.list.currentItemChanged.connect(self._on_current_changed)
        self.list.itemChanged.connect(self._on_item_edited)
        self.list.customContextMenuRequested.connect(self._show_menu)
        self.list.itemDelegate().closeEditor.connect(self._after_edit)
        self._pending_refresh: tuple[int | None] | None = None
        self.refresh()

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:  # noqa: N802 (Qt's name)
        # A filter rather than QShortcut: shortcuts need an active window and would also fire
        # from the rename editor; key presses reach the list only when it has the focus itself.
        if watched is self.list and event.type() == QEvent.Type.KeyPress:
            if event.key() == Qt.Key.Key_F2 and not event.modifiers():
                self.rename_current()
                return True
            # Backspace too: a Mac keyboard's "delete" key sends it.
            if event.key() in (Qt.Key.Key_Delete, Qt.Key.Key_Backspace) and not event.modifiers():
                self.delete_current()
                return True
        return super().eventFilter(watched, event)

    # -- public API ----------------------------------------------------------------------

    def refresh(self, select_id: int | None = None) -> None:
        """Reload from the store, keeping (or moving to select_id) the selection, silently."""
        if self.list.state() == QAbstractItemView.State.EditingState:
            self._pending_refresh = (select_id,)  # never throw away a title being typed
            return
        keep = self.current_chat_id() if select_id is None else select_id
        scroll = self.list.verticalScrollBar().value()
        try:
            rows = self.store.chats(self.search.text())
        except HistoryError as exc:
            self.errorOccurred.emit(str(exc))
            rows = []
        self._rebuilding = True
        try:
            self.list.clear()
            for row in rows:
                self.list.addItem(self._make_item(row))
                if row.id == keep:
                    self.list.setCurrentRow(self.list.count() - 1)
        finally:
            self._rebuilding = False
        self.list.verticalScrollBar().setValue(scroll)
        self._update_empty_label(bool(rows))

    def current_chat_id(self) -> int | None:
        item = self.list.currentItem()
        return None if item is None else int(item.data(CHAT_ID))

    def chat_ids(self) -> list[int]:
        """The ids shown, top to bottom (for tests and keyboard navigation)."""
        return [int(self.list.item(i).data(CHAT_ID)) for i in range(self.list.count())]

    def confirm_delete(self, title: str) -> bool:
        """Ask before deleting (override or patch in tests: never a modal dialog there)."""
        answer = QMessageBox.question(
            self, "Delete chat", f"Delete “{title}” and all its messages? This cannot be undone.",
            QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.Cancel,
            QMessageBox.StandardButton.Cancel,
        )
        return answer == QMessageBox.StandardButton.Yes

    def rename_current(self) -> None:
        """Start editing the current chat's title in place (F2)."""
        self._rename(self.list.currentItem())

    def delete_current(self) -> None:
        """Delete the current chat after confirm_delete() (the Delete key)."""
        self._delete(self.list.currentItem())

    # -- internals -----------------------------------------------------------------------

    def _make_item(self, row: ChatRow) -> QListWidgetItem:
        item = QListWidgetItem(row.title)
        item.setData(CHAT_ID, row.id)
        item.setData(UPDATED, row.updated)
        item.setToolTip(f"{row.title}\n{row.n_messages} messages · last active "
                        f"{date_time_text(row.updated)}")
        item.setFlags(item.flags() | Qt.ItemFlag.ItemIsEditable)
        return item

    def _update_empty_label(self, has_rows: bool) -> None:
        query = self.search.text().strip()
        self.empty_label.setText(f"No chat mentions “{query}”" if query else "No chats yet")
        self.empty_label.setVisible(not has_rows)

    def _on_current_changed(self, current: QListWidgetItem | None, _previous) -> None:
        if current is not None and not self._rebuilding:
            self.chatSelected.emit(int(current.data(CHAT_ID)))

    def _after_edit(self, *_args) -> None:
        if self._pending_refresh is not None:
            (select_id,), self._pending_refresh = self._pending_refresh, None
            QTimer.singleShot(0, lambda: self.refresh(select_id))  # once the editor is gone

    def _on_item_edited(self, item: QListWidgetItem) -> None:
        if self._rebuilding:
            return
        chat_id = int(item.data(CHAT_ID))
        try:
            self.store.rename_chat(chat_id, item.text())
        except HistoryError as exc:
            if item.text().strip():  # an empty title simply reverts; anything else is news
                self.errorOccurred.emit(str(exc))
        try:
            row = self.store.chat(chat_id)
        except HistoryError:
            row = None
        self._rebuilding = True  # show the stored title (trimmed, or the old one on failure)
        try:
            item.setText(row.title if row else item.text())
        finally:
            self._rebuilding = False

    def _item_for(self, chat_id: int) -> QListWidgetItem | None:
        for row in range(self.list.count()):
            if int(self.list.item(row).data(CHAT_ID)) == chat_id:
                return self.list.item(row)
        return None

    def _rename(self, item: QListWidgetItem | None) -> None:
        if item is not None and self.list.state() != QAbstractItemView.State.EditingState:
            self.list.editItem(item)

    def _delete(self, item: QListWidgetItem | None) -> None:
        if item is None:
            return
        chat_id, title = int(item.data(CHAT_ID)), item.text()
        if not self.confirm_delete(title):
            return
        was_current = chat_id == self.current_chat_id()
        row = self.list.row(item)
        try:
            self.store.delete_chat(chat_id)
        except HistoryError as exc:
            self.errorOccurred.emit(str(exc))
            return
        self.chatDeleted.emit(chat_id)
        self._rebuilding = True
        try:
            self.list.takeItem(row)
        finally:
            self._rebuilding = False
        self._update_empty_label(self.list.count() > 0)
        if was_current and self.list.count():
            # Move to the neighbour, as a user expects; the window hears of it as a choice.
            self._rebuilding = True
            try:
                self.list.setCurrentRow(min(row, self.list.count() - 1))
            finally:
                self._rebuilding = False
            self.chatSelected.emit(self.current_chat_id())

    def _show_menu(self, pos: QPoint) -> None:
        menu = self.context_menu(self.list.itemAt(pos))
        menu.popup(self.list.viewport().mapToGlobal(pos))

    def context_menu(self, item: QListWidgetItem | None) -> QMenu:
        """The menu for a chat (or for empty space); it acts on that chat without switching to it."""
        menu = QMenu(self)
        menu.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        if item is not None:
            # By id, not item: the list may be rebuilt (a refresh) while the menu is open.
            chat_id = int(item.data(CHAT_ID))
            # "\t" puts the shortcut in the menu's shortcut column.
            menu.addAction("Rename\tF2", lambda: self._rename(self._item_for(chat_id)))
            menu.addAction("Delete…\tDel", lambda: self._delete(self._item_for(chat_id)))
            menu.addSeparator()
        menu.addAction("New chat", self.newChatRequested.emit)
        return menu
