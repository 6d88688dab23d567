"""Install llama-cpp-python, the binding through which llama.cpp runs Specula's models.

Standard library only (the bootstrap imports it before anything is installed). PyPI carries
llama-cpp-python as source only, so it is built once, the way llama.cpp's own releases are built:
never GGML_NATIVE (a native build carries the build machine's instructions, and crashed on an
AVX-512 + AMX virtual machine); the portable build targets AVX2 + FMA + F16C, which every x86-64
desktop of the last ten years runs, and the bundle's build adds one CPU backend per CPU class
(GGML_BACKEND_DL + GGML_CPU_ALL_VARIANTS), chosen at run time. The wheel is kept in
~/.cache/specula/wheels, keyed by version and build flags, so later set-ups install in seconds.
A failed build is one line: the app then runs its models on torch.

SPECULA_LLAMA_CMAKE_ARGS adds CMake flags (e.g. -DGGML_CUDA=on for a CUDA build); an
llama-cpp-python the environment already has is never replaced.

llama.cpp's own programs, `llama-server` (its speculation, every --spec-type: the peer Specula's
bench measures against, and an engine) and `rpc-server` (a worker holding part of a model), are
built from the same sdist, so from the same llama.cpp commit as the binding: portable, statically
linked, no web UI (its prebuilt UI would be downloaded at build time), kept in
~/.cache/specula/llama-programs-<fingerprint>/bin and copied beside the venv's python.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

LLAMA_CPP_PYTHON = "llama-cpp-python==0.3.36"
_QUIET = ["-DLLAVA_BUILD=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
          "-DLLAMA_BUILD_TOOLS=OFF", "-DLLAMA_BUILD_SERVER=OFF"]
PORTABLE = ["-DGGML_NATIVE=OFF", *_QUIET]
ALL_VARIANTS = ["-DGGML_NATIVE=OFF", "-DGGML_BACKEND_DL=ON", "-DGGML_CPU_ALL_VARIANTS=ON", *_QUIET]
# Minutes of one core to build (measured on a 2-core AMD EPYC Zen 4 VM: the portable build 622 s
# on a busy machine; the 14 CPU variants 10.7 minutes with the test suite running beside it).
_CORE_MINUTES = {"portable": 20, "variants": 22}


# installed name -> llama.cpp's CMake target
PROGRAMS = {"llama-server": "llama-server", "rpc-server": "ggml-rpc-server"}
PROGRAM_ARGS = ["-DGGML_NATIVE=OFF", "-DBUILD_SHARED_LIBS=OFF", "-DGGML_RPC=ON", "-DLLAMA_BUILD_SERVER=ON",
                "-DLLAMA_BUILD_TOOLS=ON", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
                "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_OPENSSL=OFF",
                "-DCMAKE_BUILD_TYPE=Release"]


def cmake_args(variants: bool = False) -> list[str]:
    extra = os.environ.get("SPECULA_LLAMA_CMAKE_ARGS", "").split()
    return [*(ALL_VARIANTS if variants else PORTABLE), *extra]


def fingerprint(variants: bool = False) -> str:
    return hashlib.sha256(" ".join([LLAMA_CPP_PYTHON, *cmake_args(variants)]).encode()).hexdigest()[:16]


def wheel_dir(variants: bool = False) -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "specula" / "wheels" / f"llama-cpp-python-{fingerprint(variants)}"


def installed(python: Path) -> bool:
    probe = "import importlib.metadata as m; m.version('llama_cpp_python')"
    return subprocess.run([str(python), "-c", probe], capture_output=True).returncode == 0


def build_wheel(python: Path, variants: bool = False) -> Path | None:
    """The wheel for this configuration: the cached one, or built now (None if the build failed)."""
    folder = wheel_dir(variants)
    found = sorted(folder.glob("llama_cpp_python-*.whl"))
    if found:
        return found[-1]
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / "build.log"
    cores = os.cpu_count() or 2
    minutes = max(2, round(_CORE_MINUTES["variants" if variants else "portable"] / cores))
    print(f"building llama.cpp once, about {minutes} minutes on {cores} cores (log: {log})", flush=True)
    env = dict(os.environ, CMAKE_ARGS=" ".join(cmake_args(variants)), CMAKE_BUILD_PARALLEL_LEVEL=str(cores))
    cmd = [str(python), "-m", "pip", "wheel", "--disable-pip-version-check", "--no-deps", "--no-binary",
           "llama-cpp-python", "--no-cache-dir", "-w", str(folder), LLAMA_CPP_PYTHON]
    started = time.monotonic()
    with open(log, "w") as out:
        done = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    found = sorted(folder.glob("llama_cpp_python-*.whl"))
    if done.returncode != 0 or not found:
        return None
    print(f"built llama.cpp in {(time.monotonic() - started) / 60:.1f} minutes", flush=True)
    return found[-1]


def ensure_llama(python: Path, variants: bool = False) -> bool:
    """llama-cpp-python in the environment of `python`: kept if there, else built (once) and
    installed. False, after one line saying so, where it cannot be built."""
    if installed(python):
        return True
    return _install_built(python, variants, [], "; Specula will run models on torch")


def install_into(python: Path, target: Path, variants: bool = False) -> bool:
    """The wheel (built once) installed into the folder `target` alone, not into an environment:
    what a bundle takes its llama.cpp from. False, after one line saying why, where it cannot."""
    shutil.rmtree(target, ignore_errors=True)
    return _install_built(python, variants, ["--quiet", "--no-deps", "--target", str(target)], "")


def _install_built(python: Path, variants: bool, pip_args: list[str], consequence: str) -> bool:
    """Build the wheel (once) and pip-install it with `pip_args`; one line ending in
    `consequence` where either step fails."""
    wheel = build_wheel(python, variants)
    if wheel is None:
        print(f"llama.cpp could not be built here (see {wheel_dir(variants) / 'build.log'}){consequence}", flush=True)
        return False
    cmd = [str(python), "-m", "pip", "install", "--disable-pip-version-check", *pip_args, str(wheel)]
    print("+", " ".join(cmd), flush=True)
    if subprocess.run(cmd).returncode != 0:
        print(f"llama.cpp's wheel could not be installed{consequence}", flush=True)
        return False
    return True


def programs_dir() -> Path:
    extra = os.environ.get("SPECULA_LLAMA_CMAKE_ARGS", "").split()
    key = hashlib.sha256(" ".join([LLAMA_CPP_PYTHON, *PROGRAM_ARGS, *extra]).encode()).hexdigest()[:16]
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "specula" / f"llama-programs-{key}"


def build_programs(python: Path) -> Path | None:
    """The folder holding llama-server and rpc-server built from the binding's sdist: the cached
    one, or built now (None, after one line, where that fails)."""
    folder = programs_dir()
    bin_dir = folder / "bin"
    if all((bin_dir / name).is_file() for name in PROGRAMS):
        return bin_dir
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / "build.log"
    cores = os.cpu_count() or 2
    print(f"building llama-server and rpc-server once, about {max(2, round(12 / cores))} minutes on {cores} cores "
          f"(log: {log})", flush=True)
    started = time.monotonic()
    with open(log, "w") as out:
        built = _build_programs_into(python, folder, cores, out)
    if built is None:
        print(f"llama-server could not be built here (see {log}); Specula runs its own engine only", flush=True)
        return None
    print(f"built llama-server and rpc-server in {(time.monotonic() - started) / 60:.1f} minutes", flush=True)
    return built


def _build_programs_into(python: Path, folder: Path, cores: int, out) -> Path | None:
    src, build, staged = folder / "src", folder / "build", folder / "bin.partial"
    for path in (src, staged):
        shutil.rmtree(path, ignore_errors=True)
    steps = [
        [str(python), "-m", "pip", "download", "--disable-pip-version-check", "--no-deps", "--no-binary", ":all:",
         "-d", str(src), LLAMA_CPP_PYTHON],
    ]
    if not _run_all(steps, out):
        return None
    archives = sorted(src.glob("llama_cpp_python-*.tar.gz"))
    if not archives:
        return None
    shutil.unpack_archive(str(archives[-1]), str(src))
    tree = next(src.glob("llama_cpp_python-*/vendor/llama.cpp"), None)
    if tree is None:
        return None
    extra = os.environ.get("SPECULA_LLAMA_CMAKE_ARGS", "").split()
    steps = [["cmake", "-S", str(tree), "-B", str(build), *PROGRAM_ARGS, *extra],
             ["cmake", "--build", str(build), "--config", "Release", "-j", str(cores), "--target", *PROGRAMS.values()]]
    if not _run_all(steps, out):
        return None
    staged.mkdir()
    for name, target in PROGRAMS.items():
        found = next((p for p in (build / "bin" / target, build / "bin" / "Release" / target) if p.is_file()), None)
        if found is None:
            return None
        shutil.copy2(found, staged / name)
    shutil.rmtree(folder / "bin", ignore_errors=True)
    staged.rename(folder / "bin")  # complete or absent: never a half-copied folder that looks built
    shutil.rmtree(src, ignore_errors=True)
    return folder / "bin"


def _run_all(commands: list[list[str]], out) -> bool:
    for cmd in commands:
        out.write("+ " + " ".join(cmd) + "\n")
        out.flush()
        try:
            if subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT).returncode != 0:
                return False
        except OSError as exc:  # cmake missing
            out.write(f"{exc}\n")
            return False
    return True


def install_programs(python: Path) -> bool:
    """llama-server and rpc-server (built once) copied beside `python`, where Specula finds them
    (app.engine.llama_server.programs). False, after one line, where they cannot be built."""
    built = build_programs(python)
    if built is None:
        return False
    for name in PROGRAMS:
        target = python.parent / name
        shutil.copy2(built / name, target.with_suffix(".partial"))
        os.replace(target.with_suffix(".partial"), target)
    return True


if __name__ == "__main__":  # python3 packaging/llama_build.py [--variants] [--target DIR]: no venv touched
    parser = argparse.ArgumentParser(description="Build llama-cpp-python's wheel once (cached); "
                                     "with --target, install it into that folder alone.")
    parser.add_argument("--variants", action="store_true", help="one CPU backend per CPU class (for a bundle)")
    parser.add_argument("--target", type=Path, help="install the wheel into this folder (pip --target)")
    parser.add_argument("--programs", action="store_true", help="build llama-server and rpc-server instead")
    args = parser.parse_args()
    if args.programs:
        built = build_programs(Path(sys.executable))
        print(built or "build failed")
        sys.exit(0 if built else 1)
    if args.target is not None:
        sys.exit(0 if install_into(Path(sys.executable), args.target, args.variants) else 1)
    path = build_wheel(Path(sys.executable), args.variants)
    print(path or "build failed")
    sys.exit(0 if path else 1)
