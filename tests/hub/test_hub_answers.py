"""Whatever the hub answers, `specula hub search` and `hub files` print it harmlessly: terminal
escapes escaped, counts that are not counts shown as 0, names a download would refuse left out
(and counted), never a traceback. A stand-in hub on 127.0.0.1 answers each case; a seeded fuzz
answers random shapes."""

from __future__ import annotations

import http.server
import json
import os
import random
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from app.hub.fields import downloadable_name, shown

ROOT = Path(__file__).resolve().parents[2]
ESC = "\x1b]0;pwned\x07\x1b[2J"


class _Hub(http.server.BaseHTTPRequestHandler):
    search: object = []
    info: object = {}

    def do_HEAD(self):  # noqa: N802 - the search's probe
        self.send_response(200)
        self.end_headers()

    def do_GET(self):  # noqa: N802
        body = json.dumps(self.search if self.path.startswith("/api/models?") else self.info).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def standin():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _specula(url: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("HF_TOKEN", "HF_HUB_CACHE")}
    env.update(HF_ENDPOINT=url, HF_HOME=str(tmp_path / "hf"), HF_HUB_OFFLINE="0", HF_HUB_DISABLE_TELEMETRY="1",
               HF_HUB_ETAG_TIMEOUT="5", HF_HUB_DOWNLOAD_TIMEOUT="5")
    return subprocess.run([sys.executable, "-m", "app", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=60)


def _model(repo_id="someone/Model-GGUF", **over):
    return {"_id": "x", "id": repo_id, "modelId": repo_id, "downloads": 5, "likes": 1, "tags": ["gguf"],
            "lastModified": "2025-01-01T00:00:00.000Z", "private": False, "gated": False, **over}


def test_search_escapes_remote_text_and_reads_a_nan_count_as_zero(standin, tmp_path):
    _Hub.search = [_model(f"evil/{ESC}name", downloads="NaN"), _model(likes=float("inf") if False else "many")]
    done = _specula(standin, tmp_path, "hub", "search", "x")
    assert done.returncode == 0, done.stderr
    assert "\x1b" not in done.stdout and "\x07" not in done.stdout
    assert "evil/\\x1b]0;pwned\\x07\\x1b[2Jname" in done.stdout
    row = next(line for line in done.stdout.splitlines() if line.startswith("evil/"))
    assert row.split()[1] == "0"


def test_files_leaves_out_names_a_download_would_refuse_and_says_how_many(standin, tmp_path):
    good = "Model-Q8_0.gguf"
    names = [good, "../../x-Q4_0.gguf", "/abs/path-Q4_0.gguf", f"evil{ESC}-Q4_0.gguf", "a\\b-Q5_0.gguf"]
    _Hub.info = {**_model(), "sha": "0" * 40,
                 "siblings": [{"rfilename": n, "size": 1000} for n in names]}
    done = _specula(standin, tmp_path, "hub", "files", "someone/Model-GGUF")
    assert done.returncode == 0, done.stderr
    assert good in done.stdout and ".." not in done.stdout and "/abs" not in done.stdout
    assert "\x1b" not in done.stdout + done.stderr
    assert "specula: 4 file name(s) left out: a download would refuse them" in done.stderr


def _random_value(rng: random.Random, depth: int = 0):
    kinds = ["int", "float", "str", "none", "bool", "list", "dict", "nan", "huge", "esc"]
    kind = rng.choice(kinds if depth < 2 else kinds[:5])
    return {"int": lambda: rng.randint(-10, 10**6), "float": lambda: rng.uniform(-1e9, 1e9),
            "str": lambda: "".join(rng.choice("ab/.\\:~ ") for _ in range(rng.randint(0, 12))),
            "none": lambda: None, "bool": lambda: rng.random() < 0.5,
            "list": lambda: [_random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))],
            "dict": lambda: {"k": _random_value(rng, depth + 1)}, "nan": lambda: "NaN", "huge": lambda: 10**40,
            "esc": lambda: ESC}[kind]()


def test_random_answers_are_printed_or_refused_in_one_line(standin, tmp_path):
    rng = random.Random(51)
    fields_ = ["id", "downloads", "likes", "tags", "lastModified", "gated", "gguf", "createdAt"]
    for _ in range(6):
        _Hub.search = [{**_model(), **{f: _random_value(rng) for f in rng.sample(fields_, 3)}} for _ in range(3)]
        _Hub.info = {**_model(), "siblings": [{"rfilename": _random_value(rng), "size": _random_value(rng),
                                               "lfs": _random_value(rng)} for _ in range(3)]}
        for args in (["hub", "search", "x"], ["hub", "files", "someone/Model-GGUF"]):
            done = _specula(standin, tmp_path, *args)
            assert "Traceback" not in done.stderr, (args, _Hub.search, _Hub.info, done.stderr)
            assert done.returncode == 0 or len(done.stderr.strip().splitlines()) == 1, done.stderr
            assert "\x1b" not in done.stdout + done.stderr


@pytest.mark.parametrize("name, ok", [("a/b-Q4_0.gguf", True), ("../x.gguf", False), ("/x.gguf", False),
                                      ("a/../x.gguf", False), ("C:x.gguf", False), ("a\\x.gguf", False),
                                      ("x\x1b.gguf", False), ("", False), (5, False), ("~/x.gguf", False)])
def test_downloadable_names(name, ok):
    assert downloadable_name(name) is ok


def test_shown_escapes_controls_and_keeps_the_rest():
    assert shown("naïve 日本 ok") == "naïve 日本 ok"
    assert shown("a\x1b[2Jb\u202ec") == "a\\x1b[2Jb\\u202ec"


def test_the_windows_discover_words_escape_remote_text_too():
    from datetime import datetime

    from app.hub.repos import GGUFModelFile, RepoResult
    from app.ui.discover.text import file_label, repo_row, repo_tooltip

    repo = RepoResult(f"evil/{ESC}", 1, 2, datetime(2025, 1, 1), False, (), None, f"llama{ESC}")
    assert "\x1b" not in repo_row(repo)[0] + repo_tooltip(repo)
    file = GGUFModelFile(repo_id="evil/x", filename=f"x{ESC}-Q4_0.gguf", quant="Q4_0", size_bytes=1,
                         parts=(f"x{ESC}-Q4_0.gguf",), sha256=None)
    assert "\x1b" not in file_label(file)
