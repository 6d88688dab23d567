"""What the bundle leaves out of the venv (read by packaging/specula.spec and by
tests/test_bundle_without_torch.py, which runs the window's self-test with these modules gone).

The bundled app runs every model on llama.cpp, whose CPU variants cover every x86-64 class: torch,
the fallback backend, is unreachable there and was half the bundle (496 MiB). A pip install
keeps it.

transformers stays whole (about 50 MiB): the window renders chat templates with its sandboxed
renderer, and `import transformers` lists and parses its `models` folder at import
(define_import_structure), so a bundle without that folder failed its self-test at the first
reply (FileNotFoundError: .../_internal/transformers/models). Leaving it out needs a renderer of
our own first.
"""

from __future__ import annotations

NOT_BUNDLED = ["torch", "torchvision", "torchaudio", "accelerate", "safetensors.torch"]


def left_out() -> list[str]:
    return list(NOT_BUNDLED)
