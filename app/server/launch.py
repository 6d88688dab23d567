"""Listening safely and running the app with uvicorn, in the foreground (`specula serve`) or on
a background thread (tests, and the window's server toggle later).

The socket is bound before the model loads, so a busy port or a refused address is one line in
the first second, not after a long load. Without an API key only loopback addresses are allowed.

Slow clients are bounded here (the body's read time is bounded by the app, app.read_body): a
connection must deliver a request's headers within HEADER_TIMEOUT_S of opening (or of the
previous response), idle keep-alive connections close after KEEP_ALIVE_S, headers are at most
h11's 16 KiB, and past MAX_CONNECTIONS open connections new requests get uvicorn's 503.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import signal
import socket
import threading
from typing import Callable, Generator

import asyncio

import h11
import uvicorn
from starlette.applications import Starlette
from uvicorn.protocols.http.h11_impl import H11Protocol

from app.engine.errors import SpeculaError

log = logging.getLogger(__name__)

GRACEFUL_SHUTDOWN_S = 5  # how long open responses may take to finish after Ctrl-C
HEADER_TIMEOUT_S = 20.0  # Apache's mod_reqtimeout default; nginx allows 60
KEEP_ALIVE_S = 5  # uvicorn's default, said here so SECURITY.md can name it
# Streaming clients each hold one, and 1 + --queue generate or wait; the rest is for /health,
# /metrics and refusals. Bounds what slow or idle clients can hold.
MAX_CONNECTIONS = 64


class ServeError(SpeculaError):
    """The server cannot start as asked (address refused or in use, bad key)."""


def _addresses(host: str, port: int) -> list[tuple]:
    try:
        return socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise ServeError(f"cannot listen on {host!r}: {exc.strerror}") from None


def is_loopback(host: str) -> bool:
    """Every address the host name resolves to is a loopback address."""
    addresses = [info[4][0] for info in _addresses(host, 0)]
    return bool(addresses) and all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addresses)


def check_bind_allowed(host: str, api_key: str | None) -> None:
    if not api_key and not is_loopback(host):
        raise ServeError(
            f"refusing to listen on {host} without --api-key: anyone who can reach this machine could "
            "use the model; set --api-key (or --api-key-file), or keep the default --host 127.0.0.1"
        )


def bind_socket(host: str, port: int) -> socket.socket:
    family, kind, proto, _, address = _addresses(host, port)[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise ServeError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class HeaderTimeoutProtocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline for each request's headers. uvicorn has none: a
    connection that sends nothing, or a header byte now and then, stays open for ever (its
    keep-alive timer starts only after a response and stops at the next byte)."""

    header_timeout_s = HEADER_TIMEOUT_S

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._header_deadline: asyncio.TimerHandle | None = None
        super().connection_made(transport)
        self._arm_header_deadline()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:  # the request line and headers are in
            self._disarm_header_deadline()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self._arm_header_deadline()  # the next request on this connection gets the same time

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_header_deadline()
        super().connection_lost(exc)

    def _arm_header_deadline(self) -> None:
        self._disarm_header_deadline()
        self._header_deadline = self.loop.call_later(self.header_timeout_s, self._header_deadline_passed)

    def _disarm_header_deadline(self) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
            self._header_deadline = None

    def _header_deadline_passed(self) -> None:
        self._header_deadline = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            log.info("closing a connection that sent no complete request headers in %g s", self.header_timeout_s)
            self.transport.close()


def protocol_with_header_timeout(timeout_s: float) -> type[HeaderTimeoutProtocol]:
    return type("HeaderTimeoutProtocol", (HeaderTimeoutProtocol,), {"header_timeout_s": timeout_s})


class ManagedServer(uvicorn.Server):
    """uvicorn's server that reports when it listens and cancels generations as it stops, so
    Ctrl-C does not wait for a long reply to finish."""

    def __init__(self, app: Starlette, sock: socket.socket, verbose: bool = False,
                 on_ready: Callable[[str], None] | None = None, header_timeout_s: float = HEADER_TIMEOUT_S,
                 max_connections: int = MAX_CONNECTIONS) -> None:
        config = uvicorn.Config(
            app, log_config=None, access_log=verbose, lifespan="on",
            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S, server_header=False,
            http=protocol_with_header_timeout(header_timeout_s), timeout_keep_alive=KEEP_ALIVE_S,
            limit_concurrency=max_connections,
        )
        super().__init__(config)
        self.app = app
        self.sock = sock
        self.url = url_of(sock)
        self.on_ready = on_ready
        self.ready = threading.Event()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            self.ready.set()
            if self.on_ready is not None:
                self.on_ready(self.url)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self.app.state.worker.cancel_all()
        await super().shutdown(sockets)

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        """uvicorn's (SIGINT, SIGTERM: a graceful shutdown, then the signal raised again for
        `specula serve` to stop as on Ctrl-C), and SIGHUP the same way: a closed terminal would
        otherwise interrupt the event loop and skip the shutdown. Not a SIGHUP ignored (nohup)."""
        with super().capture_signals():
            hangup = getattr(signal, "SIGHUP", None)
            if (hangup is None or threading.current_thread() is not threading.main_thread()
                    or signal.getsignal(hangup) in (signal.SIG_IGN, None)):
                yield
                return
            previous = signal.signal(hangup, self.handle_exit)
            try:
                yield
            finally:  # restored before uvicorn raises the captured signals again
                signal.signal(hangup, previous)

    def run_here(self) -> None:
        """Serve until Ctrl-C / SIGTERM / SIGHUP / should_exit (signals only on the main thread)."""
        try:
            self.run(sockets=[self.sock])
        finally:
            self.sock.close()


class BackgroundServer:
    """The server on a daemon thread: start() returns once it listens, stop() waits for it."""

    def __init__(self, app: Starlette, sock: socket.socket, verbose: bool = False, **limits: float) -> None:
        self.server = ManagedServer(app, sock, verbose, **limits)
        self.url = self.server.url
        self._thread = threading.Thread(target=self.server.run_here, name="specula-server", daemon=True)

    def start(self, timeout_s: float = 30.0) -> BackgroundServer:
        self._thread.start()
        waited = 0.0
        while not self.server.ready.wait(0.05):
            waited += 0.05
            if not self._thread.is_alive() or waited > timeout_s:
                self.stop()
                raise ServeError(f"the server did not start listening on {self.url}")
        return self

    def stop(self, timeout_s: float = 15.0) -> None:
        self.server.should_exit = True
        self._thread.join(timeout_s)

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()
