"""Test support for the llama.cpp backend: a marker that skips where llama-cpp-python is missing
(a machine whose build failed runs on torch), unless SPECULA_REQUIRE_LLAMA=1 (CI) makes that a
failure."""

from __future__ import annotations

import os

import pytest


def llama_cpp_problem() -> str | None:
    from app.engine.backends.choose import llama_cpp_problem as problem

    return problem()


def require_llama_cpp() -> None:
    problem = llama_cpp_problem()
    if problem is None:
        return
    if os.environ.get("SPECULA_REQUIRE_LLAMA") == "1":
        pytest.fail(f"llama.cpp is required here (SPECULA_REQUIRE_LLAMA=1): {problem}")
    pytest.skip(f"llama.cpp unavailable: {problem}")


@pytest.fixture(scope="session")
def llama_loaded(tiny_paths, demo_path):
    """Load a tiny model (by its name in conftest's TINY_MODELS) or a demo model (by its key) once
    per session on llama.cpp, with the settings a user gets."""
    require_llama_cpp()
    from app.engine.loader import load_model

    cache = {}

    def get(name: str):
        if name not in cache:
            path = tiny_paths[name] if name in tiny_paths else demo_path(name)
            cache[name] = load_model(path, backend="llama.cpp")
        return cache[name]

    return get
