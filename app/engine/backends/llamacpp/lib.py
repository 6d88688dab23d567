"""llama-cpp-python, imported once: its CPU backends loaded, its log routed to ours; what this
build can do (a GPU) and what it is (build_key: its files and this CPU, the key its self-test's
verdict and its measured step curves are kept under).

Whether the build runs on this CPU at all is llamacpp_probe's question (a child process);
choose.py asks it before the first load.
"""

from __future__ import annotations

import collections
import ctypes
import hashlib
import logging
import os
import shutil
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from app.common.atomic import read_json_object
from app.engine.errors import SpeculaError, first_line

log = logging.getLogger(__name__)

_lock = threading.Lock()
_binding: Any = None
_import_error: str | None = None
# llama.cpp's last error lines, for the one-line message when a load or decode fails.
_errors: collections.deque[str] = collections.deque(maxlen=8)
_log_callback: Any = None  # kept alive: llama.cpp holds a pointer to it


class BackendUnavailable(SpeculaError):
    """llama.cpp cannot be used here; the message says why in one line."""


def import_problem() -> str | None:
    """Why llama-cpp-python cannot be imported here, in one line; None if it can. Loads no
    backend (the self-test decides which CPU backend a variants build may load)."""
    try:
        import llama_cpp.llama_cpp  # noqa: F401
    except ImportError:
        return "llama-cpp-python is not installed (python3 packaging/bootstrap.py installs it)"
    except (OSError, RuntimeError) as exc:  # the shared library itself failed to load
        return f"llama.cpp's library failed to load: {first_line(exc, 200) or type(exc).__name__}"
    return None


def binding() -> Any:
    """The initialised ``llama_cpp.llama_cpp`` module; BackendUnavailable naming why not."""
    global _binding, _import_error
    with _lock:
        if _binding is not None:
            return _binding
        if _import_error is not None:
            raise BackendUnavailable(_import_error)
        _import_error = import_problem()
        if _import_error is not None:
            raise BackendUnavailable(_import_error)
        import llama_cpp.llama_cpp as lib
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


# The CPU backends the self-test found crashing here, comma-separated: set by the self-test's
# parent for its child (empty: ggml's own pick); unset, the cached verdict says.
SKIP_ENV = "SPECULA_LLAMA_CPU_SKIP"


def _load_cpu_backends(lib: Any) -> None:
    """llama_backend_init looks for loadable backends only in the executable's folder and the
    working directory: load the CPU backends from where the build keeps them, less those that
    crashed here in the self-test (an AMX backend on a virtual machine that does not grant tile
    state dies of SIGILL though CPUID offers AMX), ggml picking the best of the rest."""
    folder = cpu_backend_dir()
    if folder is None:
        return
    skip = skipped_cpu_variants()
    source = _folder_without(folder, skip) if skip else folder
    ggml = _loaded_ggml()
    ggml.ggml_backend_load_all_from_path.argtypes = [ctypes.c_char_p]
    try:
        ggml.ggml_backend_load_all_from_path(str(source).encode())
    finally:
        if source != folder:
            shutil.rmtree(source, ignore_errors=True)  # loaded libraries stay mapped


def skipped_cpu_variants() -> list[str]:
    """The CPU backends left out here: the self-test's parent names them for its child; otherwise
    the self-test's kept verdict does (choose.py runs the self-test before the first load)."""
    return variant_names(os.environ[SKIP_ENV].split(",") if SKIP_ENV in os.environ else cached_verdict().get("skip"))


def variant_names(value: Any) -> list[str]:
    """The CPU variants' names in a list read from a file or the environment; others dropped."""
    return [name for name in value if isinstance(name, str) and name.isidentifier()] if isinstance(value, list) else []


def verdict_file() -> Path:
    """Where the self-test's verdicts are kept, one per build_key."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "specula" / "llamacpp-probe.json"


def cached_verdict() -> dict[str, Any]:
    """The self-test's kept verdict for this build on this CPU; {} if none."""
    entry = read_json_object(verdict_file()).get(build_key())
    return entry if isinstance(entry, dict) else {}


def variant_name(path: Path) -> str:
    """'libggml-cpu-haswell.so' -> 'haswell'."""
    return path.name.split("ggml-cpu-", 1)[-1].split(".", 1)[0]


def cpu_variants() -> list[str]:
    """A variants build's CPU backends that this CPU's features admit, best first by ggml's own
    score (what it compares when it picks one); [] for a build with one CPU backend linked in."""
    folder = cpu_backend_dir()
    if folder is None:
        return []
    import llama_cpp.llama_cpp  # noqa: F401 - loads libggml-base, which the backends need by soname
    import _ctypes

    close = getattr(_ctypes, "dlclose", None) or getattr(_ctypes, "FreeLibrary")
    scored = []
    for path in sorted(p for pattern in _CPU_BACKENDS for p in folder.glob(pattern)):
        try:
            backend = ctypes.CDLL(str(path), mode=getattr(os, "RTLD_LOCAL", 0))
        except OSError:
            continue
        try:
            backend.ggml_backend_score.restype = ctypes.c_int
            scored.append((backend.ggml_backend_score(), variant_name(path)))
        except AttributeError:
            pass
        finally:
            close(backend._handle)
    return [name for score, name in sorted(scored, reverse=True) if score > 0]


def _folder_without(folder: Path, skip: list[str]) -> Path:
    """A temporary folder of links to the build's backends, less the CPU variants in `skip`."""
    view = Path(tempfile.mkdtemp(prefix="specula-ggml-"))
    for path in folder.iterdir():
        if "ggml-cpu-" in path.name and variant_name(path) in skip:
            continue
        try:
            (view / path.name).symlink_to(path)
        except OSError:  # no symbolic links here (Windows without the right)
            shutil.copy2(path, view / path.name)
    return view


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


def has_gpu() -> bool:
    """Whether this build offloads to a GPU (CUDA, Metal, Vulkan...); False where it cannot load."""
    try:
        return bool(binding().llama_supports_gpu_offload())
    except BackendUnavailable:
        return False


def build_key() -> str:
    """What a self-test's verdict or a measured step curve holds for: this build of the library
    (its files) and this CPU."""
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


