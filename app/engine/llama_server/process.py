"""llama-server started by Specula on 127.0.0.1, waited for until it answers /health, and stopped
with it: a context manager, so that no server outlives the command or test that started it."""

from __future__ import annotations

import logging
import re
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Callable, Sequence

from app.engine.errors import SpeculaError
from app.engine.llama_server.client import ServerClient, ServerError
from app.engine.llama_server.programs import SERVER, find_program, missing_reason, start_program, telling_line

log = logging.getLogger(__name__)

_START_TIMEOUT_S = 120.0
# "0.00.418.790 E srv    load_model: failed to create MTP context": llama.cpp's time and level
_LOG_PREFIX = re.compile(r"^(?:[\d.]+ ([A-Z]) )?(.*)$")


class ServerStartError(SpeculaError):
    """llama-server is missing, refused its arguments or died while loading: one line."""


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


class LlamaServer:
    """`llama-server -m MODEL ARGS...` on 127.0.0.1 at a free port, for one `with` block.

    `args` are llama-server's own flags (`--spec-type ngram-mod`, `-md DRAFT`, `-t 2`, ...).
    Its log goes to a temporary file whose last lines explain a failed start."""

    def __init__(self, model: Path | str, args: Sequence[str] = (), host: str = "127.0.0.1",
                 start_timeout_s: float = _START_TIMEOUT_S) -> None:
        self.model = Path(model)
        self.args = list(args)
        self.host = host
        self.port = 0
        self.start_timeout_s = start_timeout_s
        self._process: subprocess.Popen | None = None
        self._log = None
        self.client: ServerClient | None = None

    def __enter__(self) -> "LlamaServer":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, cancelled: Callable[[], bool] | None = None) -> ServerClient:
        """Start it and wait until it answers; `cancelled()` true stops the wait (and the server):
        the window's Cancel while a large model loads."""
        program = find_program(SERVER)
        if program is None:
            raise ServerStartError(missing_reason(SERVER))
        self.port = free_port(self.host)
        self._log = tempfile.TemporaryFile(prefix="specula-llama-server-")
        cmd = [str(program), "-m", str(self.model), "--host", self.host, "--port", str(self.port),
               "--parallel", "1", "--no-webui", *self.args]
        log.info("starting %s", " ".join(cmd))
        self._process = start_program(cmd, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT)
        self.client = ServerClient(self.url)
        try:
            self._wait_ready(cancelled)
        except BaseException:
            self.stop()
            raise
        return self.client

    def _wait_ready(self, cancelled: Callable[[], bool] | None = None) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if cancelled is not None and cancelled():
                from app.engine.errors import LoadCancelled

                raise LoadCancelled("loading cancelled")
            if self._process.poll() is not None:
                raise ServerStartError(f"llama-server stopped while starting (exit {self._process.returncode}): "
                                       f"{self.log_tail()}")
            try:
                if self.client.healthy(timeout_s=1.0):
                    return
            except ServerError:
                pass
            time.sleep(0.05)
        raise ServerStartError(f"llama-server did not answer within {self.start_timeout_s:.0f} s: {self.log_tail()}")

    def running(self, grace_s: float = 0.0) -> bool:
        """True while the llama-server process this object started is alive (`grace_s`: how long
        to wait for one that is going down, as after a connection it dropped)."""
        if self._process is None:
            return False
        try:
            self._process.wait(timeout=grace_s) if grace_s else None
        except subprocess.TimeoutExpired:
            return True
        return self._process.poll() is None

    def log_tail(self, lines: int = 2) -> str:
        """The server log's error lines (else its last lines), without llama.cpp's time and
        level prefixes, joined into one."""
        if self._log is None:
            return ""
        self._log.seek(0)
        text = self._log.read(1 << 20).decode("utf-8", "replace")
        parsed = [_LOG_PREFIX.match(line.strip()) for line in text.splitlines() if line.strip()]
        errors = [m.group(2) for m in parsed if m and m.group(1) == "E"]
        kept = errors or [m.group(2) if m else "" for m in parsed]
        kept = [" ".join(line.split()) for line in kept if line.strip()]
        if not errors:  # a crash: its cause, not the backtrace printed after it
            return telling_line(kept)
        return "; ".join(kept[-lines:]) or "no output"

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self._log is not None:
            self._log.close()
            self._log = None
