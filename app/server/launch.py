"""Listening safely and running the app with uvicorn, in the foreground (`specula serve`) or on
a background thread (tests, and the window's server toggle later).

The socket is bound before the model loads, so a busy port or a refused address is one line in
the first second, not after a long load. Without an API key only loopback addresses are allowed.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import threading
from typing import Callable

import uvicorn
from starlette.applications import Starlette

from app.engine.errors import SpeculaError

log = logging.getLogger(__name__)

GRACEFUL_SHUTDOWN_S = 5  # how long open responses may take to finish after Ctrl-C


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


class ManagedServer(uvicorn.Server):
    """uvicorn's server that reports when it listens and cancels generations as it stops, so
    Ctrl-C does not wait for a long reply to finish."""

    def __init__(self, app: Starlette, sock: socket.socket, verbose: bool = False,
                 on_ready: Callable[[str], None] | None = None) -> None:
        config = uvicorn.Config(
            app, log_config=None, access_log=verbose, lifespan="on",
            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S, server_header=False,
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

    def run_here(self) -> None:
        """Serve until Ctrl-C / SIGTERM / should_exit (signals only on the main thread)."""
        try:
            self.run(sockets=[self.sock])
        finally:
            self.sock.close()


class BackgroundServer:
    """The server on a daemon thread: start() returns once it listens, stop() waits for it."""

    def __init__(self, app: Starlette, sock: socket.socket, verbose: bool = False) -> None:
        self.server = ManagedServer(app, sock, verbose)
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
