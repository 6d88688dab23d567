"""What the bundle leaves out of the venv (read by packaging/specula.spec and by
tests/test_bundle_without_torch.py, which runs the window's self-test with these modules gone).

The bundled app runs every model on llama.cpp, whose CPU variants cover every x86-64 class: torch,
the fallback backend, is unreachable there and was half the bundle (496 MiB). Of transformers the
window needs only its sandboxed chat-template renderer (transformers.utils); its models,
generation and training code (50 MiB) only ever run on torch. A pip install keeps both.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

NOT_BUNDLED = ["torch", "torchvision", "torchaudio", "accelerate", "safetensors.torch"]
# The parts of transformers a llama.cpp reply imports (its chat-template renderer and what
# `import transformers` itself runs).
TRANSFORMERS_KEPT = {"utils", "_typing", "dependency_versions_check", "dependency_versions_table"}


def transformers_left_out() -> list[str]:
    """transformers' top-level modules and packages that the bundle leaves out, read from the
    installed package (its TYPE_CHECKING imports name them all, so PyInstaller would take them)."""
    spec = importlib.util.find_spec("transformers")
    if spec is None or not spec.submodule_search_locations:
        return []
    folder = Path(list(spec.submodule_search_locations)[0])
    names = {p.stem for p in folder.glob("*.py")} | {p.name for p in folder.iterdir() if (p / "__init__.py").is_file()}
    return sorted(f"transformers.{name}" for name in names - TRANSFORMERS_KEPT if not name.startswith("__"))


def left_out() -> list[str]:
    return NOT_BUNDLED + transformers_left_out()
