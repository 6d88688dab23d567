"""`specula serve` as users start it: a subprocess (`python -m app serve`, tiny main model, tiny
Q8 draft model, an API key, --port 0), checked for its key, a bounded load of concurrent clients,
greedy outputs identical to `specula run --temp 0 --json`, refusals at start, and Ctrl-C.

The subprocesses (the server and the CLI reference runs) start together once per module: each
spends seconds importing torch."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx2
import pytest

ROOT = Path(__file__).resolve().parents[2]
KEY = "s3cret-key"
CODE = "def add(a, b):\n    return a + b\n\ndef add(a, b):\n"
QUESTION = "What is the capital of France?"
N = 24
SEPARATOR = "@@@@ next run @@@@"
ENV = {**os.environ, "TRANSFORMERS_VERBOSITY": "error", "HF_HUB_OFFLINE": "1"}


class ServerProcess:
    def __init__(self, args: list[str]) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "app", "serve", *args], cwd=ROOT, env=ENV,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self.url: str | None = None
        self._ready = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.lines.append(line)
            found = re.search(r" at (http://\S+)/v1;", line)
            if found:
                self.url = found.group(1)
                self._ready.set()
        self._ready.set()  # ended without the line: the fixture reports stderr

    def wait_ready(self, timeout_s: float = 180.0) -> str:
        self._ready.wait(timeout_s)
        assert self.url, "".join(self.lines)
        return self.url

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        return self.proc.wait(30)


@pytest.fixture(scope="module")
def started(tiny_paths):
    """Start the server and the CLI reference runs at once; yield both."""
    tiny, draft = str(tiny_paths["llama-f32"]), str(tiny_paths["llama-q8"])
    exact = ["--device", "cpu", "--dtype", "float32"]  # no near-ties in this tiny model's float32 logits
    server = ServerProcess(["-m", tiny, "-md", draft, *exact, "--port", "0", "--api-key", KEY, "--queue", "4",
                            "--cors-origin", "http://app.example:3000"])
    runs = [["run", "-m", tiny, *exact, "-p", CODE, "-n", str(N), "--temp", "0", "--json"],
            ["run", "-m", tiny, *exact, "--chat", "-p", QUESTION, "-n", str(N), "--temp", "0", "--json"]]
    # The CLI's own main(), twice in one fresh process (one torch import), a separator between.
    script = ("import sys; from app.cli import main; runs = " + repr(runs) + "\n"
              "for i, args in enumerate(runs):\n"
              f"    print('{SEPARATOR}') if i else None; sys.stdout.flush(); assert main(args) == 0\n")
    reference = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, env=ENV,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    yield server, reference
    server.stop()
    if reference.poll() is None:
        reference.kill()


@pytest.fixture(scope="module")
def url(started) -> str:
    return started[0].wait_ready()


@pytest.fixture(scope="module")
def cli_reference(started) -> dict[str, dict]:
    """`specula run --temp 0 --json` results: "text" (raw prompt) and "chat" (--chat)."""
    out, err = started[1].communicate(timeout=300)
    assert started[1].returncode == 0, err
    parts = out.split(SEPARATOR + "\n")
    results = [json.loads(part.strip().splitlines()[-1]) for part in parts]
    return {"text": results[0], "chat": results[1]}


@pytest.fixture(scope="module")
def http(url):
    with httpx2.Client(base_url=url, headers={"Authorization": f"Bearer {KEY}"}, timeout=60,
                       limits=httpx2.Limits(max_connections=16)) as client:
        yield client


def test_ready_line_names_model_drafter_and_key(started, url):
    server = started[0]
    ready = [line for line in server.lines if "specula: serving" in line]
    assert len(ready) == 1
    assert re.match(r"specula: serving llama-f32 \(drafter: llama-q8, context 512, API key required\) "
                    r"at http://127\.0\.0\.1:\d+/v1; Ctrl-C stops$", ready[0].strip()), ready[0]


def test_api_key_is_required_everywhere_but_health(url):
    with httpx2.Client(base_url=url, timeout=30) as bare:
        assert bare.get("/health").json() == {"status": "ok"}
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {KEY}"},
                        {"Authorization": f"Bearer {KEY}x"}):
            for method, path in (("GET", "/v1/models"), ("POST", "/v1/chat/completions"), ("GET", "/metrics"),
                                 ("GET", "/nowhere")):
                response = bare.request(method, path, headers=headers)
                assert response.status_code == 401, (headers, path)
                assert response.headers["www-authenticate"] == "Bearer"
                error = response.json()["error"]
                assert error["type"] == "authentication_error" and error["code"] == "invalid_api_key"
        good = {"Authorization": f"bearer {KEY}"}
        assert bare.get("/v1/models", headers=good).json()["data"][0]["id"] == "llama-f32"
        assert bare.get("/nowhere", headers=good).status_code == 404
        # --cors-origin lets that web page in (with CORS headers); other pages stay out.
        page = bare.get("/v1/models", headers={**good, "Origin": "http://app.example:3000"})
        assert page.status_code == 200 and page.headers["access-control-allow-origin"] == "http://app.example:3000"
        other = bare.get("/v1/models", headers={**good, "Origin": "http://app.example:3001"})
        assert other.status_code == 403 and other.json()["error"]["code"] == "forbidden_origin"


def test_openai_client_with_key_matches_cli_greedy_output(url, cli_reference):
    import openai

    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=url + "/v1", api_key="wrong", max_retries=0).models.list()
    client = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=60)
    text = client.completions.create(model="llama-f32", prompt=CODE, max_tokens=N, temperature=0)
    assert text.choices[0].text == cli_reference["text"]["text"]
    assert text.usage.completion_tokens == cli_reference["text"]["n_predicted"]
    assert text.usage.prompt_tokens == cli_reference["text"]["n_prompt"]
    timings = text.model_extra["timings"]
    assert timings["draft_n"] > 0 and timings["draft_n_accepted"] > 0  # the Q8 copy drafts well
    chat = client.chat.completions.create(model="llama-f32", messages=[{"role": "user", "content": QUESTION}],
                                          max_tokens=N, temperature=0)
    assert chat.choices[0].message.content == cli_reference["chat"]["text"]
    assert chat.usage.prompt_tokens == cli_reference["chat"]["n_prompt"]


def one_request(http: httpx2.Client, i: int) -> tuple[int, str, dict]:
    """(status, "text"/"chat", result): 200 -> {"text", "n"}; 503 -> the error and Retry-After."""
    kind = "text" if i % 2 else "chat"
    stream = i % 4 < 2
    payload = {"max_tokens": N, "temperature": 0, "stream": stream}
    if kind == "text":
        path, payload["prompt"] = "/v1/completions", CODE
    else:
        path, payload["messages"] = "/v1/chat/completions", [{"role": "user", "content": QUESTION}]
    with http.stream("POST", path, json=payload) as response:
        if response.status_code != 200 or not stream:
            body = json.loads(response.read())
            if response.status_code != 200:
                return response.status_code, kind, {**body, "retry_after": response.headers.get("retry-after")}
            choice = body["choices"][0]
            text = choice["text"] if kind == "text" else choice["message"]["content"]
            return 200, kind, {"text": text, "n": body["usage"]["completion_tokens"]}
        pieces, n, done = [], None, False
        for line in response.iter_lines():
            if not line:
                continue
            data = line.removeprefix("data: ")
            if data == "[DONE]":
                done = True
                continue
            chunk = json.loads(data)
            assert "error" not in chunk, chunk
            for choice in chunk["choices"]:
                pieces.append(choice.get("text") or choice.get("delta", {}).get("content") or "")
            if chunk.get("usage"):
                n = chunk["usage"]["completion_tokens"]
        assert done
        return 200, kind, {"text": "".join(pieces), "n": n}


def test_bounded_load_every_request_answered_and_greedy_identical(http, cli_reference):
    """16 concurrent clients, 64 requests, queue of 4: each gets its completion or a clean 503."""
    before = metrics(http)
    with ThreadPoolExecutor(max_workers=16) as pool:
        results = list(pool.map(lambda i: one_request(http, i), range(64)))
    statuses = [status for status, _, _ in results]
    assert set(statuses) <= {200, 503}, statuses
    served = [(kind, result) for status, kind, result in results if status == 200]
    busy = [result for status, _, result in results if status == 503]
    assert served and busy, statuses  # 16 at once cannot all fit in 1 running + 4 waiting
    for kind, result in served:
        assert result["text"] == cli_reference[kind]["text"], kind
        assert result["n"] == cli_reference[kind]["n_predicted"], kind
    for error in busy:
        assert error["error"]["type"] == "unavailable_error" and error["error"]["code"] == "server_busy"
        assert int(error["retry_after"]) >= 1
    after = metrics(http)
    assert after["specula:requests_rejected_total"] - before["specula:requests_rejected_total"] == len(busy)
    assert after["specula:requests_completed_total"] - before["specula:requests_completed_total"] == len(served)
    assert after["llamacpp:requests_processing"] == 0 and after["llamacpp:requests_deferred"] == 0
    # Still healthy, and still right.
    assert http.get("/health").json() == {"status": "ok"}
    assert one_request(http, 1)[2]["text"] == cli_reference["text"]["text"]


def metrics(http: httpx2.Client) -> dict[str, float]:
    text = http.get("/metrics").text
    return {name: float(value) for name, value in re.findall(r"^(\S+) (\S+)$", text, re.M)}


# ---------------------------------------------------------------------------------------------
# Refusals at start: one line, non-zero exit, before the model is loaded


@pytest.fixture
def specula(capsys):
    from app.cli import main

    def call(*args: str) -> tuple[int, str]:
        capsys.readouterr()
        try:
            code = main(list(args))
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
            if isinstance(exc.code, str):
                print(exc.code, file=sys.stderr)
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
        return code, err.strip()

    return call


def test_refuses_non_loopback_without_key_and_busy_ports(specula, tiny_paths, url, tmp_path):
    tiny = str(tiny_paths["llama-f32"])
    code, err = specula("serve", "-m", tiny, "--host", "0.0.0.0")
    assert code != 0 and err.startswith("specula: error: refusing to listen on 0.0.0.0 without --api-key")
    empty = tmp_path / "key.txt"
    empty.write_text("\n")
    code, err = specula("serve", "-m", tiny, "--host", "0.0.0.0", "--api-key-file", str(empty))
    assert code != 0 and "holds no key on its first line" in err
    port = url.rsplit(":", 1)[1]
    code, err = specula("serve", "-m", tiny, "--port", port)
    assert code != 0 and err.startswith(f"specula: error: cannot listen on 127.0.0.1:{port}:")
    code, err = specula("serve", "-m", tiny, "--port", "70000")
    assert code != 0 and "--port" in err
    # A key with surrounding spaces could never match a client's header, whose spaces are stripped.
    code, err = specula("serve", "-m", tiny, "--api-key", " k3y ")
    assert code != 0 and "whitespace" in err
    for origin in ("app.example", "http://app.example/path", "ftp://x", "http://:80"):
        code, err = specula("serve", "-m", tiny, "--cors-origin", origin)
        assert code != 0 and "--cors-origin" in err, origin


def test_ctrl_c_stops_cleanly_mid_stream(started, url, http):
    """Last: stops the module's server. A reply in flight ends with a 503-style error event."""
    server = started[0]
    payload = {"prompt": "hello world", "max_tokens": 400, "temperature": 0, "stream": True}
    with http.stream("POST", "/v1/completions", json=payload) as response:
        lines = response.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))
        server.proc.send_signal(signal.SIGINT)
        rest = [line for line in lines if line.startswith("data: ")]
    assert rest and json.loads(rest[-1].removeprefix("data: "))["error"]["code"] == "shutting_down"
    assert server.proc.wait(30) == 0
    stderr = "".join(server.lines)
    assert "Traceback" not in stderr and stderr.rstrip().endswith("specula: server stopped"), stderr
