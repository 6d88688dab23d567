"""Run `specula run -m FILE -p hi -n 2 --backend BACKEND` for many (backend, file) pairs, each in a
forked child under a memory cap and a time limit, importing the app once: a fresh `python -m app`
per file costs seconds of imports on a busy 2-core machine. A native crash (llama.cpp's
GGML_ASSERT aborts the process) kills only that file's child.

    python -m tests.hostile_run_driver JOBS.json SECONDS

JOBS.json holds [[backend, path], ...]; prints a JSON list, one {"rc", "stderr", "seconds"} per
job in order. rc is the child's exit status, or minus the signal that ended it (SIGALRM: the time
limit). The children's stdout is discarded.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import sys
import tempfile
import time

MEMORY_CAP = 4 * 2**30  # address space, as `ulimit -v`: no file may make a load allocate more


def _child(backend: str, path: str, seconds: int, err_fd: int) -> None:
    os.dup2(err_fd, 2)
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))
    signal.alarm(seconds)  # SIGALRM's default action ends the child: a signal death
    code = 70
    try:
        from app.cli import main

        code = main(["run", "-m", path, "-p", "hi", "-n", "2", "--backend", backend])
    except BaseException:  # noqa: BLE001 - `python -m app` would print this traceback too
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code if isinstance(code, int) else 70)


def run_one(backend: str, path: str, seconds: int) -> dict:
    with tempfile.TemporaryFile() as err:
        started = time.monotonic()
        pid = os.fork()
        if pid == 0:
            _child(backend, path, seconds, err.fileno())
        _, status = os.waitpid(pid, 0)
        elapsed = time.monotonic() - started
        err.seek(0)
        text = err.read().decode("utf-8", "replace")
    rc = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    return {"rc": rc, "stderr": text, "seconds": round(elapsed, 2)}


def main(argv: list[str]) -> int:
    with open(argv[0]) as f:
        jobs = json.load(f)
    seconds = int(argv[1])
    import app.cli  # noqa: F401 - imported once, before the forks
    import app.engine.loader  # noqa: F401

    print(json.dumps([run_one(backend, path, seconds) for backend, path in jobs]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
