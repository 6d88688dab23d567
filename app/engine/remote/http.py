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

from app.engine.errors import ServerError
from app.engine.streams import cut_when_cancelled

MAX_ANSWER_BYTES = 16 * 1024 * 1024  # a model list, /props or /metrics
MAX_EVENT_BYTES = 4 * 1024 * 1024  # one streamed chunk: a token or a few
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
        raw = self.get_bytes(path, timeout_s)
        try:
            return json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            raise ServerError(f"{self.where(path)}: the answer is not JSON: {self.short(raw)}") from None

    def get_text(self, path: str, timeout_s: float | None = None) -> str:
        raw = self.get_bytes(path, timeout_s)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ServerError(f"{self.where(path)}: the answer is not UTF-8 text") from None

    def post_json(self, path: str, body: dict, timeout_s: float | None = None) -> Any:
        """POST `body` as JSON and read the JSON answer (size-limited, UTF-8 checked)."""
        raw = self.get_bytes(path, timeout_s, body)
        try:
            return json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            raise ServerError(f"{self.where(path)}: the answer is not JSON: {self.short(raw)}") from None

    def get_bytes(self, path: str, timeout_s: float | None = None, body: dict | None = None) -> bytes:
        """The answer's bytes to a GET (or, with `body`, a POST of JSON)."""
        with self._open("POST" if body is not None else "GET", path, body, timeout_s, stream=False) as answer:
            try:
                raw = answer.read(MAX_ANSWER_BYTES + 1)
            except (OSError, http.client.HTTPException) as exc:  # a timeout, a chunk cut off
                raise ServerError(f"{self.where(path)}: the connection failed ({self.short(str(exc).encode())})") from None
            if answer.length:  # fewer bytes than its Content-Length said: the connection closed
                raise ServerError(f"{self.where(path)}: the answer was cut off after {len(raw)} bytes")
        if len(raw) > MAX_ANSWER_BYTES:
            raise ServerError(f"{self.where(path)}: the answer is larger than {MAX_ANSWER_BYTES >> 20} MiB")
        return raw

    def stream_events(self, path: str, body: dict, cancelled: Callable[[], bool] | None = None) -> Iterator[Any]:
        """The JSON objects of a server-sent event stream, until `data: [DONE]`; a stream that
        ends without it is a ServerError (the connection was cut mid-reply)."""
        with self._open("POST", path, body, None, stream=True) as answer, cut_when_cancelled(answer.connection, cancelled) as watch:
            watch.sock = answer.sock
            try:
                for line in iter(lambda: answer.readline(MAX_EVENT_BYTES + 1), b""):
                    if len(line) > MAX_EVENT_BYTES:
                        raise ServerError(f"{self.where(path)}: a streamed chunk is larger than "
                                          f"{MAX_EVENT_BYTES >> 20} MiB")
                    line = line.strip()
                    if line.startswith(b"error:"):  # llama-server's way of failing mid-stream
                        raise ServerError(f"{self.where(path)}: {self.short(line[6:].strip())}")
                    payload = _data_of(line)
                    if payload == b"[DONE]":
                        return
                    if payload is not None:
                        yield self._json_event(path, payload)
                    if cancelled is not None and cancelled():
                        return
            except (OSError, http.client.HTTPException) as exc:
                if watch.fired:  # the user's Stop cut a read that waited on the server
                    return
                raise ServerError(f"{self.where(path)}: the connection failed mid-reply ({self.short(str(exc).encode())})") from None
            if watch.fired:
                return
        raise ServerError(f"{self.where(path)}: the stream ended before the reply did")

    def where(self, path: str) -> str:
        return self.shown_url + path

    def short(self, raw: bytes, limit: int = 160) -> str:
        """Up to `limit` characters of a remote answer, control characters escaped, keys hidden."""
        text = self.redact(raw.decode("utf-8", "replace"))
        text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
        return text[:limit] + ("..." if len(text) > limit else "")

    def redact(self, text: str) -> str:
        """`text` without our key, the URL's password, or anything shaped like a key (a remote may
        echo a credential back, ours or another)."""
        for secret in (self._api_key, self._parts.password):
            if secret:
                text = text.replace(secret, "<key>")
        return _KEY_SHAPES.sub(lambda m: (m.group(1) or "") + "<key>", text)

    def _json_event(self, path: str, payload: bytes) -> Any:
        try:
            return json.loads(payload.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            raise ServerError(f"{self.where(path)}: a streamed chunk is not JSON: {self.short(payload)}") from None

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
            raise ServerError(f"{self.where(path)}: could not connect ({self.short(str(exc).encode())})") from None
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
        self._connection.close()


def _data_of(line: bytes) -> bytes | None:
    """The payload of an event stream's `data:` line; None for comments, blank and other fields."""
    return line[5:].strip() if line.startswith(b"data:") else None


def _without_password(parts: urllib.parse.SplitResult) -> str:
    """The URL as shown in messages: scheme, host, port and path, never a user:password part."""
    host = parts.hostname or ""
    host = f"[{host}]" if ":" in host else host
    try:
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        port = ":?"
    return f"{parts.scheme}://{host}{port}{parts.path.rstrip('/')}"
