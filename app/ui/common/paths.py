"""Where the app keeps its data: the history database and the settings file.

QStandardPaths.AppDataLocation (e.g. ~/.local/share/Specula/Specula on Linux), or the folder named
by SPECULA_DATA_DIR: tests and the self-test point it at a temporary folder so they never touch a
user's chats or settings. Settings are an INI file in that folder for the same reason (QSettings'
native stores, such as the Windows registry, cannot be redirected).
"""

from __future__ import annotations

import os
from pathlib import Path

from PySide6.QtCore import QSettings, QStandardPaths

from app.common.atomic import private_dir

DATA_DIR_ENV = "SPECULA_DATA_DIR"


def data_dir() -> Path:
    override = os.environ.get(DATA_DIR_ENV)
    if override:
        folder = Path(override).expanduser()
    else:
        folder = Path(QStandardPaths.writableLocation(QStandardPaths.StandardLocation.AppDataLocation))
    # The chats are private data: 0700 whatever the umask, as a browser profile is (and an
    # earlier version's 0755 folder is tightened).
    return private_dir(folder, tighten=True)


def history_path() -> Path:
    return data_dir() / "history.sqlite3"


def open_settings() -> QSettings:
    return QSettings(str(data_dir() / "settings.ini"), QSettings.Format.IniFormat)
