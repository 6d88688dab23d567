"""The chat list on a real HistoryStore in a real offscreen window: create, search, rename, delete."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QAbstractItemView, QLineEdit, QStyleOptionViewItem

from app.ui.chat.history import HistoryStore
from app.ui.chat.chat_list import SEARCH_DELAY_MS, ChatList


@pytest.fixture
def store(tmp_path):
    with HistoryStore(tmp_path / "history.sqlite3") as s:
        yield s


@pytest.fixture
def make_list(qtbot, store):
    def make() -> ChatList:
        widget = ChatList(store)
        qtbot.addWidget(widget)
        widget.resize(300, 400)
        widget.show()
        widget.activateWindow()  # so that focus and window shortcuts work as on a desktop
        qtbot.waitActive(widget)
        return widget

    return make


def titles(chat_list: ChatList) -> list[str]:
    return [chat_list.list.item(i).text() for i in range(chat_list.list.count())]


def test_shows_chats_newest_first_and_selection_signals(make_list, store, qtbot):
    old = store.new_chat("Old chat")
    new = store.new_chat("New chat about code")
    store.add_message(new, "user", "hello")
    chat_list = make_list()
    assert titles(chat_list) == ["New chat about code", "Old chat"]
    assert chat_list.current_chat_id() is None and chat_list.empty_label.isHidden()

    # A programmatic refresh selects silently; a user's click is announced.
    with qtbot.assertNotEmitted(chat_list.chatSelected):
        chat_list.refresh(select_id=new)
    assert chat_list.current_chat_id() == new
    with qtbot.waitSignal(chat_list.chatSelected) as picked:
        rect = chat_list.list.visualItemRect(chat_list.list.item(1))
        qtbot.mouseClick(chat_list.list.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())
    assert picked.args == [old]

    # A later refresh keeps the selection even when the order changes.
    store.add_message(old, "user", "bump")
    with qtbot.assertNotEmitted(chat_list.chatSelected):
        chat_list.refresh()
    assert titles(chat_list) == ["Old chat", "New chat about code"]
    assert chat_list.current_chat_id() == old


def test_new_chat_button_and_menu(make_list, qtbot):
    chat_list = make_list()
    assert chat_list.empty_label.isVisible() and chat_list.empty_label.text() == "No chats yet"
    with qtbot.waitSignal(chat_list.newChatRequested):
        qtbot.mouseClick(chat_list.new_button, Qt.MouseButton.LeftButton)
    menu = chat_list.context_menu(None)
    assert [a.text() for a in menu.actions()] == ["New chat"]
    with qtbot.waitSignal(chat_list.newChatRequested):
        menu.actions()[0].trigger()


def test_search_is_debounced_and_matches_titles_and_text(make_list, store, qtbot):
    pasta = store.new_chat("Pasta")
    python = store.new_chat("Help")
    store.add_message(python, "user", "How do I reverse a list in Python?")
    chat_list = make_list()
    loads = []
    real_chats = store.chats
    store.chats = lambda search="": loads.append(search) or real_chats(search)  # count queries

    qtbot.keyClicks(chat_list.search, "pyth")  # four keystrokes
    assert titles(chat_list) == ["Help", "Pasta"]  # nothing filtered yet: debounced
    qtbot.waitUntil(lambda: titles(chat_list) == ["Help"], timeout=SEARCH_DELAY_MS * 10)
    assert loads == ["pyth"]  # one query for the four keystrokes
    chat_list.search.setText("PASTA")
    qtbot.waitUntil(lambda: titles(chat_list) == ["Pasta"], timeout=SEARCH_DELAY_MS * 10)
    chat_list.search.setText("nothing like this")
    qtbot.waitUntil(lambda: chat_list.list.count() == 0, timeout=SEARCH_DELAY_MS * 10)
    assert chat_list.empty_label.isVisible() and "nothing like this" in chat_list.empty_label.text()
    chat_list.search.clear()
    qtbot.waitUntil(lambda: len(titles(chat_list)) == 2, timeout=SEARCH_DELAY_MS * 10)
    assert pasta in chat_list.chat_ids()


def _editor(chat_list: ChatList) -> QLineEdit:
    editors = [w for w in chat_list.list.viewport().findChildren(QLineEdit) if w.isVisible()]
    assert len(editors) == 1
    return editors[0]


def test_rename_with_f2_inline(make_list, store, qtbot):
    chat = store.new_chat("Untitled")
    chat_list = make_list()
    chat_list.refresh(select_id=chat)
    chat_list.list.setFocus()
    qtbot.keyClick(chat_list.list, Qt.Key.Key_F2)
    assert chat_list.list.state() == QAbstractItemView.State.EditingState
    editor = _editor(chat_list)
    editor.selectAll()
    qtbot.keyClicks(editor, "  Speculative   decoding notes ")
    # A refresh while the user types (the window updating the list) must not lose the edit.
    chat_list.refresh()
    assert chat_list.list.state() == QAbstractItemView.State.EditingState
    qtbot.keyClick(editor, Qt.Key.Key_Return)  # Qt commits the edit queued
    qtbot.waitUntil(lambda: store.chat(chat).title == "Speculative decoding notes")
    qtbot.waitUntil(lambda: titles(chat_list) == ["Speculative decoding notes"])
    assert chat_list.current_chat_id() == chat


def test_rename_to_blank_reverts(make_list, store, qtbot):
    chat = store.new_chat("Keep me")
    chat_list = make_list()
    errors = []
    chat_list.errorOccurred.connect(errors.append)
    menu = chat_list.context_menu(chat_list.list.item(0))
    assert [a.text() for a in menu.actions() if a.text()] == ["Rename\tF2", "Delete…\tDel", "New chat"]
    menu.actions()[0].trigger()
    editor = _editor(chat_list)
    editor.selectAll()
    qtbot.keyClick(editor, Qt.Key.Key_Delete)
    qtbot.keyClick(editor, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: chat_list.list.state() != QAbstractItemView.State.EditingState)
    assert store.chat(chat).title == "Keep me" and titles(chat_list) == ["Keep me"]
    assert errors == []  # a blank title just reverts


def test_delete_asks_first_and_moves_to_the_neighbour(make_list, store, qtbot, monkeypatch):
    first, second = store.new_chat("first"), store.new_chat("second")
    store.add_message(second, "user", "to be deleted")
    third = store.new_chat("third")
    chat_list = make_list()  # newest first: third, second, first
    chat_list.refresh(select_id=second)
    asked = []
    monkeypatch.setattr(chat_list, "confirm_delete", lambda title: asked.append(title) or False)
    chat_list.list.setFocus()
    qtbot.keyClick(chat_list.list, Qt.Key.Key_Delete)
    assert asked == ["second"] and store.chat(second) is not None  # cancelled: nothing lost

    monkeypatch.setattr(chat_list, "confirm_delete", lambda title: True)
    events = []
    chat_list.chatDeleted.connect(lambda cid: events.append(("deleted", cid)))
    chat_list.chatSelected.connect(lambda cid: events.append(("selected", cid)))
    qtbot.keyClick(chat_list.list, Qt.Key.Key_Delete)
    assert store.chat(second) is None and store.messages(second) == []
    assert events == [("deleted", second), ("selected", first)]
    assert titles(chat_list) == ["third", "first"] and chat_list.current_chat_id() == first

    # Deleting another chat from its menu keeps the current one, silently.
    events.clear()
    chat_list.context_menu(chat_list.list.item(0)).actions()[1].trigger()
    assert events == [("deleted", third)] and chat_list.current_chat_id() == first
    chat_list.delete_current()
    assert events[-1] == ("deleted", first) and chat_list.list.count() == 0
    assert chat_list.empty_label.isVisible()


def test_keys_in_the_search_box_do_not_delete_chats(make_list, store, qtbot, monkeypatch):
    chat = store.new_chat("precious")
    chat_list = make_list()
    chat_list.refresh(select_id=chat)
    monkeypatch.setattr(chat_list, "confirm_delete", lambda title: True)
    chat_list.search.setFocus()
    qtbot.keyClicks(chat_list.search, "ab")
    qtbot.keyClick(chat_list.search, Qt.Key.Key_Delete)
    qtbot.keyClick(chat_list.search, Qt.Key.Key_F2)
    assert store.chat(chat) is not None
    assert chat_list.list.state() != QAbstractItemView.State.EditingState
    assert chat_list.search.text() == "ab"  # the keys went to the search box


def test_rows_show_an_elided_title_and_the_relative_time(make_list, store, qtbot, tmp_path):
    long_title = "A chat with a rather long title that will not fit in the narrow list at all"
    store.new_chat(long_title)
    store.new_chat("Short")
    chat_list = make_list()
    chat_list.resize(240, 200)
    qtbot.wait(10)
    delegate = chat_list.list.itemDelegate()
    option = QStyleOptionViewItem()
    option.initFrom(chat_list.list)
    option.rect = chat_list.list.visualItemRect(chat_list.list.item(1))
    rect, shown, when = delegate.layout_texts(option, long_title, store.chats()[1].updated)
    assert when == "just now"
    assert shown.endswith("…") and long_title.startswith(shown[:-1]) and rect.right() < option.rect.right()
    assert delegate.layout_texts(option, "Short", store.chats()[0].updated)[1] == "Short"
    image = chat_list.grab().toImage()
    assert not image.isNull()
    chat_list.grab().save(str(tmp_path / "chat-list.png"))


def test_a_row_with_an_impossible_time_is_shown_not_fatal(tmp_path, qtbot):
    """A history row with `updated = 1e308` aborted the window at start (OverflowError in
    time.localtime under Qt, exit 134). The chat is listed with its title and a time it can show."""
    import sqlite3

    path = tmp_path / "history.sqlite3"
    with HistoryStore(path) as store:
        store.new_chat("Far future")
        store.new_chat("Normal")
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("UPDATE chats SET updated = 1e308 WHERE title = 'Far future'")
    db.close()
    with HistoryStore(path) as store:
        chat_list = ChatList(store)
        qtbot.addWidget(chat_list)
        chat_list.resize(300, 400)
        chat_list.show()
        qtbot.waitExposed(chat_list)
        chat_list.grab()  # paints every row's relative time
        assert sorted(titles(chat_list)) == ["Far future", "Normal"]
        assert all("last active" in chat_list.list.item(i).toolTip() for i in range(chat_list.list.count()))
    # The window's own formatting never raises either, whatever a row holds.
    option = QStyleOptionViewItem()
    option.initFrom(chat_list.list)
    for odd in (1e308, float("inf"), float("nan"), -1e308):
        assert isinstance(chat_list.list.itemDelegate().layout_texts(option, "x", odd)[2], str)
