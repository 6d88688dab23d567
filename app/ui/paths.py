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

DATA_DIR_ENV = "SPECULA_DATA_DIR"


def data_dir() -> Path:
    override = os.environ.get(DATA_DIR_ENV)
    if override:
        folder = Path(override).expanduser()
    else:
        folder = Path(QStandardPaths.writableLocation(QStandardPaths.StandardLocation.AppDataLocation))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def history_path() -> Path:
    return data_dir() / "history.sqlite3"


def open_settings() -> QSettings:
    return QSettings(str(data_dir() / "settings.ini"), QSettings.Format.IniFormat)
