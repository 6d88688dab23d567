"""Opens the real main window on the screen the platform gives, once per data folder named, and
writes what it saw as JSON: `python -m tests.ui.screen_probe OUT.json DATA_DIR...`.

Tests run it in a child process with QT_QPA_PLATFORM=offscreen:configfile=... naming a screen of
1280x720 or 1440x900 (the test session's own offscreen screen is 800x800, and a process has one
screen for its life): the window's constructor sizes it for the screen it opens on.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from PySide6.QtWidgets import QApplication

SETTLE_S = 1.0  # after the library is read: the banner's refresh, and the refit once shown
TIMEOUT_S = 90.0


def _rect(rect) -> list[int]:
    return [rect.x(), rect.y(), rect.width(), rect.height()]


def _spin(app: QApplication, seconds: float, until=lambda: False) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end and not until():
        app.processEvents()
        time.sleep(0.01)


def look(app: QApplication, data: str) -> dict:
    os.environ["SPECULA_DATA_DIR"] = data
    from app.ui.shell.main_window import MainWindow

    window = MainWindow()
    given = _rect(window.geometry())  # before show: what the constructor chose
    window.show()
    _spin(app, TIMEOUT_S, lambda: bool(window.library.entries()) and not window.library.is_scanning())
    _spin(app, SETTLE_S)
    panel = window.panel
    seen = {
        "available": _rect(window.screen().availableGeometry()),
        "given": given,
        "frame": _rect(window.frameGeometry()),
        "minimum": [window.minimumSizeHint().width(), window.minimumSizeHint().height()],
        "chat_list_width": window.chat_list.width(),
        "banner": panel.no_model_bar.isVisible(),
        "button_shown": panel.load_last_button.text(),
        "button_full": panel.load_last_button.full_text(),
        "button_tip": panel.load_last_button.toolTip(),
        "send_bottom": panel.send_button.mapTo(window, panel.send_button.rect().bottomRight()).y(),
        "height": window.height(),
    }
    window.close()
    window.deleteLater()
    _spin(app, 0.2)
    return seen


def main() -> None:
    out, folders = Path(sys.argv[1]), sys.argv[2:]
    app = QApplication(sys.argv[:1])
    out.write_text(json.dumps([look(app, folder) for folder in folders]))


if __name__ == "__main__":
    main()
