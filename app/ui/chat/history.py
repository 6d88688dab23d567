"""Chat history that is never lost: conversations in one SQLite file, saved as they stream.

It lives with the chat it serves (the window's conversations, their list and controller) but
holds no Qt, only the standard library's sqlite3, so tests use it alone. Every write is its own
committed transaction: a crash (even SIGKILL) right after `update_message` finds the text on
reopen. The database runs in WAL mode with synchronous=NORMAL: a commit then costs an append to
the WAL file and no fsync, which keeps a save per streamed delta cheap (about 50 µs); committed
data survives the process dying, and only an operating-system crash or power loss can cost the
last moments of a reply.

A file that is not a readable database (corrupt, truncated, not SQLite) is moved aside to
`<name>.corrupt-<timestamp>` with a warning, and a fresh history starts: the app never fails to
start because of its history, and the damaged file is kept for the user to rescue. Inside a
readable file, a value that cannot be read (stats, draft spans or settings that are not the JSON
we write, a message whose text or role is not one) costs only that value or that row: the rest is
shown, and one message (`HistoryStore.notice`) says what was left out, for the window to show.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterable, Sequence

from app.common.atomic import private_dir, private_file
from app.engine.errors import SpeculaError

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
_IN_USE = (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
ROLES = ("system", "user", "assistant")
DEFAULT_TITLE = "New chat"
TITLE_CHARS = 40

_SCHEMA = """
CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS chats (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    title TEXT NOT NULL,
    created REAL NOT NULL,
    updated REAL NOT NULL,
    system_prompt TEXT NOT NULL DEFAULT '',
    settings TEXT NOT NULL DEFAULT '{}'
);
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    chat_id INTEGER NOT NULL REFERENCES chats(id) ON DELETE CASCADE,
    role TEXT NOT NULL CHECK (role IN ('system', 'user', 'assistant')),
    content TEXT NOT NULL DEFAULT '',
    draft_spans TEXT NOT NULL DEFAULT '[]',
    stats TEXT,
    complete INTEGER NOT NULL DEFAULT 1,
    created REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS messages_by_chat ON messages (chat_id, id);
-- Regenerate keeps a reply's earlier versions: the message row holds the version shown (the one
-- the next turn's context uses), this table the others. Added beside schema 1: an older Specula
-- ignores it, and deleting a message deletes its versions with it.
CREATE TABLE IF NOT EXISTS reply_versions (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    message_id INTEGER NOT NULL REFERENCES messages(id) ON DELETE CASCADE,
    content TEXT NOT NULL DEFAULT '',
    draft_spans TEXT NOT NULL DEFAULT '[]',
    stats TEXT,
    complete INTEGER NOT NULL DEFAULT 1,
    created REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS reply_versions_by_message ON reply_versions (message_id, created);
"""


class HistoryError(SpeculaError):
    """The history cannot be read or written (missing chat, full disk, newer schema)."""


@dataclass(frozen=True)
class ChatRow:
    id: int
    title: str
    created: float  # time.time() seconds
    updated: float  # when a message was last added or written: the list is sorted by it
    n_messages: int


@dataclass(frozen=True)
class MessageRow:
    id: int
    chat_id: int
    role: str  # "system" | "user" | "assistant"
    content: str
    draft_spans: tuple[tuple[int, int], ...]  # [start, end) char ranges of accepted draft text
    stats: dict | None  # RunSummary.to_dict()-like numbers for the stats line
    complete: bool  # False while streaming, and after a crash mid-reply
    created: float
    version: int = 1  # which of the reply's versions this is (1 = the oldest), see regenerate
    n_versions: int = 1


def title_from(text: str) -> str:
    """A chat title from its first user message: the first non-blank line, about 40 chars."""
    line = next((ln for ln in text.splitlines() if ln.strip()), "")
    line = " ".join(line.split())
    if not line:
        return DEFAULT_TITLE
    if len(line) <= TITLE_CHARS:
        return line
    cut = line[:TITLE_CHARS]
    # Break at a word when one ends in the last third, so titles do not end mid-word.
    space = cut.rfind(" ")
    if space > TITLE_CHARS * 2 // 3:
        cut = cut[:space]
    return cut.rstrip(" ,.;:-") + "…"


def _folded_contains(haystack: str | None, needle: str) -> int:
    """Case-insensitive substring test for any script (SQLite's LIKE folds ASCII only)."""
    return int(haystack is not None and needle in haystack.casefold())


def _spans_to_json(spans: Iterable[Sequence[int]]) -> str:
    pairs = [[int(start), int(end)] for start, end in spans]
    return json.dumps(pairs, separators=(",", ":"))


def _spans_from_json(text: str) -> tuple[tuple[int, int], ...]:
    spans = tuple((int(start), int(end)) for start, end in json.loads(text or "[]"))
    if any(not 0 <= start <= end for start, end in spans):
        raise ValueError("draft spans out of order")
    return spans


def _dict_from_json(text: str | None) -> dict | None:
    if text is None:
        return None
    value = json.loads(text)
    if not isinstance(value, dict):
        raise ValueError(f"not a JSON object but {type(value).__name__}")
    return value


# What reading a row's stored JSON can raise when another program (or damage) wrote the value.
_BAD_VALUE = (ValueError, TypeError, OverflowError, RecursionError)


_COLUMNS = {
    "chats": {"id", "title", "created", "updated", "system_prompt", "settings"},
    "messages": {"id", "chat_id", "role", "content", "draft_spans", "stats", "complete", "created"},
    "reply_versions": {"id", "message_id", "content", "draft_spans", "stats", "complete", "created"},
}


def _check_columns(db: sqlite3.Connection) -> None:
    """Tables of these names that lack our columns were not written by Specula: the file is
    treated as unreadable (moved aside) rather than failing at every read."""
    for table, wanted in _COLUMNS.items():
        have = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
        if not wanted <= have:
            raise sqlite3.DatabaseError(f"table {table} lacks {', '.join(sorted(wanted - have))}")


# The last second (9999-12-31 UTC) that time.localtime and strftime can show on every platform.
_LATEST_TIME = 253402300799.0


def _number(value: Any) -> float:
    """A stored time; anything else (text, NaN, infinity, before 1970, past the year 9999) reads
    as 0, never an error: `updated = 1e308` made the window's list raise OverflowError at start."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return 0.0
    value = float(value)
    return value if 0.0 <= value <= _LATEST_TIME else 0.0


def _private_database(path: Path) -> None:
    """The history 0600 whatever the umask, before SQLite opens it: SQLite makes the -wal and
    -shm files with the database's own mode; those an earlier version made 0644 lose their
    group and other bits too. A failure here (a read-only folder) is left to SQLite to report."""
    try:
        private_file(path)
        for suffix in ("-wal", "-shm"):
            side = path.with_name(path.name + suffix)
            if side.is_file():
                private_file(side)
    except OSError as exc:
        log.debug("could not make %s private: %s", path, exc)


def _to_json(value: dict | None) -> str | None:
    # default=str: a stray non-JSON value (an enum, a Path) must not lose the message's text.
    return None if value is None else json.dumps(value, default=str, separators=(",", ":"))


class HistoryStore:
    """All chats and their messages, in one SQLite file. Safe to call from the GUI thread."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        # One connection shared under a lock: the window writes from its thread, and a worker
        # may read; sqlite3's own same-thread check would forbid that.
        self._lock = threading.RLock()
        self._problems: list[str] = []  # what was moved aside, repaired or left out, once each
        self._db = self._open()

    @property
    def notice(self) -> str | None:
        """One line for the user about what could not be read (None when everything could)."""
        if not self._problems:
            return None
        more = f" (and {len(self._problems) - 1} more)" if len(self._problems) > 1 else ""
        return f"History: {self._problems[0]}{more}"

    def _problem(self, message: str) -> None:
        if message not in self._problems:
            self._problems.append(message)
            log.warning("history %s: %s", self.path, message)

    # -- opening -------------------------------------------------------------------------

    def _open(self) -> sqlite3.Connection:
        try:
            private_dir(self.path.parent)
        except OSError as exc:
            raise HistoryError(f"cannot create the history folder {self.path.parent}: {exc.strerror}") from exc
        try:
            return self._connect()
        except sqlite3.DatabaseError as exc:
            if getattr(exc, "sqlite_errorcode", None) in _IN_USE:
                # Healthy but held by another process (a second Specula): never move it aside.
                raise HistoryError(f"the history {self.path} is in use by another program") from exc
            if not self.path.exists():
                raise HistoryError(f"cannot open the history {self.path}: {exc}") from exc
            aside = self._move_aside()
            self._problem(f"the file was unreadable ({exc}); moved it to {aside.name} and started a new one")
            try:
                return self._connect()
            except sqlite3.DatabaseError as again:
                raise HistoryError(f"cannot open the history {self.path}: {again}") from again

    def _connect(self) -> sqlite3.Connection:
        _private_database(self.path)
        # isolation_level=None: autocommit, so every statement outside BEGIN is committed at once.
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.execute("PRAGMA foreign_keys=ON")
            # quick_check reads every page header: it catches a damaged file now, at startup,
            # rather than at the first write in the middle of a reply.
            verdict = db.execute("PRAGMA quick_check").fetchone()[0]
            if verdict != "ok":
                raise sqlite3.DatabaseError(f"integrity check failed: {verdict}")
            db.executescript(_SCHEMA)
            _check_columns(db)
            self._check_version(db)
        except BaseException:
            db.close()
            raise
        db.create_function("folded_contains", 2, _folded_contains, deterministic=True)
        return db

    def _check_version(self, db: sqlite3.Connection) -> None:
        # Only integers are versions: a 'x' written there is damage, not a newer schema, so it is
        # dropped (the tables were just checked to be ours) instead of stopping the app.
        bad = db.execute("SELECT COUNT(*) FROM schema_version WHERE typeof(version) != 'integer'").fetchone()[0]
        if bad:
            db.execute("DELETE FROM schema_version WHERE typeof(version) != 'integer'")
            self._problem(f"its schema version was not a number; read as version {SCHEMA_VERSION}")
        row = db.execute("SELECT MAX(version) FROM schema_version").fetchone()
        if row[0] is None:
            db.execute("INSERT INTO schema_version (version) VALUES (?)", (SCHEMA_VERSION,))
        elif row[0] > SCHEMA_VERSION:
            # Not corrupt, just newer: keep it untouched rather than moving the user's chats aside.
            raise HistoryError(
                f"the history {self.path} was written by a newer Specula (schema {row[0]}, "
                f"this version reads {SCHEMA_VERSION}); update Specula to open it"
            )

    def _move_aside(self) -> Path:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        aside = self.path.with_name(f"{self.path.name}.corrupt-{stamp}")
        n = 1
        while aside.exists():
            n += 1
            aside = self.path.with_name(f"{self.path.name}.corrupt-{stamp}-{n}")
        try:
            self.path.replace(aside)
            for suffix in ("-wal", "-shm"):  # journal files belong to the damaged database
                journal = self.path.with_name(self.path.name + suffix)
                if journal.exists():
                    journal.replace(aside.with_name(aside.name + suffix))
        except OSError as exc:
            raise HistoryError(
                f"the history {self.path} is unreadable and cannot be moved aside: {exc.strerror}"
            ) from exc
        return aside

    # -- low-level helpers ---------------------------------------------------------------

    def _read(self, sql: str, args: Sequence[Any] | dict[str, Any] = ()) -> list[tuple]:
        with self._lock:
            try:
                return self._db.execute(sql, args).fetchall()
            except sqlite3.Error as exc:
                raise HistoryError(f"cannot read the history {self.path.name}: {exc}") from exc

    def _write(self, statements: Sequence[tuple[str, Sequence[Any] | dict[str, Any]]]) -> list[tuple[int, int]]:
        """Run statements as one committed transaction; (lastrowid, rowcount) of each."""
        with self._lock:
            try:
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    done = []
                    for sql, args in statements:
                        cursor = self._db.execute(sql, args)
                        done.append((cursor.lastrowid or 0, cursor.rowcount))
                    self._db.execute("COMMIT")
                except BaseException:
                    self._db.execute("ROLLBACK")
                    raise
            except sqlite3.Error as exc:
                raise HistoryError(f"cannot save to the history {self.path.name}: {exc}") from exc
            return done

    def _require_chat(self, chat_id: int) -> None:
        if not self._read("SELECT 1 FROM chats WHERE id = ?", (chat_id,)):
            raise HistoryError(f"there is no chat {chat_id} in the history")

    # -- chats ---------------------------------------------------------------------------

    def new_chat(self, title: str = DEFAULT_TITLE, system_prompt: str = "", settings: dict | None = None) -> int:
        now = time.time()
        [(chat_id, _)] = self._write([(
            "INSERT INTO chats (title, created, updated, system_prompt, settings) VALUES (?, ?, ?, ?, ?)",
            (" ".join(title.split()) or DEFAULT_TITLE, now, now, system_prompt, _to_json(settings or {})),
        )])
        return chat_id

    def chat(self, chat_id: int) -> ChatRow | None:
        rows = self._chat_rows(self._read(_CHAT_ROWS + " WHERE c.id = ?", (chat_id,)))
        return rows[0] if rows else None

    def _chat_rows(self, rows: list[tuple]) -> list[ChatRow]:
        """Rows as ChatRow; a title or time that is not what we write is replaced, an id that is
        not an integer leaves the row out (nothing could open it)."""
        out = []
        for chat_id, title, created, updated, n_messages in rows:
            if not isinstance(chat_id, int):
                self._problem(f"a chat with the id {chat_id!r} was left out")
                continue
            if not isinstance(title, str):
                self._problem(f"chat {chat_id} had no readable title")
                title = DEFAULT_TITLE
            created, updated = (_number(v) for v in (created, updated))
            out.append(ChatRow(chat_id, title, created, updated, n_messages))
        return out

    def chats(self, search: str = "") -> list[ChatRow]:
        """Newest first; `search` matches the title or any message's text, ignoring case."""
        needle = search.strip().casefold()
        if not needle:
            rows = self._read(_CHAT_ROWS + _NEWEST_FIRST)
        else:
            rows = self._read(
                _CHAT_ROWS
                + " WHERE folded_contains(c.title, :q) OR EXISTS (SELECT 1 FROM messages m"
                " WHERE m.chat_id = c.id AND folded_contains(m.content, :q))"
                + _NEWEST_FIRST,
                {"q": needle},
            )
        return self._chat_rows(rows)

    def rename_chat(self, chat_id: int, title: str) -> None:
        title = " ".join(title.split())
        if not title:
            raise HistoryError("a chat's title cannot be empty")
        self._require_chat(chat_id)
        self._write([("UPDATE chats SET title = ? WHERE id = ?", (title, chat_id))])

    def delete_chat(self, chat_id: int) -> None:
        """Delete the chat and its messages (deleting a chat that is gone already is no error)."""
        self._write([("DELETE FROM chats WHERE id = ?", (chat_id,))])

    def system_prompt(self, chat_id: int) -> str:
        rows = self._read("SELECT system_prompt FROM chats WHERE id = ?", (chat_id,))
        if not rows:
            raise HistoryError(f"there is no chat {chat_id} in the history")
        if not isinstance(rows[0][0], str):
            self._problem(f"chat {chat_id}'s system prompt was unreadable")
            return ""
        return rows[0][0]

    def set_system_prompt(self, chat_id: int, text: str) -> None:
        self._require_chat(chat_id)
        self._write([("UPDATE chats SET system_prompt = ? WHERE id = ?", (text, chat_id))])

    def chat_settings(self, chat_id: int) -> dict:
        rows = self._read("SELECT settings FROM chats WHERE id = ?", (chat_id,))
        if not rows:
            raise HistoryError(f"there is no chat {chat_id} in the history")
        try:
            return _dict_from_json(rows[0][0] or "{}") or {}
        except _BAD_VALUE:
            self._problem(f"chat {chat_id}'s settings were unreadable; defaults used")
            return {}

    def set_chat_settings(self, chat_id: int, settings: dict) -> None:
        self._require_chat(chat_id)
        self._write([("UPDATE chats SET settings = ? WHERE id = ?", (_to_json(settings), chat_id))])

    # -- messages ------------------------------------------------------------------------

    def messages(self, chat_id: int) -> list[MessageRow]:
        """The chat's messages in the order they were added (an unknown chat has none)."""
        rows = self._read(
            "SELECT id, chat_id, role, content, draft_spans, stats, complete, created"
            " FROM messages WHERE chat_id = ? ORDER BY id",
            (chat_id,),
        )
        messages = [message for row in rows if (message := self._message(row)) is not None]
        return self._with_versions(chat_id, messages)

    def _message(self, row: tuple) -> MessageRow | None:
        """A row as MessageRow: unreadable spans or stats are dropped (the text is what matters);
        a row without a readable text, role or id is left out."""
        message_id, chat_id, role, content, spans, stats, complete, created = row
        if not isinstance(message_id, int) or role not in ROLES or not isinstance(content, str):
            self._problem(f"an unreadable message of chat {chat_id} was left out")
            return None
        try:
            draft_spans = _spans_from_json(spans) if isinstance(spans, str) else ()
        except _BAD_VALUE:
            self._problem(f"message {message_id}'s draft marks were unreadable")
            draft_spans = ()
        try:
            stats_value = _dict_from_json(stats) if isinstance(stats, str) or stats is None else None
        except _BAD_VALUE:
            self._problem(f"message {message_id}'s stats were unreadable")
            stats_value = None
        return MessageRow(id=message_id, chat_id=chat_id, role=role, content=content,
                          draft_spans=draft_spans, stats=stats_value,
                          complete=bool(complete) if isinstance(complete, int) else True,
                          created=_number(created))

    def add_message(self, chat_id: int, role: str, content: str = "", complete: bool = True) -> int:
        if role not in ROLES:
            raise HistoryError(f"a message's role must be one of {', '.join(ROLES)}, not {role!r}")
        self._require_chat(chat_id)
        now = time.time()
        (message_id, _), _ = self._write([
            ("INSERT INTO messages (chat_id, role, content, complete, created) VALUES (?, ?, ?, ?, ?)",
             (chat_id, role, content, int(complete), now)),
            ("UPDATE chats SET updated = ? WHERE id = ?", (now, chat_id)),
        ])
        return message_id

    def update_message(
        self,
        message_id: int,
        content: str,
        *,
        draft_spans: Iterable[Sequence[int]] | None = None,
        stats: dict | None = None,
        complete: bool | None = None,
    ) -> None:
        """Replace the message's text (and, when given, its spans, stats and completeness)."""
        sets, args = ["content = ?"], [content]
        if draft_spans is not None:
            sets.append("draft_spans = ?")
            args.append(_spans_to_json(draft_spans))
        if stats is not None:
            sets.append("stats = ?")
            args.append(_to_json(stats))
        if complete is not None:
            sets.append("complete = ?")
            args.append(int(complete))
        (_, n_updated), _ = self._write([
            (f"UPDATE messages SET {', '.join(sets)} WHERE id = ?", (*args, message_id)),
            ("UPDATE chats SET updated = ? WHERE id = (SELECT chat_id FROM messages WHERE id = ?)",
             (time.time(), message_id)),
        ])
        if n_updated == 0:
            raise HistoryError(f"there is no message {message_id} in the history")

    def delete_from(self, chat_id: int, message_id: int) -> None:
        """Delete that message and every later one of the chat (regenerate, edit and resend)."""
        # Only when the message is this chat's: a stale id must not cut another conversation.
        self._write([(
            "DELETE FROM messages WHERE chat_id = :chat AND id >= "
            "(SELECT id FROM messages WHERE id = :message AND chat_id = :chat)",
            {"chat": chat_id, "message": message_id},
        )])

    # -- reply versions (regenerate keeps the earlier ones) -------------------------------

    def new_version(self, chat_id: int, message_id: int) -> None:
        """Start a new version of a reply: the shown one is kept among its versions, the row is
        emptied (incomplete) for the new one to stream into, and every later message of the chat
        is deleted, as the new reply replaces the conversation from there."""
        rows = self._read("SELECT role FROM messages WHERE id = ? AND chat_id = ?", (message_id, chat_id))
        if not rows or rows[0][0] != "assistant":
            raise HistoryError(f"there is no reply {message_id} in chat {chat_id}")
        now = time.time()
        self._write([
            (_ARCHIVE_SHOWN, {"message": message_id}),
            ("DELETE FROM messages WHERE chat_id = ? AND id > ?", (chat_id, message_id)),
            ("UPDATE messages SET content = '', draft_spans = '[]', stats = NULL, complete = 0, created = ?"
             " WHERE id = ?", (now, message_id)),
            ("UPDATE chats SET updated = ? WHERE id = ?", (now, chat_id)),
        ])

    def show_version(self, message_id: int, version: int) -> bool:
        """Show the reply's `version` (1 = the oldest); False when it has no such version."""
        order = self._version_order(message_id)
        if not 1 <= version <= len(order):
            return False
        chosen = order[version - 1]
        if chosen is not None:  # None: the shown one
            self._swap_in(message_id, chosen)
        return True

    def discard_version(self, chat_id: int, message_id: int) -> None:
        """A new version that wrote nothing (it failed at once): show the newest earlier version
        again, or, for a reply without one, delete it as if it had never started."""
        order = [v for v in self._version_order(message_id) if v is not None]
        if not order:
            self.delete_from(chat_id, message_id)
            return
        self._swap_in(message_id, order[-1], keep_shown=False)

    def _swap_in(self, message_id: int, version_id: int, keep_shown: bool = True) -> None:
        """The row shows that stored version; the one it showed is stored in its place (or
        dropped, when not `keep_shown`)."""
        keep = [(_ARCHIVE_SHOWN, {"message": message_id})] if keep_shown else []
        self._write([
            *keep,
            ("UPDATE messages SET (content, draft_spans, stats, complete, created) ="
             " (SELECT content, draft_spans, stats, complete, created FROM reply_versions WHERE id = :v)"
             " WHERE id = :message AND EXISTS (SELECT 1 FROM reply_versions WHERE id = :v AND message_id = :message)",
             {"v": version_id, "message": message_id}),
            ("DELETE FROM reply_versions WHERE id = ? AND message_id = ?", (version_id, message_id)),
        ])

    def _version_order(self, message_id: int) -> list[int | None]:
        """The reply's versions oldest first: stored ones by their id, the shown one as None."""
        shown = self._read("SELECT created FROM messages WHERE id = ?", (message_id,))
        if not shown:
            return []
        stored = self._read("SELECT id, created FROM reply_versions WHERE message_id = ?", (message_id,))
        return _oldest_first(shown[0][0], stored)

    def _with_versions(self, chat_id: int, messages: list[MessageRow]) -> list[MessageRow]:
        """Each reply's place among its versions (one query for the whole chat)."""
        stored = self._read(
            "SELECT v.message_id, v.id, v.created FROM reply_versions v"
            " JOIN messages m ON m.id = v.message_id WHERE m.chat_id = ?",
            (chat_id,),
        )
        by_message: dict[int, list[tuple[int, Any]]] = {}
        for message_id, version_id, created in stored:
            by_message.setdefault(message_id, []).append((version_id, created))
        out = []
        for message in messages:
            if message.id in by_message:
                order = _oldest_first(message.created, by_message[message.id])
                message = replace(message, version=order.index(None) + 1, n_versions=len(order))
            out.append(message)
        return out

    def close(self) -> None:
        with self._lock:
            try:
                # Fold the WAL back into the main file so a copied history is one whole file.
                self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            except sqlite3.Error as exc:
                log.warning("history checkpoint failed: %s", exc)
            self._db.close()

    def __enter__(self) -> HistoryStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


_CHAT_ROWS = (
    "SELECT c.id, c.title, c.created, c.updated,"
    " (SELECT COUNT(*) FROM messages m WHERE m.chat_id = c.id) FROM chats c"
)
_NEWEST_FIRST = " ORDER BY c.updated DESC, c.id DESC"


def _oldest_first(shown_created: Any, stored: Sequence[tuple[int, Any]]) -> list[int | None]:
    """Version ids oldest first, the shown version as None (on a tie it counts as the older)."""
    keyed = [(_number(created), version_id, version_id) for version_id, created in stored]
    keyed.append((_number(shown_created), 0, None))
    return [version for *_, version in sorted(keyed, key=lambda k: (k[0], k[1]))]


# Keep the version a reply shows among its stored versions.
_ARCHIVE_SHOWN = (
    "INSERT INTO reply_versions (message_id, content, draft_spans, stats, complete, created)"
    " SELECT id, content, draft_spans, stats, complete, created FROM messages WHERE id = :message"
)
