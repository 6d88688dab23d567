"""Short background jobs (reading GGUF headers for the library) on Qt's thread pool.

    task = BackgroundTask(scan_library, builtins, files, folders)
    task.signals.done.connect(show)      # the function's return value, on the GUI thread
    task.signals.failed.connect(report)  # one line
    task.start()
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from PySide6.QtCore import QObject, QRunnable, QThreadPool, Signal

log = logging.getLogger(__name__)

_running: set[BackgroundTask] = set()  # keeps a started task's Python objects alive until it ends


class TaskSignals(QObject):
    done = Signal(object)
    failed = Signal(str)


class BackgroundTask(QRunnable):
    """Runs fn(*args) on QThreadPool.globalInstance(); exactly one of done/failed is emitted."""

    def __init__(self, fn: Callable[..., Any], *args: Any) -> None:
        super().__init__()
        self.setAutoDelete(False)  # Python owns it (see _running)
        self.fn, self.args = fn, args
        self.signals = TaskSignals()

    def start(self) -> None:
        _running.add(self)
        QThreadPool.globalInstance().start(self)

    def run(self) -> None:
        try:
            result = self.fn(*self.args)
        except Exception as exc:
            log.warning("background task %s failed: %s", getattr(self.fn, "__name__", self.fn), exc)
            self.signals.failed.emit(f"{type(exc).__name__}: {exc}")
        else:
            self.signals.done.emit(result)
        finally:
            _running.discard(self)


def wait_for_tasks(timeout_ms: int = 5000) -> bool:
    """Let running background tasks end (at exit, so none outlives the objects it reports to)."""
    return QThreadPool.globalInstance().waitForDone(timeout_ms)
