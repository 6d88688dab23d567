"""Which backend runs a model, and that every way llama.cpp can be missing or broken ends on torch
with one line: no binding, a library that fails to load, a build that crashes in its self-test."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.engine.backends import LLAMA_CPP, TORCH
from app.engine.backends.choose import choose_backend
from app.engine.backends.llamacpp.lib import BackendUnavailable
from tests.llama_support import require_llama_cpp

ROOT = Path(__file__).resolve().parents[2]


def specula(*args: str, env: dict[str, str] | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    full = dict(os.environ, **(env or {}))
    return subprocess.run([sys.executable, "-m", "app", *args], capture_output=True, text=True, cwd=ROOT,
                          env=full, timeout=timeout)


def test_a_dtype_asked_for_means_torch_and_says_why():
    choice = choose_backend("auto", dtype="float32")
    assert choice.name == TORCH and "--dtype float32" in choice.reason


def test_torch_as_asked_and_from_the_environment(monkeypatch):
    assert choose_backend("torch").name == TORCH
    monkeypatch.setenv("SPECULA_BACKEND", "torch")
    assert choose_backend("auto").name == TORCH


def test_an_unknown_backend_is_one_line():
    with pytest.raises(BackendUnavailable, match="unknown backend 'gpu'"):
        choose_backend("gpu")


def test_auto_takes_llama_cpp_where_it_runs():
    require_llama_cpp()
    choice = choose_backend("auto", device="cpu")
    assert choice.name == LLAMA_CPP and choice.reason.startswith("llama.cpp")


def _broken_binding(folder: Path, error: str) -> dict[str, str]:
    """A llama_cpp package ahead of the real one on the path that fails as a broken install does."""
    package = folder / "llama_cpp"
    package.mkdir()
    (package / "__init__.py").write_text(f"raise {error}\n")
    return {"PYTHONPATH": os.pathsep.join([str(folder), str(ROOT)])}


@pytest.mark.parametrize("error, says", [
    ("ImportError('no module')", "llama-cpp-python is not installed"),
    ("OSError('libllama.so: cannot open shared object file')", "llama.cpp's library failed to load"),
])
def test_a_missing_or_broken_binding_runs_on_torch_with_one_line(tiny_paths, tmp_path, error, says):
    env = _broken_binding(tmp_path, error)
    done = specula("run", "-m", str(tiny_paths["llama-q8"]), "-p", "hello", "-n", "4", "--temp", "0", "--json",
                   env=env)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1])["n_predicted"] >= 1
    assert says in done.stderr and "Traceback" not in done.stderr
    asked = specula("run", "-m", str(tiny_paths["llama-q8"]), "-p", "hello", "-n", "4", "--backend", "llama.cpp",
                    env=env)
    assert asked.returncode != 0
    lines = [line for line in asked.stderr.strip().splitlines() if line]
    assert len(lines) == 1 and says in lines[0]


def test_a_build_that_crashes_in_its_self_test_means_torch(tiny_paths, tmp_path):
    """A crash (SIGSEGV: an AMX tile fault, or memory) falls back to torch for this start and is
    kept as a verdict only once it repeats at three starts; the next start tries llama.cpp again."""
    require_llama_cpp()
    env = {"SPECULA_PROBE_FAULT": "segv", "XDG_CACHE_HOME": str(tmp_path)}
    verdict_file = tmp_path / "specula" / "llamacpp-probe.json"
    for start in (1, 2, 3):
        done = specula("run", "-m", str(tiny_paths["llama-q8"]), "-p", "hello", "-n", "4", "--temp", "0", "--json",
                       env=env)
        assert done.returncode == 0, done.stderr
        assert "llama.cpp crashed in its self-test (SIGSEGV)" in done.stderr and "Traceback" not in done.stderr
        verdicts = list(json.loads(verdict_file.read_text()).values())
        if start < 3:
            assert "runs again at the next start" in done.stderr
            assert verdicts == [{"crashes": start, "reason": "llama.cpp crashed in its self-test (SIGSEGV)"}]
    assert [v["ok"] for v in verdicts] == [False]  # repeated: kept, the next start does not crash again
    again = specula("run", "-m", str(tiny_paths["llama-q8"]), "-p", "hi", "-n", "2", "--backend", "llama.cpp",
                    env={"XDG_CACHE_HOME": str(tmp_path)})
    assert again.returncode != 0 and "crashed in its self-test" in again.stderr


def test_an_illegal_instruction_is_a_verdict_at_once(tiny_paths, tmp_path):
    require_llama_cpp()
    done = specula("run", "-m", str(tiny_paths["llama-q8"]), "-p", "hello", "-n", "2", "--temp", "0",
                   env={"SPECULA_PROBE_FAULT": "ill", "XDG_CACHE_HOME": str(tmp_path)})
    assert done.returncode == 0 and "an instruction this CPU lacks" in done.stderr, done.stderr
    verdicts = json.loads((tmp_path / "specula" / "llamacpp-probe.json").read_text())
    assert [v["ok"] for v in verdicts.values()] == [False]


def test_a_passing_self_test_is_cached(tiny_paths, tmp_path):
    require_llama_cpp()
    env = {"XDG_CACHE_HOME": str(tmp_path)}
    done = specula("run", "-m", str(tiny_paths["llama-q8"]), "-p", "hello", "-n", "4", "--temp", "0", "--json",
                   env=env)
    assert done.returncode == 0, done.stderr
    verdicts = json.loads((tmp_path / "specula" / "llamacpp-probe.json").read_text())
    assert [v["ok"] for v in verdicts.values()] == [True]


def test_a_file_llama_cpp_refuses_is_one_line(tiny_paths, tmp_path):
    require_llama_cpp()
    data = bytearray(tiny_paths["llama-q8"].read_bytes())
    # An architecture llama.cpp does not know, every key renamed with it: our header checks pass
    # (they read the architecture's own keys), llama.cpp's loader refuses it.
    data[:] = data.replace(b"llama", b"llamb")
    path = tmp_path / "unknown-arch.gguf"
    path.write_bytes(bytes(data))
    done = specula("run", "-m", str(path), "-p", "hello", "-n", "4", "--backend", "llama.cpp")
    assert done.returncode != 0
    lines = [line for line in done.stderr.strip().splitlines() if line]
    assert len(lines) == 1 and "unknown-arch.gguf" in lines[0] and "Traceback" not in done.stderr
