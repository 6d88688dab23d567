"""Start the window: `specula` with no arguments, `specula gui`, and `specula --self-test OUT.png`.

The command line reaches this module by name (importlib), so `app.cli` never imports Qt itself.
"""

from __future__ import annotations

import logging
import os
import sys
import traceback
from typing import Sequence

from app.desktop_entry import APP_ID, APP_NAME, ICON_SIZES, icon_png
from app.ui.shell.platform_check import xcb_problem

log = logging.getLogger(__name__)

DESKTOP_FILE = APP_ID  # the .desktop file's name: Wayland's app id, how the taskbar groups windows


def has_display() -> bool:
    """False on a Linux box with no X11/Wayland display (where Qt would abort, not fail)."""
    if os.environ.get("QT_QPA_PLATFORM"):
        return True
    if not sys.platform.startswith("linux"):
        return True
    return bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


def make_app(argv: Sequence[str] = ()):
    from PySide6.QtWidgets import QApplication

    app = QApplication.instance()
    if app is None:
        app = QApplication([sys.argv[0] if sys.argv else "specula", *argv])
    app.setApplicationName(APP_NAME)
    app.setOrganizationName(APP_NAME)
    app.setDesktopFileName(DESKTOP_FILE)
    app.setWindowIcon(app_icon())
    return app


def app_icon():
    """The app icon at every shipped size, from resources/icons (beside the `app` package, also
    inside the bundle). A missing file is logged and leaves that size out, never an error."""
    from PySide6.QtCore import QSize
    from PySide6.QtGui import QIcon

    icon = QIcon()
    for size in ICON_SIZES:
        path = icon_png(size)
        if path.is_file():
            icon.addFile(str(path), QSize(size, size))
        else:
            log.warning("app icon missing: %s", path)
    return icon


def _install_excepthook() -> None:
    """An unexpected error in a slot is logged and shown as one line in the status bar, and the
    window carries on (PySide would otherwise print a traceback and continue anyway)."""
    from PySide6.QtWidgets import QApplication, QMainWindow

    def hook(kind, value, tb) -> None:
        log.error("unexpected error: %s", "".join(traceback.format_exception(kind, value, tb)))
        for widget in QApplication.topLevelWidgets():
            if isinstance(widget, QMainWindow) and widget.isVisible():
                widget.statusBar().showMessage(f"unexpected error: {kind.__name__}: {value}", 20000)

    sys.excepthook = hook


def run_window(self_test: str | None = None, drive: bool = False) -> int:
    """Open the window (or run the self-test writing a screenshot to `self_test`, or the window
    driven from another process: app.ui.shell.drive); exit code."""
    if (self_test or drive) and not has_display():
        os.environ["QT_QPA_PLATFORM"] = "offscreen"
        # the offscreen plugin warns about window hints it cannot honour: noise, not a failure
        os.environ.setdefault("QT_LOGGING_RULES", "qt.qpa.*=false")
    if not has_display():
        print("specula: error: no display (DISPLAY and WAYLAND_DISPLAY are unset); "
              "use the command line (`specula --help`) or set QT_QPA_PLATFORM=offscreen", file=sys.stderr)
        return 1
    problem = xcb_problem()
    if problem is not None:  # Qt would abort with a core dump instead
        print(f"specula: error: {problem}", file=sys.stderr)
        return 1
    app = make_app()
    _install_excepthook()
    if self_test:
        from app.ui.shell.selftest import run_self_test

        return run_self_test(app, self_test)
    if drive:
        from app.ui.shell.drive import run_driver

        return run_driver(app)

    from app.engine.errors import SpeculaError
    from app.ui.shell.main_window import MainWindow

    try:
        window = MainWindow()
    except SpeculaError as exc:  # e.g. the history is in use by another Specula
        print(f"specula: error: {exc}", file=sys.stderr)
        from PySide6.QtWidgets import QMessageBox

        QMessageBox.critical(None, APP_NAME, str(exc))
        return 1
    window.show()
    code = app.exec()
    if window.thread_stuck:
        # A load that ignores cancel is still running; destroying its QThread would abort the
        # process, so leave at once (the history was closed cleanly before).
        logging.shutdown()
        os._exit(code)
    return code
