"""Issue 58 items 6 and 7 (the hostile-input review, round four): a server open to every web page
needs a key; key and cache files a user names are read with a size and type check and never a
traceback; a file that is not an n-gram cache is never replaced; a closed stdout ends quietly;
a chat template bomb never reaches llama-server, which renders templates without bounds."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from app.engine.errors import ChatTemplateError
from app.engine.loop.template_guard import unbounded_reason
from tests.engine.test_chat_template_hostile import BOMBS
from tests.tiny_gguf import CHATML, TinySpec, write_tiny_gguf

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}


def _specula(*args: str, timeout: float = 60, **popen) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "app", *args], cwd=ROOT, env=ENV, capture_output=True,
                          text=True, timeout=timeout, **popen)


def _one_line_refusal(done: subprocess.CompletedProcess, says: str) -> None:
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
    assert says in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


# --- item 6: * needs a key -----------------------------------------------------------------

def test_any_origin_without_a_key_is_refused_before_anything_loads(tmp_path):
    done = _specula("serve", "-m", str(tmp_path / "never-read.gguf"), "--cors-origin", "*", "--port", "0")
    _one_line_refusal(done, "--cors-origin * lets every web page you visit use this server: it needs an API key")


def test_the_app_refuses_any_origin_without_a_key_and_takes_it_with_one():
    from app.server.app import ServerConfig, create_app

    with pytest.raises(ValueError, match="needs an API key"):
        create_app(object(), ServerConfig(cors_origins=("*",)))
    from app.server.origin import check_any_origin_has_key

    check_any_origin_has_key(("*",), "a-key")  # with a key: as SECURITY.md says, * is for that
    check_any_origin_has_key(("http://localhost:3000",), None)


# --- item 7: key files ---------------------------------------------------------------------

def _bad_key_files(tmp_path: Path) -> dict[str, str]:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    folder = tmp_path / "folder"
    folder.mkdir()
    latin = tmp_path / "latin1.key"
    latin.write_bytes(b"cl\xe9\n")
    huge = tmp_path / "huge.key"
    with open(huge, "wb") as handle:
        handle.truncate(1 << 30)  # sparse: 1 GB that costs no disk
    return {"a FIFO": str(fifo), "/dev/zero": "/dev/zero", "a folder": str(folder),
            "not UTF-8": str(latin), "1 GB": str(huge)}


@pytest.mark.parametrize("flags", [
    ("run", "-m", "x", "--server", "http://127.0.0.1:9", "-p", "hi", "--api-key-file"),
    ("serve", "-m", "x", "--server", "http://127.0.0.1:9", "--port", "0", "--server-api-key-file"),
    ("serve", "-m", "never-read.gguf", "--port", "0", "--api-key-file"),
], ids=["run", "serve's remote key", "serve's own key"])
def test_a_key_file_that_is_no_key_file_is_one_line_at_once(tmp_path, flags):
    flag = flags[-1]
    for what, path in _bad_key_files(tmp_path).items():
        started = time.monotonic()
        done = _specula(*flags, path, timeout=30)
        _one_line_refusal(done, f"{flag}: cannot read {path}")
        assert time.monotonic() - started < 20, what  # a FIFO does not block, /dev/zero is not read on


def test_serve_takes_a_key_files_first_line_as_run_does(tmp_path):
    from argparse import Namespace

    from app.cli.serve import api_key_from_args

    key_file = tmp_path / "key"
    key_file.write_text("first-line-key\nsomething else\n")
    assert api_key_from_args(Namespace(api_key=None, api_key_file=str(key_file))) == "first-line-key"


def test_a_saved_keys_file_that_is_a_fifo_or_a_device_reads_as_no_keys(tmp_path):
    from app.engine.llama_server.keys import read_key

    fifo = tmp_path / "server-keys.json"
    os.mkfifo(fifo)
    assert read_key(fifo, "http://127.0.0.1:8080") is None
    assert read_key("/dev/zero", "http://127.0.0.1:8080") is None


# --- item 7: -lcd never replaces what Specula did not write ---------------------------------

def test_an_lcd_file_that_is_not_a_cache_is_refused_and_kept(tmp_path):
    from app.engine.drafting.ngram_cache import NgramCache, NgramCacheSaveError, not_a_cache_file

    notes = tmp_path / "notes.txt"
    notes.write_text("my notes, not a cache\n")
    assert "is not an n-gram cache file" in not_a_cache_file(notes)
    with pytest.raises(NgramCacheSaveError):
        NgramCache("key").save(notes)
    assert notes.read_text() == "my notes, not a cache\n"
    done = _specula("run", "-m", "smollm2-135m", "--spec-type", "ngram-cache", "-lcd", str(notes), "-p", "hi", "-n", "2")
    assert done.returncode != 0 and "Traceback" not in done.stderr and "is not an n-gram cache file" in done.stderr
    assert notes.read_text() == "my notes, not a cache\n"
    empty, cache = tmp_path / "empty.ngc", tmp_path / "saved.ngc"
    empty.touch()
    NgramCache("key").save(cache)
    assert not_a_cache_file(empty) is None and not_a_cache_file(cache) is None  # ours, or nothing yet


# --- item 7: a closed stdout ---------------------------------------------------------------

def test_a_reader_that_goes_away_is_no_traceback(tmp_path):
    model = write_tiny_gguf(tmp_path / "tiny.gguf", TinySpec(chat_template=CHATML))
    proc = subprocess.Popen([sys.executable, "-m", "app", "inspect", str(model)], cwd=ROOT, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdout.close()  # `specula inspect ... | head -0`: gone before the first line is written
    _, err = proc.communicate(timeout=60)
    assert "Traceback" not in err and "BrokenPipeError" not in err, err
    assert proc.returncode == 141


# --- item 7: a template bomb never reaches llama-server -------------------------------------

@pytest.mark.parametrize("name", ["tilde-doubling", "loops-of-loops", "center"])
def test_a_template_bomb_is_named_before_any_program_renders_it(name):
    started = time.monotonic()
    assert unbounded_reason(BOMBS[name]).startswith("the template ")
    assert time.monotonic() - started < 10


def test_a_template_bomb_starts_no_llama_server(tmp_path):
    from app.engine.llama_server.session import ServerSession
    from app.engine.llama_server.spec import ServerEngine
    from tests.engine.test_llama_server import _require_server

    _require_server()
    model = write_tiny_gguf(tmp_path / "bomb.gguf", TinySpec(chat_template=BOMBS["loops-of-loops"]))
    started = time.monotonic()
    with pytest.raises(ChatTemplateError) as caught:
        ServerSession(ServerEngine(threads=1), model).open()
    assert "bomb.gguf is refused before llama-server runs it: the template ran for over" in str(caught.value)
    assert time.monotonic() - started < 15


def test_real_templates_pass_the_bounds():
    assert unbounded_reason(CHATML) is None
    assert unbounded_reason("{{ raise_exception('no system role') }}") is None  # llama.cpp's to judge


# --- item 7: a crashed program's cause, not its backtrace ---------------------------------

def test_the_line_that_says_why_a_program_stopped_is_the_cause_not_the_backtrace():
    from app.engine.llama_server.programs import telling_line

    crash = ["load_tensors: loading model", "/src/ggml-rpc.cpp:612: GGML_ASSERT(status) failed",
             "[New LWP 4242]", "0x00007f3a in __GI___wait4 () at wait4.c:30", "#0  0x00007f3a in wait4",
             "#1  0x00007f3b in ggml_abort ()", "[Inferior 1 (process 4241) detached]"]
    assert telling_line(crash) == "/src/ggml-rpc.cpp:612: GGML_ASSERT(status) failed"
    assert telling_line(["starting RPC server", "Failed to create server socket"]) == "Failed to create server socket"
    assert telling_line(["all good", "bye"]) == "bye" and telling_line([]) == "no output"


def test_a_second_rpc_worker_on_a_taken_port_says_so(tmp_path):
    import socket

    from tests.engine.test_llama_server import _require_server

    _require_server()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = _specula("rpc-worker", "--port", str(port), timeout=60)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert f"Failed to create server socket (is port {port} in use" in done.stderr, done.stderr
