"""Where an installed Python package keeps its files, asked without importing it: the demo
models ship as packages (the hub lists them; llama.cpp's self-test loads one). Here in the
engine so that both may ask; the engine never imports the hub."""

from __future__ import annotations

import importlib.util
from pathlib import Path


def package_dir(package: str) -> Path | None:
    """The folder of an installed package; None where it is not installed."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])
