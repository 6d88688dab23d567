"""The compare window (View ▸ Compare drafts): which draft pays off with this model, on this machine.

Setup on the left (setup.py), results on the right: one headline (the fastest configuration and
which part of its gain is drafting) with Details (every drafter's verdict) and "Use in chat"
(choice.py: useInChat, which the main window applies to its pair picker), one line of facts,
grouped bars and curves (charts.py), the sortable table (table.py), and Open… /
Compare with… / Export. The run
itself happens on a worker thread (app.worker.compare_task); the window only receives snapshots,
so it stays responsive. Every run is saved as it goes under the app's data folder
(`comparisons/compare-YYYYmmdd-HHMMSS.json`) and can be reopened; Cancel keeps what finished.
Closing the window (or the main window) cancels a run and waits for its current step.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from PySide6.QtCore import QCoreApplication, QEvent, QObject, QSize, Qt, QTimer, Signal
from PySide6.QtGui import QShowEvent
from PySide6.QtWidgets import (
    QFileDialog, QHBoxLayout, QMainWindow, QPushButton, QScrollArea, QSplitter, QVBoxLayout, QWidget,
)

from app.compare.export import save_csv
from app.compare.fastest import fastest, run_command
from app.compare.results import CANCELLED, COMPLETE, CompareRequest, CompareRun, load_run, save_run
from app.compare.summary import delta_line
from app.compare.verdict import detail_lines, headline
from app.common.atomic import private_dir
from app.engine.errors import SpeculaError
from app.ui.compare.charts import CompareCharts
from app.ui.compare.choice import COMMAND_TEXT, FastestRow
from app.ui.compare.details import DetailsArea
from app.ui.compare.setup import CompareSetup
from app.ui.compare.table import CompareTable
from app.hub.library_entries import LibraryEntry, file_title
from app.ui.common.paths import data_dir
from app.ui.common.screen_fit import place_new, refit_shown

log = logging.getLogger(__name__)

STOP_TIMEOUT_S = 20.0
DEFAULT_SIZE = QSize(1400, 900)  # charts, a table and the setup column side by side
REFIT_DELAY_MS = 500  # the window manager's frame is known a moment after the window shows
PICK_TEXT = "Pick a main model and drafts, then press Run."
JSON_FILTER = "Specula comparisons (*.json)"


def runs_dir() -> Path:
    return private_dir(data_dir() / "comparisons", tighten=True)  # runs name the user's models and prompts


class CompareWindow(QMainWindow):
    useInChat = Signal(object)  # app.compare.fastest.Fastest: the main window applies it to the chat

    def __init__(self, entries: list[LibraryEntry] | None = None, parent: QWidget | None = None) -> None:
        super().__init__(parent, Qt.WindowType.Window)
        self.setWindowTitle("Compare drafts — Specula")
        self.run: CompareRun | None = None
        self.earlier: CompareRun | None = None
        self.run_path: Path | None = None
        self.task = None  # app.worker.compare_task.CompareTask, made at the first Run
        self.running = False
        self._cancel_requested = False
        self._build()
        self.set_entries(entries or [])
        self._given_size = place_new(self, DEFAULT_SIZE)  # or the screen's room, where less
        if parent is not None:
            parent.installEventFilter(self)  # the main window closing stops a run first
        app = QCoreApplication.instance()
        if app is not None:
            app.aboutToQuit.connect(self.shutdown)

    def _build(self) -> None:
        self.setup = CompareSetup()
        self.setup.runRequested.connect(self.start)
        self.setup.cancelRequested.connect(self.cancel)
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setWidget(self.setup)
        left = QWidget()
        left.setMinimumWidth(330)
        left_layout = QVBoxLayout(left)
        left_layout.setContentsMargins(0, 0, 0, 0)
        left_layout.addWidget(scroll, 1)
        left_layout.addWidget(self.setup.run_panel)  # Run and the progress stay in sight

        self.fastest_row = FastestRow()
        self.fastest_row.useRequested.connect(self.useInChat)
        self.details = DetailsArea()  # hidden until Details is pressed
        self.details_label = self.details.label
        self.details.hide()
        self.fastest_row.detailsToggled.connect(self.details.setVisible)
        self.facts_label = self.fastest_row.facts
        self.open_button = _button("Open…", "Open an earlier comparison", self.open_dialog)
        self.compare_button = _button("Compare with…", "Show the change from an earlier comparison", self.compare_dialog)
        self.csv_button = _button("Export CSV…", "The table as CSV", lambda: self.export_dialog("csv"))
        self.json_button = _button("Export JSON…", "Every prompt's figures as JSON (reopens here)",
                                   lambda: self.export_dialog("json"))
        self.png_button = _button("Export PNG…", "The charts as one image", lambda: self.export_dialog("png"))
        actions = QHBoxLayout()
        for button in (self.open_button, self.compare_button):
            actions.addWidget(button)
        actions.addStretch(1)
        for button in (self.csv_button, self.json_button, self.png_button):
            actions.addWidget(button)

        self.charts = CompareCharts()
        self.table = CompareTable()
        results_split = QSplitter(Qt.Orientation.Vertical)
        results_split.addWidget(self.charts)
        results_split.addWidget(self.table)
        results_split.setSizes([560, 260])
        results = QWidget()
        results_layout = QVBoxLayout(results)
        results_layout.setContentsMargins(6, 0, 0, 0)
        results_layout.addWidget(self.fastest_row)
        results_layout.addWidget(self.details)
        results_layout.addLayout(actions)
        results_layout.addWidget(results_split, 1)

        splitter = QSplitter(Qt.Orientation.Horizontal)
        splitter.addWidget(left)
        splitter.addWidget(results)
        splitter.setStretchFactor(1, 1)
        splitter.setSizes([340, 1060])
        self.setCentralWidget(splitter)
        self._refresh_buttons()

    # --- the library ---------------------------------------------------------------------------

    def set_entries(self, entries: list[LibraryEntry]) -> None:
        self.setup.set_entries(entries)

    def select_main(self, path: str | None) -> bool:
        return self.setup.select_main(path)

    # --- running ---------------------------------------------------------------------------

    def start(self, request: CompareRequest) -> None:
        if self.running:
            return
        from app.worker.compare_task import CompareTask

        if self.task is None:
            self.task = CompareTask()
            self.task.worker.progress.connect(self.setup.set_progress)
            self.task.worker.updated.connect(self._on_update)
            self.task.worker.finished.connect(self._on_finished)
        self.run_path = runs_dir() / time.strftime("compare-%Y%m%d-%H%M%S.json")
        self.running = True
        self._cancel_requested = False
        self.earlier = None
        self.setup.set_running(True)
        self.setup.status.setText("")
        self._refresh_buttons()
        self.task.start(request, self.run_path)

    def cancel(self) -> None:
        if self.task is not None:
            self._cancel_requested = True
            self.task.cancel()
            self.setup.set_stage("stopping after this step…")

    def _on_update(self, run: CompareRun) -> None:
        self.set_run(run)

    def _on_finished(self, run: CompareRun | None, error: str) -> None:
        self.running = False
        self.setup.set_running(False)
        if run is not None:
            self.set_run(run)
        saved = f"saved to {self.run_path}" if run is not None and self.run_path is not None else "nothing saved"
        if error and run is None and self._cancel_requested:
            self.setup.status.setText("Cancelled before anything ran")
        elif error:
            self.setup.status.setText(f"Failed: {error} ({saved})")
        elif run is not None and run.status == CANCELLED:
            self.setup.status.setText(f"Cancelled: {len(run.results)} of {run.n_expected} results kept, {saved}")
        else:
            self.setup.status.setText(f"Done: {saved}")
        self.setup.progress.setRange(0, 1)
        self.setup.progress.setValue(1 if run is not None and run.status == COMPLETE else 0)
        self.setup.progress.setFormat(run.status if run is not None else "failed")
        self._refresh_buttons()

    # --- showing a run ---------------------------------------------------------------------

    def set_run(self, run: CompareRun | None, earlier: CompareRun | None = None) -> None:
        self.run = run
        if earlier is not None:
            self.earlier = earlier
        self.charts.set_run(run)
        self.table.set_run(run, self.earlier)
        self._show_verdict()
        self._refresh_buttons()

    def _show_verdict(self) -> None:
        """The headline, its details and the facts line (the fastest row's button: _refresh_buttons)."""
        run = self.run
        if run is None:
            self.details.set_lines([])
            self.facts_label.set_full_text("")
            return
        lines = detail_lines(run)
        if self.earlier is not None:
            lines.append(delta_line(run, self.earlier))
        choice = fastest(run)
        if choice is not None:
            lines.append(f"{COMMAND_TEXT}\n{run_command(choice)}")
        self.details.set_lines(lines)
        s = run.settings
        state = "" if run.status == COMPLETE else f" · {run.status}: {len(run.results)}/{run.n_expected} results"
        self.facts_label.set_full_text(
            f"{self._main_title(run)} on {run.main.plan} · {'greedy' if s.greedy else f'temperature {s.gen.temperature:g}'}"
            f" · {s.gen.max_tokens} tokens per reply · {s.draft_length_text()} · {len(run.prompts)} prompt(s) · "
            f"{run.created_text()}{state}"
        )

    def _main_title(self, run: CompareRun) -> str:
        """The main model as the library names it, as the chat and the picker do (the file's
        general.name, "SmolLm2 135M 8k Lc100K Mix1 Ep2", named no model a user picked)."""
        entry = next((e for e in self.setup._entries if e.path == run.main.path), None)
        return entry.title if entry is not None else file_title(Path(run.main.path).name)

    def _refresh_buttons(self) -> None:
        has_run = self.run is not None and bool(self.run.results)
        for button in (self.csv_button, self.json_button, self.png_button, self.compare_button):
            button.setEnabled(has_run and not self.running)
        self.open_button.setEnabled(not self.running)
        text = headline(self.run) if self.run is not None else PICK_TEXT
        self.fastest_row.set_choice(fastest(self.run), not self.running, text, self.details_label.text())

    # --- files -----------------------------------------------------------------------------

    def open_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Open a comparison", str(runs_dir()), JSON_FILTER)
        if path:
            self.open_run(path)

    def open_run(self, path: str | Path) -> bool:
        try:
            run = load_run(path)
        except SpeculaError as exc:
            self.setup.status.setText(str(exc))
            return False
        self.earlier = None
        self.run_path = Path(path)
        self.set_run(run)
        self.setup.status.setText(f"Opened {Path(path).name}")
        return True

    def compare_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Compare with an earlier comparison", str(runs_dir()), JSON_FILTER)
        if path:
            self.compare_with(path)

    def compare_with(self, path: str | Path) -> bool:
        try:
            earlier = load_run(path)
        except SpeculaError as exc:
            self.setup.status.setText(str(exc))
            return False
        self.set_run(self.run, earlier)
        self.fastest_row.details_button.setChecked(True)  # the change since then is one of the details
        self.setup.status.setText(f"Compared with {Path(path).name}")
        return True

    def export_dialog(self, kind: str) -> None:
        stem = self.run_path.stem if self.run_path is not None else "comparison"
        filters = {"csv": "CSV files (*.csv)", "json": JSON_FILTER, "png": "PNG images (*.png)"}
        path, _ = QFileDialog.getSaveFileName(self, f"Export {kind.upper()}", f"{stem}.{kind}", filters[kind])
        if path:
            self.export(kind, path)

    def export(self, kind: str, path: str | Path) -> bool:
        if self.run is None:
            return False
        try:
            if kind == "csv":
                save_csv(self.run, path)
            elif kind == "json":
                save_run(self.run, path)
            else:
                self.charts.save_png(path)
        except SpeculaError as exc:
            self.setup.status.setText(str(exc))
            return False
        self.setup.status.setText(f"Exported {Path(path).name}")
        return True

    # --- closing ---------------------------------------------------------------------------

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:  # noqa: N802 (Qt's name)
        if watched is self.parent() and event.type() == QEvent.Type.Close:
            self.shutdown()
        return False

    def showEvent(self, event: QShowEvent) -> None:  # noqa: N802 (Qt's name)
        super().showEvent(event)
        if not event.spontaneous():  # shown by the program: fit its real frame to the screen
            QTimer.singleShot(REFIT_DELAY_MS, self, lambda: refit_shown(self, self._given_size))

    def closeEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        self.shutdown()
        event.accept()

    def shutdown(self) -> None:
        """Cancel a run (its finished results are saved) and end the worker thread."""
        if self.task is None:
            return
        task, self.task = self.task, None
        if not task.stop(STOP_TIMEOUT_S):
            log.warning("the comparison did not stop in %.0f s", STOP_TIMEOUT_S)
            self._stuck_task = task  # a QThread must not be destroyed while it runs
        QCoreApplication.processEvents()  # deliver the run's last snapshot and its end
        if self.running:
            self.running = False
            self.setup.set_running(False)


def _button(text: str, tip: str, slot) -> QPushButton:
    button = QPushButton(text)
    button.setToolTip(tip)
    button.clicked.connect(slot)
    return button
