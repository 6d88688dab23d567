"""llama-cpp-python, imported once: its CPU backends loaded, its log routed to ours, and a probe
run once per library build and CPU, in a child process, before anything uses it.

A native build can crash where Python cannot catch it (an AVX-512 + AMX virtual machine killed
the process in llama_decode: facts.md), so the first use of a build on a CPU is a short run in a
child process (app.engine.backends.probe): load a small model, decode a few tokens, verify a
batch. Its verdict is cached per build and CPU; a failed probe means the torch backend, with
the reason in one line.
"""

from __future__ import annotations

import collections
import ctypes
import hashlib
import logging
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from app.engine.atomic import read_json_object, write_json_object
from app.engine.errors import SpeculaError

log = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 180
_lock = threading.Lock()
_binding: Any = None
_import_error: str | None = None
_probe_verdict: tuple[bool, str] | None = None
# llama.cpp's last error lines, for the one-line message when a load or decode fails.
_errors: collections.deque[str] = collections.deque(maxlen=8)
_log_callback: Any = None  # kept alive: llama.cpp holds a pointer to it


class BackendUnavailable(SpeculaError):
    """llama.cpp cannot be used here; the message says why in one line."""


def binding() -> Any:
    """The initialised ``llama_cpp.llama_cpp`` module; BackendUnavailable naming why not."""
    global _binding, _import_error
    with _lock:
        if _binding is not None:
            return _binding
        if _import_error is not None:
            raise BackendUnavailable(_import_error)
        try:
            import llama_cpp.llama_cpp as lib
        except ImportError:
            _import_error = "llama-cpp-python is not installed (python3 packaging/bootstrap.py installs it)"
        except (OSError, RuntimeError) as exc:  # the shared library itself failed to load
            _import_error = f"llama.cpp's library failed to load: {_first_line(exc)}"
        if _import_error is not None:
            raise BackendUnavailable(_import_error)
        _route_log(lib)
        _load_cpu_backends(lib)
        lib.llama_backend_init()
        _binding = lib
        return lib


def last_error() -> str:
    """The first error line llama.cpp logged since clear_errors() (the cause; later lines say
    that the caller failed), without its function's name; empty if none."""
    if not _errors:
        return ""
    line = _errors[0]
    head, sep, rest = line.partition(": ")
    return rest if sep and head.replace("_", "").isalnum() else line


def clear_errors() -> None:
    _errors.clear()


def _route_log(lib: Any) -> None:
    """llama.cpp prints every load step to stderr by default; send it to our log instead, and keep
    the error lines for our messages."""
    global _log_callback
    last_level = [0]

    def on_log(level: int, text: bytes, _user: Any) -> None:
        level = last_level[0] if level == 5 else level  # 5: continues the previous line
        last_level[0] = level
        line = text.decode("utf-8", "replace").rstrip()
        if level == 4 and line:  # GGML_LOG_LEVEL_ERROR
            _errors.append(line)
        if line:
            log.debug("llama.cpp: %s", line)

    _log_callback = lib.llama_log_callback(on_log)
    lib.llama_log_set(_log_callback, ctypes.c_void_p(0))


def library_dir() -> Path:
    import llama_cpp

    return Path(llama_cpp.__file__).resolve().parent / "lib"


_CPU_BACKENDS = ("libggml-cpu-*.so", "ggml-cpu-*.dll", "libggml-cpu-*.dylib")


def cpu_backend_dir() -> Path | None:
    """Where a build made as llama.cpp's releases are (GGML_BACKEND_DL, one CPU backend per CPU
    class, ggml picking the best this CPU runs) keeps its CPU backends: beside libllama in the
    bundle, the wheel's `bin` folder in site-packages where pip installed it. None for a build
    with one CPU backend linked into libggml."""
    lib = library_dir()
    for folder in (lib, lib.parent.parent / "bin"):
        if any(any(folder.glob(pattern)) for pattern in _CPU_BACKENDS):
            return folder
    return None


def _load_cpu_backends(lib: Any) -> None:
    """llama_backend_init looks for loadable backends only in the executable's folder and the
    working directory: load the CPU backends from where the build keeps them."""
    folder = cpu_backend_dir()
    if folder is None:
        return
    ggml = _loaded_ggml()
    ggml.ggml_backend_load_all_from_path.argtypes = [ctypes.c_char_p]
    ggml.ggml_backend_load_all_from_path(str(folder).encode())


def _loaded_ggml() -> ctypes.CDLL:
    """The libggml that libllama loaded, by its soname. A wheel holds libggml.so, .so.0 and
    .so.0.x as copies, not links: opening one by its path would load a second ggml, whose
    backends libllama never sees ("no backends are loaded")."""
    if sys.platform.startswith("linux"):
        return ctypes.CDLL("libggml.so.0", mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
    name = "libggml.dylib" if sys.platform == "darwin" else "ggml.dll"
    return ctypes.CDLL(str(library_dir() / name))


def system_info() -> str:
    """llama.cpp's own line on the CPU features its build uses here."""
    return binding().llama_print_system_info().decode("utf-8", "replace").strip()


def version() -> str:
    try:
        from importlib.metadata import version as package_version

        return package_version("llama_cpp_python")
    except Exception:  # noqa: BLE001 - not installed, or installed without metadata
        return "unknown"


# --- the probe --------------------------------------------------------------------------------

def build_key() -> str:
    """What a probe verdict holds for: this build of the library (its files) and this CPU."""
    digest = hashlib.sha256(version().encode())
    try:
        backends = cpu_backend_dir()
        files = sorted(library_dir().glob("*ggml*")) + sorted(library_dir().glob("*llama*"))
        for path in files + (sorted(backends.glob("*ggml-cpu-*")) if backends else []):
            stat = path.stat()
            digest.update(f"{path.name}:{stat.st_size}:{int(stat.st_mtime)}".encode())
    except OSError:
        pass
    digest.update(_cpu_identity().encode())
    return digest.hexdigest()[:32]


def _cpu_identity() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        import platform

        return platform.processor() or platform.machine()
    wanted = [line for line in text.splitlines() if line.startswith(("model name", "flags", "Features"))]
    return "\n".join(sorted(set(wanted)))


def _verdict_file() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "specula" / "llamacpp-probe.json"


def _read_verdicts() -> dict[str, Any]:
    return read_json_object(_verdict_file())


def _store_verdict(key: str, entry: dict[str, Any]) -> None:
    data = _read_verdicts()
    data[key] = entry
    try:
        write_json_object(_verdict_file(), data)
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
    from app.engine.backends.probe import demo_model

    model_path = demo_model() or fallback_model
    if model_path is None:
        return True, ""  # nothing to test with: the first load will tell
    if _probe_verdict is not None and not fresh:
        return _probe_verdict
    if os.environ.get("SPECULA_LLAMACPP_PROBE", "1") == "0":
        _probe_verdict = (True, "")
        return _probe_verdict
    key = build_key()
    cached = _read_verdicts().get(key)
    if not fresh and isinstance(cached, dict) and isinstance(cached.get("ok"), bool):
        _probe_verdict = (cached["ok"], str(cached.get("reason", "")))
        return _probe_verdict
    crashes = _count(cached.get("crashes")) if isinstance(cached, dict) and not fresh else 0
    ok, reason, kind = _run_probe(model_path)
    if ok or kind == CPU_VERDICT:
        _store_verdict(key, {"ok": ok, "reason": reason})
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


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 100 else 0


def _run_probe(model_path: str | Path | None) -> tuple[bool, str, str]:
    """(passed, why not, what kind of failure: CPU_VERDICT, CRASH or PASSING)."""
    # Through the `specula` entry point's hidden flag (app.cli.PROBE_FLAG): a bundled app's
    # executable is that entry point and has no `python -m`.
    entry = [sys.executable] if getattr(sys, "frozen", False) else [sys.executable, "-m", "app"]
    cmd = [*entry, "--llama-cpp-self-test", str(model_path)]
    root = Path(__file__).resolve().parents[3]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])))
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
    return False, lines[-1] if lines else f"the llama.cpp self-test failed (exit {returncode})", PASSING


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else type(exc).__name__
