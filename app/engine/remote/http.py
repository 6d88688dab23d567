"""HTTP to a server the user named: JSON and text answers and server-sent event streams, each
with a size limit, UTF-8 checked, TLS verified, and every failure one line (a ServerError) that
never holds the API key (nor a password written into the URL)."""

from __future__ import annotations

import http.client
import json
import re
import ssl
import urllib.parse
from typing import Any, Callable, Iterator

from app.engine.errors import ServerError, quoted
from app.engine.remote.streams import cut_when_cancelled

MAX_ANSWER_BYTES = 16 * 1024 * 1024  # a model list, /props or /metrics
MAX_EVENT_BYTES = 4 * 1024 * 1024  # one streamed chunk: a token or a few
# Lines without data (comments, keep-alives, blank lines, other fields) in a row: a real server
# sends a keep-alive every few seconds at most, so this many means one that sends nothing forever.
MAX_IDLE_LINES = 10_000
MAX_IDLE_BYTES = 16 * 1024 * 1024
# What a key looks like in a remote's text: a bearer credential, an OpenAI-style secret key.
_KEY_SHAPES = re.compile(r"(?i)(bearer\s+)[^\s\"',;]+|\bsk-[A-Za-z0-9_\-]{6,}")


class HttpStatusError(ServerError):
    """The server answered, with an HTTP status other than 200."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class RemoteHttp:
    """Requests to `base_url` (http or https; its path is kept as a prefix), with a Bearer key."""

    def __init__(self, base_url: str, api_key: str | None = None, timeout_s: float = 600.0) -> None:
        parts = urllib.parse.urlsplit(base_url)
        try:
            parts.port  # raises on a port that is not a number in range
        except ValueError:
            parts = parts._replace(scheme="")
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ServerError(f"{_without_password(parts)!r} is not an http:// or https:// URL with a valid port")
        self._parts = parts
        self.shown_url = _without_password(parts)
        self._api_key = api_key
        self.timeout_s = timeout_s

    def get_json(self, path: str, timeout_s: float | None = None) -> Any:
        return loads_remote(self.get_bytes(path, timeout_s), self.where(path), quote=self.short)

    def get_text(self, path: str, timeout_s: float | None = None) -> str:
        raw = self.get_bytes(path, timeout_s)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ServerError(f"{self.where(path)}: the answer is not UTF-8 text") from None

    def post_json(self, path: str, body: dict, timeout_s: float | None = None) -> Any:
        """POST `body` as JSON and read the JSON answer (size-limited, UTF-8 checked)."""
        return loads_remote(self.get_bytes(path, timeout_s, body), self.where(path), quote=self.short)

    def get_bytes(self, path: str, timeout_s: float | None = None, body: dict | None = None) -> bytes:
        """The answer's bytes to a GET (or, with `body`, a POST of JSON)."""
        with self._open("POST" if body is not None else "GET", path, body, timeout_s, stream=False) as answer:
            try:
                raw = answer.read(MAX_ANSWER_BYTES + 1)
            except (OSError, http.client.HTTPException) as exc:  # a timeout, a chunk cut off
                raise ServerError(f"{self.where(path)}: the connection failed ({self.short(str(exc))})") from None
            if len(raw) > MAX_ANSWER_BYTES:  # before the length's check: this is why some is left
                raise ServerError(f"{self.where(path)}: the answer is larger than {MAX_ANSWER_BYTES >> 20} MiB")
            if answer.length:  # fewer bytes than its Content-Length said: the connection closed
                raise ServerError(f"{self.where(path)}: the answer was cut off after {len(raw)} bytes")
        return raw

    def stream_events(self, path: str, body: dict, cancelled: Callable[[], bool] | None = None) -> Iterator[Any]:
        """The JSON objects of a server-sent event stream, until `data: [DONE]`; a stream that
        ends without it is a ServerError (the connection was cut mid-reply)."""
        with self._open("POST", path, body, None, stream=True) as answer, cut_when_cancelled(answer.connection, cancelled) as watch:
            watch.sock = answer.sock
            events = EventLines(self.where(path), self.short)
            try:
                for line in iter(lambda: answer.readline(MAX_EVENT_BYTES + 1), b""):
                    event = events.take(line)
                    if event is DONE:
                        return
                    if event is not NOTHING:
                        yield event
                    if cancelled is not None and cancelled():
                        return
            except (OSError, http.client.HTTPException) as exc:
                if watch.fired:  # the user's Stop cut a read that waited on the server
                    return
                raise ServerError(f"{self.where(path)}: the connection failed mid-reply ({self.short(str(exc))})") from None
            if watch.fired:
                return
        raise ServerError(f"{self.where(path)}: the stream ended before the reply did")

    def where(self, path: str) -> str:
        return self.shown_url + path

    def short(self, raw: bytes | str, limit: int = 160) -> str:
        """Up to `limit` characters of a remote answer (its bytes, or text it sent: JSON may hold
        lone surrogates, which no encode takes), control characters escaped, keys hidden."""
        text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
        return quoted(self.redact(text), limit)

    def redact(self, text: str) -> str:
        """`text` without our key, the URL's password, or anything shaped like a key (a remote may
        echo a credential back, ours or another)."""
        for secret in (self._api_key, self._parts.password):
            if secret:
                text = text.replace(secret, "<key>")
        return _KEY_SHAPES.sub(lambda m: (m.group(1) or "") + "<key>", text)

    def _open(self, method: str, path: str, body: dict | None, timeout_s: float | None,
              stream: bool) -> "_Answer":
        """The answer to one request; anything but 200 is an HttpStatusError. A redirect is
        never followed: it would take the key to wherever the server points."""
        parts = self._parts
        timeout = self.timeout_s if timeout_s is None else timeout_s
        if parts.scheme == "https":  # verified against the system's CAs, host name checked
            connection = http.client.HTTPSConnection(parts.hostname, parts.port, timeout=timeout,
                                                     context=ssl.create_default_context())
        else:
            connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
        headers = {"Accept": "text/event-stream" if stream else "*/*"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        try:
            connection.request(method, parts.path.rstrip("/") + path,
                               None if body is None else json.dumps(body).encode(), headers)
            sock = connection.sock  # the response takes it over where it has no length
            answer = connection.getresponse()
            if 300 <= answer.status < 400:
                raise HttpStatusError(f"{self.where(path)}: HTTP {answer.status}: the server redirects elsewhere; "
                                      "Specula never follows a redirect with your key: give the URL it should use",
                                      answer.status)
            if answer.status != 200:
                raise HttpStatusError(f"{self.where(path)}: HTTP {answer.status} {self.short(answer.read(2048))}",
                                      answer.status)
        except ssl.SSLError as exc:
            connection.close()
            raise ServerError(f"{self.where(path)}: TLS failed ({exc.reason or exc})") from None
        except (OSError, http.client.HTTPException) as exc:
            connection.close()
            raise ServerError(f"{self.where(path)}: could not connect ({self.short(str(exc))})") from None
        except BaseException:
            connection.close()
            raise
        return _Answer(connection, answer, sock)


class _Answer:
    """An HTTP answer that closes its connection when its `with` block ends."""

    def __init__(self, connection: http.client.HTTPConnection, answer: http.client.HTTPResponse,
                 sock=None) -> None:
        self._connection, self._answer, self.sock = connection, answer, sock

    def __enter__(self) -> http.client.HTTPResponse:
        self._answer.connection, self._answer.sock = self._connection, self.sock  # for cut_when_cancelled
        return self._answer

    def __exit__(self, *exc) -> None:
        # The answer too: its file holds the socket open past the connection's close while
        # anything (a traceback) keeps it, and a server left streaming is what a bound must stop.
        self._answer.close()
        self._connection.close()


DONE = object()  # EventLines.take at `data: [DONE]`
NOTHING = object()  # EventLines.take at a line that carries no event


class EventLines:
    """A server-sent event stream's lines, one at a time, into the JSON objects they carry: no
    I/O here, so that every line a server may send can be tried on it alone (the fuzz tests)."""

    def __init__(self, where: str, quote: Callable[[bytes], str] | None = None) -> None:
        self.where = where
        self.quote = quote or quoted
        self.idle_lines = self.idle_bytes = 0

    def take(self, line: bytes) -> Any:
        """The object of a `data:` line; DONE at `data: [DONE]`; NOTHING for a comment, blank
        line or other field. ServerError for a line too long, an `error:` line, data that is not
        JSON, and a stream that has sent only lines without data for too long."""
        if len(line) > MAX_EVENT_BYTES:
            raise ServerError(f"{self.where}: a streamed chunk is larger than {MAX_EVENT_BYTES >> 20} MiB")
        line = line.strip()
        if line.startswith(b"error:"):  # llama-server's way of failing mid-stream
            raise ServerError(f"{self.where}: {self.quote(line[6:].strip())}")
        if not line.startswith(b"data:"):
            self._idle(len(line))
            return NOTHING
        self.idle_lines = self.idle_bytes = 0
        payload = line[5:].strip()
        if payload == b"[DONE]":
            return DONE
        return loads_remote(payload, self.where, "a streamed chunk", self.quote)

    def _idle(self, n_bytes: int) -> None:
        self.idle_lines += 1
        self.idle_bytes += n_bytes
        if self.idle_lines > MAX_IDLE_LINES or self.idle_bytes > MAX_IDLE_BYTES:
            raise ServerError(f"{self.where}: the server sent {self.idle_lines} lines without data in a row; "
                              "it sends no reply")


def loads_remote(raw: bytes, where: str, what: str = "the answer",
                 quote: Callable[[bytes], str] | None = None) -> Any:
    """The JSON value of a remote's bytes; anything else is one ServerError (RecursionError too:
    Python's parser recurses once per level, and 100,000 nested brackets fit in a few bytes)."""
    quote = quote or quoted
    try:
        return json.loads(raw.decode("utf-8"))
    except RecursionError:
        raise ServerError(f"{where}: {what} is not JSON we read: nested too deeply ({quote(raw[:40])})") from None
    except (UnicodeDecodeError, ValueError):
        raise ServerError(f"{where}: {what} is not JSON: {quote(raw)}") from None


def error_message(error: Any) -> str:
    """The text of a remote's error object (`{"message": ...}`, a text, or any JSON), unquoted:
    its JSON form is written only within the recursion limit (a deep one is just "an error")."""
    message = error.get("message") if isinstance(error, dict) else error
    if isinstance(message, str):
        return message
    try:
        return json.dumps(error)
    except (RecursionError, ValueError, TypeError):
        return "an error nested too deeply to show"


def _without_password(parts: urllib.parse.SplitResult) -> str:
    """The URL as shown in messages: scheme, host, port and path, never a user:password part."""
    host = parts.hostname or ""
    host = f"[{host}]" if ":" in host else host
    try:
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        port = ":?"
    return f"{parts.scheme}://{host}{port}{parts.path.rstrip('/')}"
