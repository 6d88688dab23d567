"""The window's offer of a real main + draft pair: Qwen2.5-Coder 1.5B Instruct drafted for by its
0.5B sibling (one vocabulary), from the welcome card and the Library tab.

Where the `pair` extra is installed the two files are joined from its packages the first time
(1.6 GB copied and checked), else the official files come from the hub with the download
machinery's progress and resume. Either runs on a hub worker (app.worker.hub_tasks), never on
the GUI thread. Then the library is read again (it lists the pair once it is here), the pair goes
into the pair picker as a Compare choice would, and the window loads it with the demo's path.
"""

from __future__ import annotations

import logging
from functools import partial

from PySide6.QtCore import QObject, Signal

from app.hub.assemble import AssemblyProgress
from app.hub.builtin import PAIR, PAIR_HUB_FILES, PAIR_SIZE_TEXT, BUILTIN_MODELS, pair_installed
from app.ui.common.format import format_bytes
from app.ui.discover.text import progress_line
from app.worker.hub_tasks import DOWNLOAD, HubCalls, HubFailure, fetch_pair
from app.worker.requests import MODEL

log = logging.getLogger(__name__)

TITLES = {m.key: m.title for m in BUILTIN_MODELS}
MAIN_TITLE, DRAFT_TITLE = TITLES[PAIR[0]], TITLES[PAIR[1]]
PAIR_WHAT = f"{MAIN_TITLE} with the 0.5B as its draft model"


def offer_note(installed: bool) -> str:
    """What the offer gives, and where the files come from."""
    where = ("built in, joined once from its packages: no download" if installed else
             f"downloaded once from Hugging Face ({PAIR_HUB_FILES[0][0]} and its 0.5B sibling)")
    return f"{MAIN_TITLE} with the 0.5B drafting for it (one vocabulary, Apache-2.0); {where}."


def progress_text(event: object) -> str:
    """One line for a join's or a download's progress event."""
    if isinstance(event, AssemblyProgress):
        return (f"Joining {event.name} (once): {format_bytes(event.done)} of "
                f"{format_bytes(event.total)} ({event.fraction:.0%})")
    return f"Downloading {event.filename}: {progress_line(event)}"


class PairOffer(QObject):
    """busyChanged(bool) while the files are being made ready; status(str) says how far, or why
    not; loading(str) when the pair's load starts (what loads, in words)."""

    busyChanged = Signal(bool)
    status = Signal(str)
    loading = Signal(str)

    def __init__(self, window) -> None:
        super().__init__(window)
        self.window = window
        self.installed = pair_installed()  # a look-up of 28 package names: no file is read
        self.calls = HubCalls(self, max_threads=1)
        self.calls.downloadProgress.connect(self._on_progress)
        self.calls.finished.connect(self._on_finished)
        self.calls.failed.connect(self._on_failed)
        window.library.entriesChanged.connect(self._on_library)
        self._busy = False
        self._cancelled = False
        self._ready: tuple[str, str] | None = None  # the files, waiting for the library to list them

    @property
    def busy(self) -> bool:
        return self._busy

    def note(self) -> str:
        return offer_note(self.installed)

    def toggle(self) -> None:
        """The offer's button: start, or cancel what runs (a download keeps its partial)."""
        if self._busy:
            self._cancelled = True
            self.calls.cancel_download()
        else:
            self.start()

    def start(self) -> None:
        self._cancelled = False
        self._set_busy(True)
        self.status.emit(f"Getting {PAIR_WHAT} ready ({PAIR_SIZE_TEXT})…")
        # What the note said is what runs: the packages, or the hub.
        self.calls.start_long(partial(fetch_pair, from_packages=self.installed))

    def shutdown(self, timeout_ms: int = 3000) -> None:
        self.calls.shutdown(timeout_ms)

    def _set_busy(self, busy: bool) -> None:
        self._busy = busy
        self.busyChanged.emit(busy)

    def _on_progress(self, event: object) -> None:
        self.status.emit(progress_text(event))

    def _on_finished(self, channel: str, _request: int, result: object) -> None:
        if channel != DOWNLOAD:
            return
        main, draft = result
        self._ready = (main, draft)
        self.status.emit(f"{PAIR_WHAT}: ready; reading the library…")
        self.window.library.rescan()  # lists the joined or downloaded files; _on_library loads them

    def _on_failed(self, channel: str, _request: int, failure: HubFailure) -> None:
        if channel != DOWNLOAD:
            return
        self._set_busy(False)
        self.status.emit("Cancelled." if self._cancelled else f"Not ready: {failure.message}")

    def _on_library(self, _entries: list) -> None:
        if self._ready is None:
            return
        (main, draft), self._ready = self._ready, None
        self._set_busy(False)
        self._load(main, draft)

    def _load(self, main: str, draft: str) -> None:
        """Into the pair picker (this computer, the 0.5B as draft model), then the window's Load."""
        window = self.window
        if window.controller.busy:  # as the window's own Load says
            self.status.emit("Ready, not loaded: a reply is being generated (Esc stops it), then load it again")
            return
        problem = window.picker.apply(main, MODEL, draft)
        spec = window.picker.spec() if problem is None else None
        if spec is None:
            self.status.emit(f"Not loaded: {problem or window.picker.problem() or 'the pair cannot be chosen'}")
            return
        window.models_tabs.setCurrentIndex(0)  # the Model tab shows the load's progress
        self.status.emit("")
        self.loading.emit(f"{MAIN_TITLE} + {DRAFT_TITLE}")
        window.load_pair(spec)
