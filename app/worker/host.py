"""ModelHost: the loaded models on their own thread, driven by queued calls, reporting by signals.

The pattern is Spyder's workers: a QObject moved to a QThread; the GUI thread calls the public
methods, which only emit private signals (queued to the host's thread, so they return at once);
the host answers with public signals carrying plain data. Each job gets its own cancel flag
(a threading.Event) the moment it is asked for, so a cancel pressed before the job even starts
is not lost, and the engine checks it between steps (generation) or tensors (loading).

Every job ends with exactly one terminal signal, emitted from a `finally`, so the window always
leaves its busy state: a load ends with `loaded` or `loadFailed`, a generation with `finished`.
"""

from __future__ import annotations

import logging
import sys
import threading
from dataclasses import replace
from typing import Any

from PySide6.QtCore import QObject, QThread, Signal, Slot

from app.common.batches import Batcher
from app.worker.requests import ChatRequest, PairChoice

log = logging.getLogger(__name__)



def one_line(exc: BaseException) -> str:
    """The user-facing line for an error: SpeculaError messages as they are, others named."""
    from app.engine.errors import SpeculaError, first_line

    first = first_line(exc)
    if isinstance(exc, SpeculaError):
        return first or type(exc).__name__
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


class ModelHost(QObject):
    """Owns the main model, its draft and the KV caches. Lives on a HostThread."""

    devicesFound = Signal(dict)  # engine_calls.device_facts()
    loadProgress = Signal(str, float)  # stage, fraction 0..1 of the whole pair
    loaded = Signal(object)  # app.engine.session.Facts (engine_calls.window_facts)
    loadFailed = Signal(str)  # one line; also "loading cancelled"
    steps = Signal(object)  # a tuple of app.engine.events.StepEvent: a reply's steps of up to batches.EVERY_S
    finished = Signal(object, str)  # RunSummary.to_dict() or None, error line or ""

    _probeRequested = Signal()
    _loadRequested = Signal(object, object)  # PairChoice, threading.Event
    _generateRequested = Signal(object, object)  # ChatRequest, threading.Event

    def __init__(self) -> None:
        super().__init__()
        self._session = None  # app.engine.session.Session
        self._choice: PairChoice | None = None  # what the session was opened for
        self._cancel = threading.Event()
        self._probeRequested.connect(self._probe)
        self._loadRequested.connect(self._load)
        self._generateRequested.connect(self._generate)

    # --- called from the GUI thread: each only queues a job -------------------------------

    def probe_devices(self) -> None:
        self._probeRequested.emit()

    def load(self, spec: PairChoice) -> None:
        self._loadRequested.emit(spec, self._new_job())

    def generate(self, request: ChatRequest) -> None:
        self._generateRequested.emit(request, self._new_job())

    def current_session(self):
        """The open session (app.engine.session.Session) or None. Read from the GUI thread after
        `loaded`: the host thread sets it before emitting that signal and only replaces it in a
        later load, which the window requests itself."""
        return self._session

    def cancel(self) -> None:
        """Stop the current (or just requested) load or generation; safe from any thread."""
        self._cancel.set()

    def _new_job(self) -> threading.Event:
        self._cancel = threading.Event()
        return self._cancel

    # --- run on the host's thread -------------------------------------------------------------

    @Slot()
    def _probe(self) -> None:
        from app.worker.engine_calls import device_facts

        try:
            facts = device_facts()
        except Exception as exc:  # a broken CUDA install must not take the window down
            log.warning("device probe failed: %s", exc)
            facts = {"gpu": None, "reason": f"no GPU: {one_line(exc)}", "cpu_dtype": "float32"}
        self.devicesFound.emit(facts)

    @Slot(object, object)
    def _load(self, spec: PairChoice, cancel: threading.Event) -> None:
        from app.worker.engine_calls import can_swap_drafter, open_pair, window_facts

        if can_swap_drafter(self._session, spec, self._choice):
            self._swap(spec, cancel)
            return
        facts = None
        error = "loading stopped"
        try:
            self._drop_session()  # free the old pair's memory before loading the new one
            session = open_pair(spec, self.loadProgress.emit, cancel.is_set)
            if cancel.is_set():
                session.close()
                raise_cancelled()
            self._session, self._choice, facts = session, spec, window_facts(session, spec)
        except Exception as exc:
            error = one_line(exc)
            log.info("load failed: %s", error)
        finally:
            if facts is not None:
                self.loaded.emit(facts)
            else:
                self.loadFailed.emit(error)

    def _swap(self, spec: PairChoice, cancel: threading.Event) -> None:
        """Only the drafter changes: the main model and its KV cache stay loaded. A failed or
        cancelled draft load keeps the running pair, and `loaded` says so with its facts and
        swap_error (the window keeps showing what runs)."""
        from app.worker.engine_calls import swap_drafter, window_facts

        facts = replace(window_facts(self._session, self._choice), swap_error="loading stopped")
        try:
            session = swap_drafter(self._session, spec, self.loadProgress.emit, cancel.is_set)
            if cancel.is_set():
                raise_cancelled()
            self._session, self._choice, facts = session, spec, window_facts(session, spec)
        except Exception as exc:
            facts = replace(facts, swap_error=one_line(exc))
            log.info("drafter change failed: %s", facts.swap_error)
        finally:
            self.loaded.emit(facts)

    @Slot(object, object)
    def _generate(self, request: ChatRequest, cancel: threading.Event) -> None:
        from app.engine.errors import SpeculaError
        from app.engine.events import DoneEvent
        from app.engine.session import Prompt

        summary: dict[str, Any] | None = None
        error = ""
        session = self._session
        batch = Batcher(self.steps.emit)  # app.common.batches says why
        try:
            if session is None:
                raise SpeculaError("no model is loaded: pick a main model and press Load")
            messages = request.messages() + [{"role": "user", "content": request.user_text}]
            prompt = Prompt.chat(messages, request.system_prompt or None, plain=request.plain, fit=True)
            settings = request.settings.decode_settings(context=session.describe().n_ctx)
            for event in session.reply(prompt, settings, cancel.is_set):
                if isinstance(event, DoneEvent):
                    summary = event.summary.to_dict()
                else:
                    batch.add(event)
        except Exception as exc:
            error = one_line(exc)
            log.warning("generation failed: %s", error)
        finally:
            batch.send()
            self.finished.emit(summary, error)
        if session is not None:
            session.save_learned()  # after `finished`: the window does not wait for the write

    def release(self) -> None:
        """Drop the session (stopping a llama-server it started); called once the thread has ended."""
        self._drop_session()

    def _drop_session(self) -> None:
        if self._session is None:
            return
        session, self._session, self._choice = self._session, None, None
        session.close()
        del session
        import gc

        gc.collect()
        torch = sys.modules.get("torch")  # only where a torch model ran: a llama.cpp window never imports it
        try:
            if torch is not None and torch.cuda.is_available():
                torch.cuda.empty_cache()
        except Exception:  # freeing is best effort
            pass


def raise_cancelled() -> None:
    from app.engine.errors import LoadCancelled

    raise LoadCancelled("loading cancelled")


class HostThread:
    """Starts a ModelHost on its own QThread; stop() cancels its job and ends the thread."""

    def __init__(self) -> None:
        self.thread = QThread()
        self.thread.setObjectName("specula-model-host")
        self.host = ModelHost()
        self.host.moveToThread(self.thread)
        self.thread.start()

    def stop(self, timeout_s: float = 20.0) -> bool:
        """Cancel the running job and wait for the thread; False if it is still running."""
        self.host.cancel()
        self.thread.quit()
        stopped = self.thread.wait(int(timeout_s * 1000))
        if stopped:
            self.host.release()  # no llama-server outlives the window
        if not stopped:
            log.warning("model thread still busy after %.0f s", timeout_s)
        return stopped

    def is_running(self) -> bool:
        return self.thread.isRunning()
