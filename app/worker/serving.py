"""The window's "serve the loaded model" toggle: `specula serve` on the session the window opened.

The server gets a session of its own beside the chat's (Session.beside: its own KV caches and
drafter state on the same weights, or its own connection to the same llama-server or URL, with
the same key), so the window's chat and API requests never touch each other's caches; they share
the weights and the CPU. Starting and stopping run on a pool thread (binding, uvicorn start-up
and its shutdown wait), so the window never waits on them.
"""

from __future__ import annotations

import logging
from typing import Any

from PySide6.QtCore import QObject, Signal

from app.engine.settings import GenSettings
from app.worker.tasks import BackgroundTask

log = logging.getLogger(__name__)

DEFAULT_PORT = 8080


def _start(session: Any, settings: GenSettings, port: int, api_key: str | None) -> Any:
    from app.server.app import ServerConfig, create_app
    from app.server.launch import BackgroundServer, bind_socket
    from app.server.model import ServedModel

    settings.decode_settings()  # the window's settings are the requests' defaults: checked before serving
    served = ServedModel.create(session.beside(), settings)
    sock = bind_socket("127.0.0.1", port)  # the window serves this machine only
    return BackgroundServer(create_app(served, ServerConfig(api_key=api_key or None)), sock).start()


def _stop(server: Any) -> None:
    server.stop()


class ServerControl(QObject):
    """Start/stop one background server. Signals: started(url), stopped(), failed(one line)."""

    started = Signal(str)
    stopped = Signal()
    failed = Signal(str)

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._server: Any = None
        self._task: BackgroundTask | None = None
        self._next: tuple | None = None  # a start asked for while a stop was under way

    @property
    def running(self) -> bool:
        return self._server is not None

    @property
    def busy(self) -> bool:
        return self._task is not None

    def start(self, session: Any, settings: Any, port: int = DEFAULT_PORT, api_key: str | None = None) -> None:
        if self.running:
            return
        if self.busy:  # still stopping the server of the model just replaced: start after it
            self._next = (session, settings, port, api_key)
            return
        if session is None:
            self.failed.emit("load a model first: the server serves the loaded pair")
            return
        self._task = BackgroundTask(_start, session, settings, port, api_key)
        self._task.signals.done.connect(self._on_started)
        self._task.signals.failed.connect(self._on_failed)
        self._task.start()

    def stop(self) -> None:
        self._next = None
        if self._server is None or self.busy:
            return
        server, self._server = self._server, None
        self._task = BackgroundTask(_stop, server)
        self._task.signals.done.connect(self._on_stopped)
        self._task.signals.failed.connect(self._on_stop_failed)
        self._task.start()

    def stop_now(self, timeout_s: float = 5.0) -> None:
        """On window close: stop in this thread, waiting at most timeout_s."""
        if self._server is not None:
            self._server.stop(timeout_s)
            self._server = None

    def _on_started(self, server: Any) -> None:
        self._task, self._server = None, server
        log.info("serving on %s", server.url)
        self.started.emit(server.url)

    def _on_failed(self, message: str) -> None:
        self._task = None
        self.failed.emit(message)

    def _on_stopped(self, _result: Any) -> None:
        self._task = None
        self.stopped.emit()
        self._start_next()

    def _on_stop_failed(self, message: str) -> None:
        self._task = None
        log.warning("server stop: %s", message)
        self.stopped.emit()
        self._start_next()

    def _start_next(self) -> None:
        if self._next is not None:
            args, self._next = self._next, None
            self.start(*args)
