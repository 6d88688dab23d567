"""A reply's versions in the history (Regenerate keeps the earlier ones, issue 43)."""

from __future__ import annotations

import sqlite3

from app.ui.chat.history import HistoryStore


def _reply(store: HistoryStore, chat: int) -> tuple:
    row = store.messages(chat)[-1]
    return row.content, row.version, row.n_versions


def test_versions_are_kept_switched_and_deleted_with_their_message(tmp_path):
    with HistoryStore(tmp_path / "h.sqlite3") as store:
        chat = store.new_chat()
        question = store.add_message(chat, "user", "q")
        reply = store.add_message(chat, "assistant", "one")
        store.update_message(reply, "one", draft_spans=[(0, 2)], stats={"decode_tps": 5.0}, complete=True)
        store.new_version(chat, reply)
        assert _reply(store, chat) == ("", 2, 2) and not store.messages(chat)[-1].complete
        store.update_message(reply, "two", complete=True)

        assert store.show_version(reply, 1) and _reply(store, chat) == ("one", 1, 2)
        first = store.messages(chat)[-1]
        assert first.draft_spans == ((0, 2),) and first.stats == {"decode_tps": 5.0}, "a version keeps its marks and stats"
        assert not store.show_version(reply, 3) and _reply(store, chat) == ("one", 1, 2)

        # A new version that fails before its first word gives way to the one shown before.
        store.show_version(reply, 2)
        store.new_version(chat, reply)
        store.discard_version(chat, reply)
        assert _reply(store, chat) == ("two", 2, 2)

        store.delete_from(chat, question)
        assert store.messages(chat) == []
    assert sqlite3.connect(tmp_path / "h.sqlite3").execute("SELECT COUNT(*) FROM reply_versions").fetchone() == (0,)


def test_a_new_version_replaces_the_later_conversation(tmp_path):
    with HistoryStore(tmp_path / "h.sqlite3") as store:
        chat = store.new_chat()
        store.add_message(chat, "user", "q1")
        reply = store.add_message(chat, "assistant", "a1")
        store.add_message(chat, "user", "q2")
        store.add_message(chat, "assistant", "a2")
        store.new_version(chat, reply)
        assert [(m.role, m.content, m.n_versions) for m in store.messages(chat)] == [
            ("user", "q1", 1), ("assistant", "", 2)]
        store.discard_version(chat, reply)
        assert [m.content for m in store.messages(chat)] == ["q1", "a1"]
