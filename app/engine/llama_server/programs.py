"""Where llama.cpp's programs (llama-server, rpc-server) are: built by packaging/llama_build.py from
the binding's own sdist (same llama.cpp commit) and copied beside the environment's python, or
beside the bundled app, or named by SPECULA_LLAMA_BIN (a folder); and start_program, which starts
them so that they end with Specula."""

from __future__ import annotations

import ctypes
import logging
import os
import re
import signal
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Sequence

log = logging.getLogger(__name__)

SERVER = "llama-server"
RPC_SERVER = "rpc-server"


def _folders() -> list[Path]:
    if os.environ.get("SPECULA_LLAMA_BIN"):  # the user's choice, alone
        return [Path(os.environ["SPECULA_LLAMA_BIN"])]
    folders = [Path(sys.executable).parent]
    bundle = getattr(sys, "_MEIPASS", None)
    if bundle:
        folders.append(Path(bundle))
    return folders


def find_program(name: str) -> Path | None:
    """The program's path, or None where it was not built here."""
    exe = name + (".exe" if os.name == "nt" else "")
    for folder in _folders():
        candidate = folder / exe
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None  # not one on PATH: another llama.cpp commit would not compare with the binding


def missing_reason(name: str) -> str:
    return (f"{name} is not built here (python3 packaging/bootstrap.py builds it beside the environment; "
            f"SPECULA_LLAMA_BIN names another folder)")


# --- Children that die with Specula ------------------------------------------------------------
# A llama-server or rpc-server left behind by a killed Specula keeps its port and memory. Linux:
# the kernel signals the child when its parent goes (PR_SET_PDEATHSIG). Windows: a job object
# whose handle Windows closes, killing its processes, when Specula ends. Other POSIX systems
# (macOS): a shell watchdog that reads a pipe only Specula holds and kills the child at its EOF.

_PR_SET_PDEATHSIG = 1
_spawner: ThreadPoolExecutor | None = None
_spawner_lock = threading.Lock()
_kept_for_life: list[object] = []  # pipe ends and job handles: closed by the OS when Specula ends


def start_program(cmd: Sequence[str], **popen: Any) -> subprocess.Popen:
    """subprocess.Popen(cmd, **popen) for llama.cpp's programs, tied to Specula's life: the
    child goes when Specula goes, however it goes (SIGKILL included), on a best-effort basis
    outside Linux."""
    if sys.platform.startswith("linux"):
        prctl = _libc_prctl()
        if prctl is not None:
            in_child = _die_with(os.getpid(), prctl)
            return _on_lasting_thread(lambda: subprocess.Popen(cmd, preexec_fn=in_child, **popen))
    process = subprocess.Popen(cmd, **popen)
    try:
        _kill_with_job(process) if os.name == "nt" else _watchdog(process, Path(cmd[0]).name)
    except Exception as exc:  # the child runs anyway; only its clean-up after a crash is lost
        log.warning("%s may outlive Specula if Specula is killed: %s", Path(cmd[0]).name, exc)
    return process


def _libc_prctl() -> Callable[..., int] | None:
    """libc's prctl, looked up in the parent: nothing is loaded between fork and exec."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    prctl.argtypes, prctl.restype = [ctypes.c_int, ctypes.c_ulong], ctypes.c_int
    return prctl


def _die_with(parent: int, prctl: Callable[..., int]) -> Callable[[], None]:
    def in_child() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)  # llama.cpp's programs have nothing to save
        if os.getppid() != parent:  # the parent died before prctl: no signal would come now
            os._exit(1)
    return in_child


def _on_lasting_thread(start: Callable[[], subprocess.Popen]) -> subprocess.Popen:
    """PR_SET_PDEATHSIG fires when the *thread* that forked the child ends, not the process:
    a llama-server started from a QThread or a pool thread would die with that thread. Starts
    off the main thread run on one thread that lasts as long as the process."""
    if threading.current_thread() is threading.main_thread():
        return start()
    global _spawner
    with _spawner_lock:
        if _spawner is None:
            _spawner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="specula-spawner")
    return _spawner.submit(start).result()


# POSIX sh. `read` returns when Specula's end of the pipe closes (Specula is gone): then the child
# is killed, if that pid is still our program (a reused pid is left alone). A poller ends the
# watchdog when the child ends first, so none lingers after a normal stop.
_WATCHDOG = ('( while kill -0 "$1" 2>/dev/null; do sleep 1; done; kill $$ ) & poller=$!; read _; '
             'kill $poller 2>/dev/null; case "$(ps -o comm= -p "$1")" in *"$2") kill -KILL "$1";; esac')


def _watchdog(process: subprocess.Popen, name: str) -> None:
    read_end, write_end = os.pipe()  # not inheritable: only Specula holds the write end
    try:
        subprocess.Popen(["/bin/sh", "-c", _WATCHDOG, "specula-watchdog", str(process.pid), name[:15]],
                         stdin=read_end, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True)  # a Ctrl-C to the terminal's group leaves it to its job
    except OSError:
        os.close(write_end)
        raise
    finally:
        os.close(read_end)
    _kept_for_life.append(write_end)


def _kill_with_job(process: subprocess.Popen) -> None:
    """Windows: the child in a job that kills its processes when its last handle closes (ours,
    closed by Windows when Specula ends)."""
    from ctypes import wintypes

    class Basic(ctypes.Structure):
        _fields_ = [("user_time", ctypes.c_int64), ("job_time", ctypes.c_int64), ("flags", wintypes.DWORD),
                    ("min_ws", ctypes.c_size_t), ("max_ws", ctypes.c_size_t), ("processes", wintypes.DWORD),
                    ("affinity", ctypes.c_size_t), ("priority", wintypes.DWORD), ("scheduling", wintypes.DWORD)]

    class Extended(ctypes.Structure):
        _fields_ = [("basic", Basic), ("io", ctypes.c_uint64 * 6), ("process_memory", ctypes.c_size_t),
                    ("job_memory", ctypes.c_size_t), ("peak_process", ctypes.c_size_t), ("peak_job", ctypes.c_size_t)]

    kernel32 = ctypes.WinDLL("kernel32", use_last_error=True)  # type: ignore[attr-defined]
    kernel32.CreateJobObjectW.restype = wintypes.HANDLE
    job = kernel32.CreateJobObjectW(None, None)
    info = Extended()
    info.basic.flags = 0x2000  # JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE
    if not job or not kernel32.SetInformationJobObject(wintypes.HANDLE(job), 9, ctypes.byref(info), ctypes.sizeof(info)) \
            or not kernel32.AssignProcessToJobObject(wintypes.HANDLE(job), wintypes.HANDLE(int(process._handle))):
        raise OSError(f"job object: error {ctypes.get_last_error()}")
    _kept_for_life.append(job)


# What a crashing llama.cpp program prints after its cause: ggml_abort's backtrace through gdb
# ("#0  0x... in ...", "[New LWP ...]", ptrace's complaints), which told a user nothing.
_BACKTRACE = re.compile(r"^(#\d+\s|\[New |\[Thread |\[Inferior |Thread \d|ptrace|Could not attach|No stack|"
                        r"0x[0-9a-fA-F]+ in |\(gdb\)|warning: (process|Unable))")
_CAUSE = re.compile(r"(?i)error|fail|cannot|could not|unable|assert|abort|in use|refused|no such|denied|out of memory")


def telling_line(lines: list[str]) -> str:
    """The line of a program's output that says why it stopped: the last one naming a failure,
    backtrace lines left out; else its last line ("no output" where none)."""
    kept = [line for line in lines if line.strip() and not _BACKTRACE.match(line.strip())]
    causes = [line for line in kept if _CAUSE.search(line)]
    return (causes or kept or ["no output"])[-1].strip()
