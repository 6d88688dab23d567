"""The bundle leaves torch out (issue 52 item 15): the window's whole
self-test (the bundle's own check: start, library, the demo model on llama.cpp, a drafted reply,
the charts) runs with every module packaging/bundle_excludes.py leaves out made unimportable, as
it is inside the bundle (a None in sys.modules: `import torch` fails and find_spec says absent)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def bundle_excludes():
    spec = importlib.util.spec_from_file_location("bundle_excludes", ROOT / "packaging" / "bundle_excludes.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_spec_leaves_torch_out():
    left_out = bundle_excludes().left_out()
    assert "torch" in left_out and "accelerate" in left_out
    # transformers stays whole: `import transformers` parses its models folder (the chat-template
    # renderer's import), and a bundle without it failed its first reply.
    assert not any(name.startswith("transformers") for name in left_out)
    assert "left_out()" in (ROOT / "packaging" / "specula.spec").read_text()


@pytest.mark.demo
def test_the_self_test_runs_without_what_the_bundle_leaves_out(tmp_path):
    from tests.llama_support import require_llama_cpp

    require_llama_cpp()
    left_out = bundle_excludes().left_out()
    blocked = ("import sys\n"
               f"for name in {left_out!r}:\n"
               "    sys.modules[name] = None  # as in the bundle: not there\n"
               "from app.cli import main\n"
               "sys.exit(main(sys.argv[1:]))\n")
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "SPECULA_DATA_DIR": str(tmp_path / "data")}
    result = subprocess.run([sys.executable, "-c", blocked, "--self-test", str(tmp_path / "shot.png")],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1].startswith("self-test ok: smollm2-135m + prompt lookup")


def test_a_torch_load_without_torch_is_one_clear_line(monkeypatch):
    from app.engine.backends import choose
    from app.engine.backends.llamacpp.lib import BackendUnavailable

    monkeypatch.setitem(sys.modules, "torch", None)
    assert not choose.torch_installed() and not choose.gpu_possible()
    with pytest.raises(BackendUnavailable, match="torch is not installed here"):
        choose.choose_backend("torch")


def test_a_file_llama_cpp_refuses_is_one_line_without_torch(tiny_paths, tmp_path):
    """auto retries a file llama.cpp refuses on torch; where torch is not there (the bundle) the
    refusal is the one line, not an ImportError's traceback from the retry's import."""
    from tests.llama_support import require_llama_cpp

    require_llama_cpp()
    data = tiny_paths["llama-q8"].read_bytes().replace(b"llama", b"llamb")  # an architecture llama.cpp lacks
    path = tmp_path / "unknown-arch.gguf"
    path.write_bytes(data)
    blocked = ("import sys\n"
               "sys.modules['torch'] = None  # as in the bundle: not there\n"
               "from app.cli import main\n"
               "sys.exit(main(sys.argv[1:]))\n")
    result = subprocess.run([sys.executable, "-c", blocked, "run", "-m", str(path), "-p", "hello", "-n", "4"],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr
    assert len(lines) == 1 and "unknown-arch.gguf" in lines[0], result.stderr
