"""llama.cpp's programs die with Specula (issue 58, item 4): a `specula run --engine llama-server`,
`specula serve --engine llama-server` or `specula rpc-worker` that is killed (SIGKILL) or told to
stop (SIGTERM, SIGHUP) leaves no llama-server or rpc-server behind, and `specula serve` stopped
by SIGTERM or SIGHUP saves its -lcd n-gram cache as on Ctrl-C.

Real processes: Specula as `python -m app`, its children found in /proc (Linux only). Every test
kills whatever it started, in `finally`, and is bounded in time."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

from app.engine.llama_server.process import free_port
from app.engine.llama_server.programs import RPC_SERVER, SERVER
from tests.engine.test_llama_server import _require_server

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "TRANSFORMERS_VERBOSITY": "error", "HF_HUB_OFFLINE": "1"}
SIGNALS = [signal.SIGKILL, signal.SIGTERM, signal.SIGHUP]
GONE_S = 5.0  # how long a child may take to go once Specula has gone
STOP_S = 30.0  # how long Specula may take to stop after SIGTERM or SIGHUP (it stops its child first)


def _stat(pid: int) -> list[str] | None:
    """/proc/PID/stat's fields after the command name (state first), None for no such process."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2:].split()


def _alive(pid: int) -> bool:
    """Running: a zombie counts as gone (a container's pid 1 may never reap an orphan)."""
    fields = _stat(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def _children(parent: int, name: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        fields = _stat(int(entry.name)) if entry.name.isdigit() else None
        if fields is not None and int(fields[1]) == parent and _comm(int(entry.name)) == name:
            found.append(int(entry.name))
    return found


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _wait_for(condition, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def _hangup_as_default() -> None:
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


class Specula:
    """`python -m app ARGS` with its stderr in a file; remembers the children it was seen with."""

    def __init__(self, args: list[str], log: Path) -> None:
        self.log = log
        with open(log, "wb") as out:
            # SIGHUP as a terminal gives it: a suite run under nohup would hand its ignoring on,
            # and Specula rightly keeps an ignored SIGHUP ignored.
            self.proc = subprocess.Popen([sys.executable, "-m", "app", *args], cwd=ROOT, env=ENV,
                                         stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                         preexec_fn=_hangup_as_default)
        self.seen: list[tuple[int, str]] = []

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def child(self, name: str, timeout_s: float = 120.0) -> int:
        """The pid of its child `name`, once it has one (fails if Specula ends first)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.proc.poll() is None:
            found = _children(self.proc.pid, name)
            if found:
                self.seen.append((found[0], name))
                return found[0]
            time.sleep(0.05)
        pytest.fail(f"no {name} under Specula (exit {self.proc.poll()}): {self.text()[-2000:]}")

    def wait_for_line(self, pattern: str, timeout_s: float = 180.0) -> re.Match:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.proc.poll() is None:
            found = re.search(pattern, self.text())
            if found:
                return found
            time.sleep(0.1)
        pytest.fail(f"no {pattern!r} from Specula (exit {self.proc.poll()}): {self.text()[-2000:]}")

    def stopped_by(self, sig: signal.Signals) -> int:
        """Send `sig`, wait for Specula to end; its exit code (-9 for SIGKILL)."""
        assert self.proc.poll() is None, self.text()[-2000:]
        self.proc.send_signal(sig)
        return self.proc.wait(STOP_S)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        for pid, name in self.seen:  # nothing outlives the test, even where the code under test failed
            if _alive(pid) and _comm(pid) == name:
                os.kill(pid, signal.SIGKILL)


@contextmanager
def specula(args: list[str], log: Path) -> Iterator[Specula]:
    started = Specula(args, log)
    try:
        yield started
    finally:
        started.close()


def _assert_gone(pid: int, name: str, text: str) -> None:
    assert _wait_for(lambda: not _alive(pid), GONE_S), f"{name} {pid} outlived Specula: {text[-2000:]}"


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    from tests.tiny_gguf import TinySpec, write_tiny_gguf

    return write_tiny_gguf(tmp_path_factory.mktemp("children") / "tiny.gguf", TinySpec(arch="llama", qtype="F32"))


def _exit_after(sig: signal.Signals, clean: int) -> int:
    return -signal.SIGKILL if sig == signal.SIGKILL else clean


# --- the helper itself, without llama.cpp ---------------------------------------------------------

_STARTER = """
import sys, threading, time, subprocess
from app.engine.llama_server import programs
started = []
def start():
    if sys.argv[1] == "fallback":  # what macOS gets: the shell watchdog on a pipe
        process = subprocess.Popen(["sleep", "120"])
        programs._watchdog(process, "sleep")
        started.append(process)
    else:
        started.append(programs.start_program(["sleep", "120"]))
thread = threading.Thread(target=start)  # as the window starts llama-server from a QThread
thread.start()
thread.join()  # the thread that started the child has ended
print(started[0].pid, flush=True)
time.sleep(120)
"""


@pytest.mark.parametrize("how", ["linux", "fallback"])
def test_a_child_started_from_a_thread_outlives_the_thread_and_dies_with_the_process(how):
    parent = subprocess.Popen([sys.executable, "-c", _STARTER, how], cwd=ROOT, env=ENV, stdout=subprocess.PIPE,
                              text=True)
    child = 0
    try:
        child = int(parent.stdout.readline())
        time.sleep(1.0)  # PR_SET_PDEATHSIG tied to the ended thread would have fired by now
        assert _alive(child), "the child died with the thread that started it"
        parent.kill()
        parent.wait(10)
        _assert_gone(child, "sleep", "")
    finally:
        parent.kill()
        parent.wait(10)
        if child and _alive(child) and _comm(child) == "sleep":
            os.kill(child, signal.SIGKILL)


# --- Specula's commands, with llama.cpp's programs ---------------------------------------------------

@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_run_on_llama_server_leaves_no_llama_server(sig, tiny_model, tmp_path):
    """The reply is held at llama-server's start: an RPC "worker" that accepts and never answers
    keeps llama-server connecting (and Specula waiting for it) for as long as the test needs."""
    _require_server()
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(4)
        rpc = f"127.0.0.1:{silent.getsockname()[1]}"
        with specula(["run", "-m", str(tiny_model), "-p", "hi", "-n", "4", "-t", "1", "--rpc", rpc],
                     tmp_path / "run.log") as run:
            server = run.child(SERVER)
            code = run.stopped_by(sig)
            _assert_gone(server, SERVER, run.text())
            assert code == _exit_after(sig, 130), run.text()[-2000:]


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_rpc_worker_leaves_no_rpc_server(sig, tmp_path):
    _require_server()
    with specula(["rpc-worker", "--port", str(free_port()), "-t", "1"], tmp_path / "worker.log") as worker:
        child = worker.child(RPC_SERVER)
        code = worker.stopped_by(sig)
        _assert_gone(child, RPC_SERVER, worker.text())
        assert code == _exit_after(sig, 0), worker.text()[-2000:]


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_serve_on_llama_server_leaves_no_llama_server(sig, tiny_model, tmp_path):
    _require_server()
    with specula(["serve", "--engine", "llama-server", "-m", str(tiny_model), "-t", "1", "--port", "0"],
                 tmp_path / "serve.log") as serve:
        serve.wait_for_line(r" at (http://\S+)/v1;")
        server = serve.child(SERVER, timeout_s=5)
        code = serve.stopped_by(sig)
        _assert_gone(server, SERVER, serve.text())
        assert code == _exit_after(sig, 0), serve.text()[-2000:]
        if sig != signal.SIGKILL:
            assert "specula: server stopped" in serve.text()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
def test_serve_saves_its_ngram_cache_on_sigterm_and_sighup(sig, tiny_model, tmp_path):
    cache = tmp_path / "learned.ngc"
    args = ["serve", "-m", str(tiny_model), "--device", "cpu", "--dtype", "float32", "--spec-type", "ngram-cache",
            "-lcd", str(cache), "--port", "0"]
    with specula(args, tmp_path / "serve.log") as serve:
        url = serve.wait_for_line(r" at (http://\S+)/v1;").group(1)
        body = json.dumps({"prompt": "The model reads the file.", "max_tokens": 16, "temperature": 0}).encode()
        request = urllib.request.Request(f"{url}/v1/completions", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as answer:
            assert answer.status == 200
        assert not cache.exists()  # written as the server stops
        assert serve.stopped_by(sig) == 0, serve.text()[-2000:]
        assert cache.is_file() and cache.stat().st_size > 0, serve.text()[-2000:]
