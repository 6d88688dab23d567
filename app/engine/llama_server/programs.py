"""Where llama.cpp's programs (llama-server, rpc-server) are: built by packaging/llama_build.py from
the binding's own sdist (same llama.cpp commit) and copied beside the environment's python, or
beside the bundled app, or named by SPECULA_LLAMA_BIN (a folder)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

SERVER = "llama-server"
RPC_SERVER = "rpc-server"


def _folders() -> list[Path]:
    if os.environ.get("SPECULA_LLAMA_BIN"):  # the user's choice, alone
        return [Path(os.environ["SPECULA_LLAMA_BIN"])]
    folders = [Path(sys.executable).parent]
    bundle = getattr(sys, "_MEIPASS", None)
    if bundle:
        folders.append(Path(bundle))
    return folders


def find_program(name: str) -> Path | None:
    """The program's path, or None where it was not built here."""
    exe = name + (".exe" if os.name == "nt" else "")
    for folder in _folders():
        candidate = folder / exe
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None  # not one on PATH: another llama.cpp commit would not compare with the binding


def missing_reason(name: str) -> str:
    return (f"{name} is not built here (python3 packaging/bootstrap.py builds it beside the environment; "
            f"SPECULA_LLAMA_BIN names another folder)")
