"""The bundle's llama.cpp on CPU classes other than this machine's.

`packaging/build_bundle.py` bundles llama.cpp built as its releases are: one CPU backend per CPU
class (packaging/llama_build.py --variants), ggml picking the best one the CPU runs when the
library starts. These tests run llama.cpp's self-test (app.engine.backends.llamacpp.probe: load the
SmolLM2 demo, decode, verify a batch after a rollback) with that build, natively and under
qemu's user-mode emulation of older CPUs (qemu's `-cpu` sets what CPUID reports and which
instructions run): Haswell (AVX2, no AVX-512), Ivy Bridge (AVX, no AVX2) and Nehalem (SSE4.2, no
AVX). The venv's own portable build, which targets AVX2, dies on Nehalem: what the variants are for.

They need the variants build installed into a folder (SPECULA_LLAMA_VARIANTS, as .ci/run does:
`pip install --no-deps --target DIR <wheel>`) and skip without it; the emulated runs need
qemu-x86_64 (Debian's qemu-user) and skip without it.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
VARIANTS = str(Path(os.environ["SPECULA_LLAMA_VARIANTS"]).resolve()) if os.environ.get("SPECULA_LLAMA_VARIANTS") else None
# qemu's user mode runs this machine's own Python on an emulated x86-64 CPU: x86-64 hosts only.
QEMU = shutil.which("qemu-x86_64") if platform.machine() in ("x86_64", "AMD64") else None

pytestmark = pytest.mark.skipif(not VARIANTS, reason="SPECULA_LLAMA_VARIANTS (the variants build's folder) not set")


def self_test(tmp_path: Path, llama_dir: str | None, cpu: str | None = None,
              env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """llama.cpp's self-test child in a process of its own, with the build in `llama_dir` (None:
    the venv's), on the CPU qemu emulates (None: this one), with an empty cache: ggml's own pick
    of CPU backend, by what CPUID offers."""
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"),
               PYTHONPATH=os.pathsep.join(p for p in (llama_dir, str(ROOT)) if p), **(env or {}))
    cmd = [sys.executable, "-m", "app.engine.backends.llamacpp.probe"]
    if cpu is not None:
        cmd = [QEMU, "-cpu", cpu, *cmd]
        # numpy (which llama_cpp imports) brings OpenBLAS, whose own CPU detection picks its Haswell
        # kernels under qemu's user mode whatever -cpu says (seen with numpy 2.3 and 2.4 on an AMD
        # EPYC host: SIGILL on import on an emulated Nehalem, before llama.cpp loads). These tests
        # are about ggml's pick, so OpenBLAS is held to kernels the oldest class here runs.
        env["OPENBLAS_CORETYPE"] = "Nehalem"
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)


def features(line: str) -> set[str]:
    """The CPU features llama.cpp says its chosen backend uses ('AVX2 = 1' -> AVX2)."""
    return set(re.findall(r"(\w+) = 1", line))


# The app's way: the self-test's parent (ggml's pick first, the next best while one crashes),
# then the demo decoded in this process with the backends it left in.
_APP_WAY = """
from app.engine.backends.llamacpp import lib, probe
ok, why = probe.probe(fresh=True)
assert ok, why
print("skipped:", ",".join(probe.skipped_variants()), "of", ",".join(lib.cpu_variants()))
print(probe.run(probe.demo_model()))
"""


def app_way(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"), PYTHONPATH=os.pathsep.join((VARIANTS, str(ROOT))),
               SPECULA_LLAMACPP_PROBE="1", **env)
    env.pop("SPECULA_LLAMA_CPU_SKIP", None)
    return subprocess.run([sys.executable, "-c", _APP_WAY], env=env, capture_output=True, text=True,
                          timeout=600, cwd=ROOT)


def test_the_variants_build_runs_here_with_its_best_backend(tmp_path):
    """The best CPU backend that runs here: ggml's pick, or where that crashes (an AMX backend on
    a virtual machine that does not grant tile state dies of SIGILL) the next best."""
    from app.engine.backends.llamacpp import lib as llamacpp_lib

    done = app_way(tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    skipped, line = done.stdout.strip().splitlines()[-2:]
    assert line.startswith("ok: SmolLM2"), done.stdout
    left_out, offered = (part.split(",") if part else [] for part in skipped.removeprefix("skipped: ").split(" of "))
    assert left_out == offered[:len(left_out)] and len(left_out) < len(offered), skipped
    if left_out:  # each one left out crashes here on its own
        alone = self_test(tmp_path, VARIANTS, env={"SPECULA_LLAMA_CPU_SKIP": ""})
        assert alone.returncode < 0, alone.stdout
    assert len(list((Path(VARIANTS) / "bin").glob("libggml-cpu-*"))) >= (8 if platform.machine() == "x86_64" else 1)
    # Its backend uses at least what the portable build does, wherever that runs here.
    portable = self_test(tmp_path, None)
    if portable.returncode == 0:
        assert features(portable.stdout) - {"LLAMAFILE", "OPENMP", "REPACK"} <= features(line)
    assert llamacpp_lib.cpu_backend_dir() is None  # the venv's portable build: one backend, linked in


@pytest.mark.skipif(QEMU is None, reason="qemu-x86_64 (Debian's qemu-user) not installed, or not an x86-64 host")
@pytest.mark.parametrize(("cpu", "has", "lacks"), [
    ("Haswell", {"AVX2", "FMA", "F16C"}, {"AVX512"}),
    ("IvyBridge", {"AVX", "F16C"}, {"AVX2", "FMA"}),
    ("Nehalem", {"SSSE3"}, {"AVX", "AVX2"}),
])
def test_the_variants_build_runs_on_an_older_cpu_class(tmp_path, cpu, has, lacks):
    done = self_test(tmp_path, VARIANTS, cpu)
    assert done.returncode == 0, done.stderr[-2000:]
    line = done.stdout.strip()
    assert line.startswith("ok: SmolLM2"), line  # the probe checked the batch against the steps
    assert has <= features(line) and not lacks & features(line), line


@pytest.mark.skipif(QEMU is None, reason="qemu-x86_64 (Debian's qemu-user) not installed, or not an x86-64 host")
def test_the_bundles_layout_runs_on_an_older_cpu_class(tmp_path):
    """packaging/specula.spec puts the CPU backends beside libllama (the wheel keeps them in a
    `bin` folder beside the package): the same build laid out so, on an emulated AVX2 CPU."""
    bundle = tmp_path / "bundle"
    shutil.copytree(Path(VARIANTS) / "llama_cpp", bundle / "llama_cpp")
    for backend in (Path(VARIANTS) / "bin").glob("libggml-cpu-*"):
        shutil.copy2(backend, bundle / "llama_cpp" / "lib")
    done = self_test(tmp_path, str(bundle), "Haswell")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "AVX2" in features(done.stdout) and "AVX512" not in features(done.stdout), done.stdout


@pytest.mark.skipif(QEMU is None, reason="qemu-x86_64 (Debian's qemu-user) not installed, or not an x86-64 host")
def test_the_portable_build_needs_avx2(tmp_path):
    """What the README says of the venv's build: it stops with an illegal instruction on a CPU
    without AVX2 (the probe's child process is what keeps that from the user)."""
    done = self_test(tmp_path, None, "Nehalem")
    assert done.returncode in (-signal.SIGILL, 128 + signal.SIGILL), (done.returncode, done.stdout, done.stderr[-500:])


def test_a_crashing_best_backend_is_left_out_for_the_next_best(tmp_path):
    """The fallback wherever CI runs: the self-test's child dies of SIGILL while it has ggml's own
    pick (SPECULA_PROBE_FAULT=ill-best), so the parent leaves that backend out, the next best
    passes for real, and the verdict keeps the choice for the next start."""
    done = app_way(tmp_path, SPECULA_PROBE_FAULT="ill-best")
    assert done.returncode == 0, done.stderr[-2000:]
    skipped, line = done.stdout.strip().splitlines()[-2:]
    left_out, offered = (part.split(",") for part in skipped.removeprefix("skipped: ").split(" of "))
    assert left_out == offered[:1] and line.startswith("ok: SmolLM2"), done.stdout
    assert "CPU backend crashed here in the self-test and is left out" in done.stderr
    kept = json.loads((tmp_path / "cache" / "specula" / "llamacpp-probe.json").read_text())
    assert [entry.get("skip") for entry in kept.values()] == [left_out], kept
