"""Shared fixtures: tiny real GGUF models written by tests/tiny_gguf.py, loaded by our loader."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
# Plan calibrations, assembled demo files and tokenizer caches of this session (and of the CLI
# subprocesses it starts) go to a folder of its own, not the user's ~/.cache/specula: a cost curve
# calibrated while pytest keeps every core busy would otherwise be what the user's next `specula
# run` or bench starts from (SmolLM2's 2-token verify was cached at 2.05x a step, measured 1.18x).
_SESSION_CACHE = tempfile.mkdtemp(prefix="specula-test-cache-")
os.environ["XDG_CACHE_HOME"] = _SESSION_CACHE
atexit.register(shutil.rmtree, _SESSION_CACHE, ignore_errors=True)

from tests.tiny_gguf import TinySpec, write_tiny_gguf  # noqa: E402

# name -> spec. Models without vocab="b" share the tiny vocabulary "a", so every pair of them is
# compatible token by token.
TINY_MODELS = {
    "llama-f32": TinySpec(arch="llama", qtype="F32", seed=0),
    "llama-q8": TinySpec(arch="llama", qtype="Q8_0", seed=0),
    "llama-other": TinySpec(arch="llama", qtype="F32", seed=1, n_layers=1),  # a useless draft
    "qwen2-f32": TinySpec(arch="qwen2", qtype="F32", seed=0),
    "qwen2-q8": TinySpec(arch="qwen2", qtype="Q8_0", seed=0),
    "llama3-rope": TinySpec(arch="llama", qtype="F32", seed=3, llama3_rope=True),
    "llama-notemplate": TinySpec(arch="llama", qtype="F32", seed=0, chat_template=None),
    # Tokenizer "b": another vocabulary, so these draft for the others (and back) through text.
    "llama-b": TinySpec(arch="llama", qtype="F32", seed=2, vocab="b"),
    "qwen2-b": TinySpec(arch="qwen2", qtype="F32", seed=0, vocab="b"),
}


@pytest.fixture(scope="session")
def tiny_paths(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("tiny-gguf")
    return {name: write_tiny_gguf(folder / f"{name}.gguf", spec) for name, spec in TINY_MODELS.items()}


@pytest.fixture(scope="session")
def tiny_loaded(tiny_paths):
    """Load each tiny model once per test session, float32 on the CPU (exact greedy identity)."""
    from app.engine.loader import load_model

    cache = {}

    def get(name: str):
        if name not in cache:
            cache[name] = load_model(tiny_paths[name], device="cpu", dtype="float32")
        return cache[name]

    return get


@pytest.fixture(scope="session")
def demo_path():
    """Path of a built-in demo model. The README's setup installs them: missing is a failure."""
    from app.hub.builtin import builtin_path

    return builtin_path


@pytest.fixture
def data_dir(tmp_path, monkeypatch) -> Path:
    """A fresh app data folder, and an empty Hugging Face cache (the library lists the cache)."""
    from huggingface_hub import constants

    folder = tmp_path / "specula-data"
    monkeypatch.setenv("SPECULA_DATA_DIR", str(folder))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    return folder
