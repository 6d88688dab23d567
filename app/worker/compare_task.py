"""A comparison run off the GUI thread: a CompareWorker on its own QThread, reporting by signals.

The same pattern as the model host (host.py): the GUI thread calls `start`, which only emits a
queued signal; the worker runs app.compare.runner on its thread and answers with plain frozen data
(Progress, CompareRun snapshots). Each run gets its own cancel flag (a threading.Event), checked by
the engine between decoding steps; a cancelled run ends with its finished results, already saved.
Every run ends with exactly one `finished`, emitted from a `finally`.

The comparison loads its own copy of the main model (the chat's loaded pair stays as it is, on
the host's thread) and frees it, and each draft, when it ends.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from PySide6.QtCore import QObject, QThread, Signal, Slot

from app.compare.results import CompareRequest
from app.worker.host import one_line

log = logging.getLogger(__name__)


class CompareWorker(QObject):
    progress = Signal(object)  # app.compare.results.Progress
    updated = Signal(object)  # CompareRun: a new snapshot after each finished prompt
    finished = Signal(object, str)  # the last CompareRun (None if nothing ran), error line or ""

    _startRequested = Signal(object, object, object)  # CompareRequest, save path, threading.Event

    def __init__(self) -> None:
        super().__init__()
        self._startRequested.connect(self._run)

    @Slot(object, object, object)
    def _run(self, request: CompareRequest, save_to: Path | None, cancel: threading.Event) -> None:
        from app.compare.runner import Runner

        last = None
        error = ""

        def update(run) -> None:
            nonlocal last
            last = run
            self.updated.emit(run)

        try:
            last = Runner(request, on_progress=self.progress.emit, on_update=update,
                          cancel=cancel.is_set, save_to=save_to).run()
        except Exception as exc:
            error = one_line(exc)
            log.warning("comparison failed: %s", error)
        finally:
            import gc

            gc.collect()  # the main model and the last draft go with the runner
            self.finished.emit(last, error)


class CompareTask:
    """Starts a CompareWorker on its own QThread; one run at a time."""

    def __init__(self) -> None:
        self.thread = QThread()
        self.thread.setObjectName("specula-compare")
        self.worker = CompareWorker()
        self.worker.moveToThread(self.thread)
        self.thread.start()
        self._cancel = threading.Event()

    def start(self, request: CompareRequest, save_to: Path | None = None) -> None:
        self._cancel = threading.Event()
        self.worker._startRequested.emit(request, save_to, self._cancel)

    def cancel(self) -> None:
        """Stop after the current decoding step; safe from any thread."""
        self._cancel.set()

    def stop(self, timeout_s: float = 20.0) -> bool:
        """Cancel the run and end the thread; False if it is still busy after timeout_s."""
        self.cancel()
        self.thread.quit()
        stopped = self.thread.wait(int(timeout_s * 1000))
        if not stopped:
            log.warning("comparison thread still busy after %.0f s", timeout_s)
        return stopped
