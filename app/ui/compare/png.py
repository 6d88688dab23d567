"""The comparison's charts as a PNG without a window (`specula compare --png`).

`specula compare --png` imports this only when asked (the one door pyproject.toml allows). With no
QApplication yet, one is made on Qt's offscreen platform: nothing is shown, and it works on a
machine without a display.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from app.compare.results import CompareRun
from app.compare.verdict import headline, verdict
from app.ui.common.format import html_text

log = logging.getLogger(__name__)
SIZE = (1400, 900)


def save_png(run: CompareRun, path: str | Path) -> Path:
    from PySide6.QtCore import qInstallMessageHandler

    # Qt's platform notes ("This plugin does not support propagateSizeHints()") are not for a
    # command-line user: they go to the log instead of stderr.
    previous = qInstallMessageHandler(_to_log)
    try:
        return _render(run, Path(path))
    finally:
        qInstallMessageHandler(previous)


def _render(run: CompareRun, path: Path) -> Path:
    from PySide6.QtWidgets import QApplication, QLabel, QVBoxLayout, QWidget

    app = QApplication.instance()
    if app is None:
        os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
        app = QApplication(["specula"])
    from app.ui.compare.charts import CompareCharts

    page = QWidget()
    layout = QVBoxLayout(page)
    title = QLabel(f"<b>{html_text(run.main.name)}</b> · {html_text(run.main.plan)} · {run.created_text()}"
                   f"<br><b>{html_text(headline(run))}</b><br>{html_text(verdict(run))}")
    title.setWordWrap(True)
    charts = CompareCharts()
    layout.addWidget(title)
    layout.addWidget(charts, 1)
    page.resize(*SIZE)
    charts.set_run(run)
    page.show()  # offscreen or not, a widget lays out only once shown
    app.processEvents()
    try:
        return _save(page, path)
    finally:
        page.close()
        page.deleteLater()


def _save(page, path: Path) -> Path:
    from app.ui.chat.charts import write_png

    return write_png(page.grab(), path)


def _to_log(mode, context, message: str) -> None:
    log.debug("Qt: %s", message)
