"""The chat history store on real SQLite files: round trip, search, edits, crashes, corruption."""

from __future__ import annotations

import logging
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from app.ui.chat.history import ChatRow, HistoryError, HistoryStore, MessageRow, title_from

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def store(tmp_path):
    with HistoryStore(tmp_path / "data" / "history.sqlite3") as s:
        yield s


def test_round_trip_survives_reopen(tmp_path):
    path = tmp_path / "nested" / "folder" / "history.sqlite3"
    store = HistoryStore(path)  # creates the folders
    chat = store.new_chat("Rewrite a function", system_prompt="Be terse.", settings={"temp": 0.2})
    user = store.add_message(chat, "user", "def f(a): return a+1")
    reply = store.add_message(chat, "assistant", complete=False)
    stats = {"decode_tps": 42.1, "n_drafted": 10, "n_accepted": 7, "stop_reason": "eos"}
    store.update_message(reply, "def f(a):\n    return a + 1", draft_spans=[(0, 9), (14, 20)],
                         stats=stats, complete=True)
    store.close()

    store = HistoryStore(path)
    [row] = store.chats()
    assert (row.id, row.title, row.n_messages) == (chat, "Rewrite a function", 2)
    assert store.chat(chat) == row
    assert store.system_prompt(chat) == "Be terse."
    assert store.chat_settings(chat) == {"temp": 0.2}
    first, second = store.messages(chat)
    assert first == MessageRow(user, chat, "user", "def f(a): return a+1", (), None, True, first.created)
    assert second.role == "assistant" and second.complete
    assert second.content == "def f(a):\n    return a + 1"
    assert second.draft_spans == ((0, 9), (14, 20))
    assert second.stats == stats
    store.close()


def test_update_keeps_fields_it_is_not_given(store):
    chat = store.new_chat()
    msg = store.add_message(chat, "assistant", "a", complete=False)
    store.update_message(msg, "ab", draft_spans=[(0, 1)], stats={"x": 1})
    store.update_message(msg, "abc")  # a streamed delta: only the text changes
    [row] = store.messages(chat)
    assert (row.content, row.draft_spans, row.stats, row.complete) == ("abc", ((0, 1),), {"x": 1}, False)
    store.update_message(msg, "abc", complete=True)
    assert store.messages(chat)[0].complete


def test_chats_newest_first_and_search_title_and_text(store):
    cooking = store.new_chat("Cooking pasta")
    code = store.new_chat("Python help")
    store.add_message(code, "user", "How do I reverse a LIST in Python?")
    greek = store.new_chat("Ελληνικά")
    store.add_message(greek, "assistant", "Καλημέρα ΚΌΣΜΕ")
    store.add_message(cooking, "user", "salt the water")  # the newest activity now

    assert [c.id for c in store.chats()] == [cooking, greek, code]
    assert [c.id for c in store.chats("list")] == [code]  # message text, any case
    assert [c.id for c in store.chats("  PASTA ")] == [cooking]  # title, trimmed
    assert [c.id for c in store.chats("κόσμε")] == [greek]  # non-ASCII case folding
    assert store.chats("100%") == [] and store.chats("_") == []  # no LIKE wildcards
    assert {c.id for c in store.chats("a")} == {cooking, greek, code} - {greek}


def test_rename_delete_and_settings(store):
    a, b = store.new_chat("one"), store.new_chat("two")
    store.add_message(a, "user", "hello")
    store.rename_chat(a, "  first   chat ")
    assert store.chat(a).title == "first chat"
    with pytest.raises(HistoryError, match="cannot be empty"):
        store.rename_chat(a, "   ")
    with pytest.raises(HistoryError, match="no chat 999"):
        store.rename_chat(999, "x")
    store.set_system_prompt(b, "You are a pirate.")
    store.set_chat_settings(b, {"draft": "lookup", "temp": 0.0})
    assert store.system_prompt(b) == "You are a pirate."
    assert store.chat_settings(b) == {"draft": "lookup", "temp": 0.0}

    store.delete_chat(a)
    assert store.chat(a) is None and store.messages(a) == []
    assert [c.id for c in store.chats()] == [b]
    store.delete_chat(a)  # already gone: no error
    with pytest.raises(HistoryError, match="no chat"):
        store.add_message(a, "user", "lost?")
    with pytest.raises(HistoryError, match="role"):
        store.add_message(b, "robot", "beep")
    with pytest.raises(HistoryError, match="no message"):
        store.update_message(123456, "x")


def test_delete_from_removes_that_message_and_later_ones(store):
    chat, other = store.new_chat(), store.new_chat()
    ids = [store.add_message(chat, role, f"m{i}") for i, role in
           enumerate(["user", "assistant", "user", "assistant"])]
    keep = store.add_message(other, "user", "other chat")
    store.delete_from(chat, keep)  # another chat's message: nothing of this chat goes
    assert len(store.messages(chat)) == 4
    store.delete_from(chat, ids[2])  # edit-and-resend of the second question
    assert [m.content for m in store.messages(chat)] == ["m0", "m1"]
    assert [m.id for m in store.messages(other)] == [keep]
    assert store.chat(chat).n_messages == 2


def test_title_from():
    assert title_from("  \n  Hello   world \nsecond line") == "Hello world"
    assert title_from("") == "New chat" and title_from(" \n\t") == "New chat"
    long = title_from("Explain how speculative decoding verifies many drafted tokens at once")
    assert long.endswith("…") and len(long) <= 41
    assert long == "Explain how speculative decoding…"
    assert title_from("x" * 100) == "x" * 40 + "…"


def test_many_streamed_updates_are_fast(store):
    chat = store.new_chat()
    msg = store.add_message(chat, "assistant", complete=False)
    reply = ""
    t0 = time.perf_counter()
    for i in range(1000):
        reply += "word" if i % 2 else "abc "  # grows to 4 kB
        store.update_message(msg, reply, draft_spans=[(0, len(reply) // 2)])
    elapsed = time.perf_counter() - t0
    assert len(reply) == 4000 and store.messages(chat)[0].content == reply
    assert elapsed < 1.0, f"1000 updates took {elapsed:.2f} s"


_CHILD = textwrap.dedent("""
    import sys
    from pathlib import Path
    from app.ui.chat.history import HistoryStore
    store = HistoryStore(Path(sys.argv[1]))
    chat = store.new_chat("crash test")
    store.add_message(chat, "user", "tell me a story")
    reply = store.add_message(chat, "assistant", complete=False)
    k = 0
    while True:  # stream until killed, reporting each committed delta
        k += 1
        store.update_message(reply, "word " * k, draft_spans=[(0, 5)])
        print(k, flush=True)
""")


def test_partial_reply_survives_sigkill(tmp_path):
    path = tmp_path / "history.sqlite3"
    child = subprocess.Popen([sys.executable, "-c", _CHILD, str(path)], cwd=ROOT,
                             stdout=subprocess.PIPE, text=True)
    try:
        committed = 0
        while committed < 200:
            line = child.stdout.readline()
            assert line, "the writer died before streaming"
            committed = int(line)
        os.kill(child.pid, signal.SIGKILL)  # mid-stream, no close(), no checkpoint
    finally:
        child.kill()
        child.wait(timeout=30)
        child.stdout.close()
    assert child.returncode == -signal.SIGKILL

    with HistoryStore(path) as store:
        [chat] = store.chats()
        user, reply = store.messages(chat.id)
        assert user.content == "tell me a story" and user.complete
        assert not reply.complete  # the UI can mark it as interrupted
        n_words = reply.content.count("word ")
        assert reply.content == "word " * n_words and n_words >= committed
        assert reply.draft_spans == ((0, 5),)


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_corrupt_file_is_moved_aside_and_a_new_history_starts(tmp_path, caplog, damage):
    path = tmp_path / "history.sqlite3"
    if damage == "garbage":
        path.write_bytes(b"this is not a database at all\n" * 200)
    else:
        with HistoryStore(path) as store:
            chat = store.new_chat("doomed")
            for i in range(300):
                store.add_message(chat, "user", f"message {i} " * 50)
        data = path.read_bytes()
        path.write_bytes(data[:100] + b"\xff" * 4000 + data[4100 : len(data) // 2])
    original = path.read_bytes()

    with caplog.at_level(logging.WARNING, logger="app.ui.chat.history"):
        store = HistoryStore(path)
    assert "moved it to history.sqlite3.corrupt-" in caplog.text
    [aside] = tmp_path.glob("history.sqlite3.corrupt-*[0-9]")
    assert aside.read_bytes() == original  # kept for the user, byte for byte
    assert store.chats() == []
    chat = store.new_chat("fresh start")
    store.add_message(chat, "user", "works")
    store.close()
    with HistoryStore(path) as again:
        assert [c.title for c in again.chats()] == ["fresh start"]


def test_newer_schema_is_refused_not_moved(tmp_path):
    path = tmp_path / "history.sqlite3"
    HistoryStore(path).close()
    with sqlite3.connect(path) as db:
        db.execute("INSERT INTO schema_version (version) VALUES (99)")
    db.close()
    with pytest.raises(HistoryError, match="newer Specula"):
        HistoryStore(path)
    assert path.exists() and not list(tmp_path.glob("*.corrupt-*"))


def test_chat_row_is_frozen(store):
    row = store.chat(store.new_chat())
    assert isinstance(row, ChatRow)
    with pytest.raises(AttributeError):
        row.title = "x"


def _raw(path):
    import sqlite3

    return sqlite3.connect(path, isolation_level=None)


def test_corrupt_values_cost_only_themselves(tmp_path):
    path = tmp_path / "history.sqlite3"
    with HistoryStore(path) as store:
        chat = store.new_chat("kept", settings={"temp": 0.5})
        good = store.add_message(chat, "user", "readable")
        bad_stats = store.add_message(chat, "assistant", "reply one")
        bad_spans = store.add_message(chat, "assistant", "reply two")
        backwards = store.add_message(chat, "assistant", "reply three")
        store.update_message(good, "readable", draft_spans=[(0, 4)], stats={"tokens": 3})
    db = _raw(path)
    db.execute("UPDATE messages SET stats = '{not json' WHERE id = ?", (bad_stats,))
    db.execute("UPDATE messages SET draft_spans = '\"nope\"', stats = '[1, 2]' WHERE id = ?", (bad_spans,))
    db.execute("UPDATE messages SET draft_spans = '[[5, 1]]' WHERE id = ?", (backwards,))
    db.execute("UPDATE chats SET settings = '{bad' WHERE id = ?", (chat,))
    db.close()
    with HistoryStore(path) as store:
        assert store.notice is None  # nothing read yet
        rows = store.messages(chat)
        assert [m.content for m in rows] == ["readable", "reply one", "reply two", "reply three"]
        assert rows[0].draft_spans == ((0, 4),) and rows[0].stats == {"tokens": 3}
        assert [m.stats for m in rows[1:]] == [None, None, None]
        assert [m.draft_spans for m in rows[1:]] == [(), (), ()]
        assert store.chat_settings(chat) == {}
        assert store.notice.startswith("History: ") and "\n" not in store.notice
        store.set_chat_settings(chat, {"temp": 0.7})  # and the chat is still writable
        assert store.chat_settings(chat) == {"temp": 0.7}


def test_rows_another_program_wrote_are_left_out_not_raised(tmp_path):
    # Tables with our columns but none of our constraints, as a hostile or foreign file may have.
    path = tmp_path / "history.sqlite3"
    db = _raw(path)
    db.executescript("""
        CREATE TABLE schema_version (version);
        CREATE TABLE chats (id, title, created, updated, system_prompt, settings);
        CREATE TABLE messages (id INTEGER PRIMARY KEY, chat_id, role, content, draft_spans, stats, complete, created);
        INSERT INTO schema_version VALUES (1);
        INSERT INTO chats VALUES (1, X'00ff', 'yesterday', 5.0, 42, NULL);
        INSERT INTO chats VALUES ('two', 'text id', 1.0, 1.0, '', '{}');
        INSERT INTO messages VALUES (1, 1, 'user', 'fine', '[]', NULL, 1, 1.0);
        INSERT INTO messages VALUES (2, 1, 'evil', 'bad role', '[]', NULL, 1, 1.0);
        INSERT INTO messages VALUES (3, 1, 'assistant', X'00', '[]', NULL, 1, 1.0);
        INSERT INTO messages VALUES (4, 1, 'assistant', 'also fine', '[[0, 1e400]]', '{}', 'yes', 'noon');
    """)
    db.close()
    with HistoryStore(path) as store:
        [chat] = store.chats()
        assert (chat.id, chat.title, chat.created) == (1, "New chat", 0.0)
        assert store.system_prompt(1) == ""
        assert [m.content for m in store.messages(1)] == ["fine", "also fine"]
        assert store.notice is not None


def test_a_schema_version_that_is_not_a_number_does_not_stop_the_app(tmp_path, caplog):
    path = tmp_path / "history.sqlite3"
    with HistoryStore(path) as store:
        store.new_chat("still here")
    db = _raw(path)
    db.execute("UPDATE schema_version SET version = 'x'")
    db.close()
    with caplog.at_level(logging.WARNING, logger="app.ui.chat.history"):
        store = HistoryStore(path)
    assert [c.title for c in store.chats()] == ["still here"]
    assert "schema version" in store.notice and "schema version" in caplog.text
    store.close()
    with HistoryStore(path) as again:  # repaired: no message the second time
        assert again.notice is None


def test_tables_that_are_not_ours_are_moved_aside(tmp_path):
    path = tmp_path / "history.sqlite3"
    db = _raw(path)
    db.executescript("CREATE TABLE messages (id, body); INSERT INTO messages VALUES (1, 'x');")
    db.close()
    with HistoryStore(path) as store:
        assert store.chats() == []
        assert "moved it to history.sqlite3.corrupt-" in store.notice
    assert len(list(tmp_path.glob("history.sqlite3.corrupt-*"))) == 1


@pytest.mark.parametrize("stored", [1e308, float("inf"), -1e308, -5.0, 2**62, "yesterday", b"\x00"])
def test_a_time_no_calendar_can_show_reads_as_zero(tmp_path, stored):
    """`updated = 1e308` (or infinity, a negative time, text) read back as a time the window
    passed to time.localtime: OverflowError at start. Every stored time is clamped on reading."""
    path = tmp_path / "history.sqlite3"
    with HistoryStore(path) as store:
        chat = store.new_chat("odd times")
        store.add_message(chat, "user", "still here")
    db = _raw(path)
    db.execute("UPDATE chats SET updated = ?, created = ?", (stored, stored))
    db.execute("UPDATE messages SET created = ?", (stored,))
    db.close()
    with HistoryStore(path) as store:
        (row,) = store.chats()
        assert (row.title, row.created, row.updated, row.n_messages) == ("odd times", 0.0, 0.0, 1)
        (message,) = store.messages(chat)
        assert (message.content, message.created) == ("still here", 0.0)
        time.localtime(row.updated)  # what the window does with it
