"""The Local API server on an engine beyond this process (issue 50 item 2): `specula serve
--engine llama-server` and the window's "Local API server" box on a llama-server engine answer
OpenAI requests through the engine's ServerSession, with the same routes, key and replies as
llama-server's own greedy run (`specula run --engine llama-server`), streamed or not."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import httpx2
import pytest

from app.worker.requests import LLAMA_SERVER, GenSettings
from tests.gui_support import WAIT_MS, add_models, open_window, send, shot  # noqa: F401
from tests.ui.test_gui_engines import choose, press_load
from tests.ui.test_gui_serve import post, start_serving
from tests.engine.test_llama_server import _require_server, _run
from tests.cli.test_server_cli import ServerProcess

KEY = "s3cret-key"
QUESTION = "What is the capital of France?"
N = 12


def streamed_text(client: httpx2.Client, body: dict) -> tuple[str, dict]:
    """The streamed chat reply's text and its last chunk with choices."""
    pieces, last = [], {}
    with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as answer:
        assert answer.status_code == 200
        for line in answer.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunk = json.loads(line[6:])
                if chunk["choices"]:
                    pieces.append(chunk["choices"][0]["delta"].get("content") or "")
                    last = chunk
    return "".join(pieces), last


def test_serve_on_llama_server_answers_with_its_greedy_reply(capsys, tiny_paths):
    _require_server()
    model = str(tiny_paths["llama-q8"])
    server = ServerProcess(["-m", model, "--engine", "llama-server", "--spec-type", "ngram-mod", "-t", "1",
                            "--port", "0", "--api-key", KEY])
    try:
        url = server.wait_ready()
        assert "drafter: llama-server ngram-mod" in "".join(server.lines)
        code, out, err = _run(capsys, "run", "-m", model, "--chat", "-p", QUESTION, "-n", str(N), "--temp", "0",
                              "--json", "-t", "1", "--engine", "llama-server", "--spec-type", "ngram-mod")
        assert code == 0, err
        reference = json.loads(out.strip().splitlines()[-1])
        body = {"model": "anything", "messages": [{"role": "user", "content": QUESTION}], "max_tokens": N,
                "temperature": 0}
        with httpx2.Client(base_url=url, headers={"Authorization": f"Bearer {KEY}"}, timeout=120) as client:
            assert client.post("/v1/chat/completions", json=body, headers={"Authorization": "Bearer wrong"}
                               ).status_code == 401  # our policy, not the engine's
            answer = client.post("/v1/chat/completions", json=body)
            assert answer.status_code == 200, answer.text
            reply = answer.json()
            assert reply["choices"][0]["message"]["content"] == reference["text"]
            assert reply["usage"]["completion_tokens"] == reference["n_predicted"] == N
            assert reply["timings"]["predicted_n"] == N and "draft_n" in reply["timings"]
            assert reply["system_fingerprint"].endswith("llama-server ngram-mod")
            text, last = streamed_text(client, body)
            assert text == reference["text"] and last["choices"][0]["finish_reason"] == "length"
            models = client.get("/v1/models").json()["data"][0]
            assert models["id"] == tiny_paths["llama-q8"].stem and models["meta"]["n_ctx"] > 0
            assert "llama-server" in models["meta"]["engine"]
    finally:
        assert server.stop() == 0, "".join(server.lines)
    assert "specula: server stopped" in "".join(server.lines)


def test_the_window_serves_its_llama_server_engine(qtbot, data_dir, tiny_paths):
    _require_server()
    model = tiny_paths["llama-q8"]
    window = open_window(qtbot)
    add_models(qtbot, window, [model])
    assert window.picker.select_main(str(model))
    choose(window, LLAMA_SERVER)
    press_load(qtbot, window)
    assert window.loaded_facts is not None, window.picker.state_label.text()
    panel = window.serve_panel
    assert panel.toggle.isEnabled(), panel.status.text()

    base = start_serving(qtbot, window, "sekrit")
    shot(window, "50-serve-llama-server")
    shot(panel, "50-serve-box-llama-server")  # the box sits below the fold of the Model tab

    greedy = GenSettings(temperature=0.0, max_tokens=N)
    body = {"messages": [{"role": "user", "content": QUESTION}], "max_tokens": N, "temperature": 0}
    reply = post(f"{base}/v1/chat/completions", body, key="sekrit")
    chat = send(qtbot, window, QUESTION, greedy)  # the window's own chat, on the same llama-server
    assert reply["choices"][0]["message"]["content"] == chat["text"]
    assert reply["usage"]["completion_tokens"] == N and reply["system_fingerprint"].endswith("llama-server none")
    with pytest.raises(urllib.error.HTTPError) as denied:
        post(f"{base}/v1/chat/completions", body)
    assert denied.value.code == 401
    request = urllib.request.Request(f"{base}/v1/chat/completions", json.dumps(body).encode(), {
        "Content-Type": "application/json", "Authorization": "Bearer sekrit", "Origin": "https://evil.example"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=60)
    assert refused.value.code == 403

    with qtbot.waitSignal(window.server.stopped, timeout=WAIT_MS):
        panel.toggle.setChecked(False)
    assert panel.status.text().startswith("Off")


def test_serve_on_a_server_at_a_url_never_shows_its_key(tmp_path, tiny_paths):
    _require_server()
    from app.engine.llama_server.process import LlamaServer

    key_file = tmp_path / "remote.key"
    key_file.write_text("remote-s3cret\n")
    with LlamaServer(tiny_paths["llama-q8"], ["-t", "1", "--api-key", "remote-s3cret"]) as remote:
        server = ServerProcess(["-m", "tiny", "--server", remote.url, "--server-api-key-file", str(key_file),
                                "--port", "0"])
        try:
            url = server.wait_ready()
            body = {"messages": [{"role": "user", "content": QUESTION}], "max_tokens": N, "temperature": 0}
            with httpx2.Client(base_url=url, timeout=120) as client:
                answer = client.post("/v1/chat/completions", json=body)
                assert answer.status_code == 200, answer.text
                assert answer.json()["usage"]["completion_tokens"] == N
                listed = client.get("/v1/models").text
        finally:
            server.stop()
    assert "remote-s3cret" not in "".join(server.lines) + answer.text + listed
