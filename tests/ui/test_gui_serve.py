"""The window's API server toggle serves the loaded pair to other programs, and stops cleanly."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request

import pytest

from app.worker.requests import LOOKUP
from tests.gui_support import WAIT_MS, add_models, load_pair, open_window, send  # noqa: F401


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def post(url: str, body: dict, key: str = "") -> dict:
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    request = urllib.request.Request(url, json.dumps(body).encode(), headers)
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


def test_serve_toggle_answers_openai_requests_beside_the_chat(qtbot, data_dir, tiny_paths):
    window = open_window(qtbot)
    panel = window.serve_panel
    assert not panel.toggle.isEnabled()  # nothing loaded yet
    add_models(qtbot, window, [tiny_paths["llama-f32"]])
    load_pair(qtbot, window, tiny_paths["llama-f32"], LOOKUP)
    assert panel.toggle.isEnabled()

    base = start_serving(qtbot, window, "sekrit")

    reply = post(f"{base}/v1/chat/completions", {
        "messages": [{"role": "user", "content": "def add(a, b):"}], "max_tokens": 12, "temperature": 0,
    }, key="sekrit")
    assert reply["choices"][0]["message"]["content"]
    assert reply["usage"]["completion_tokens"] >= 1 and "draft_n" in reply["timings"]
    with pytest.raises(urllib.error.HTTPError) as denied:
        post(f"{base}/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})
    assert denied.value.code == 401
    # The window's server has the same web-page rules as `specula serve` (they live in the app).
    for headers, status in (({"Content-Type": "application/json", "Origin": "https://evil.example"}, 403),
                            ({"Content-Type": "text/plain"}, 415)):
        request = urllib.request.Request(f"{base}/v1/chat/completions", b"{}", {**headers, "Authorization": "Bearer sekrit"})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=60)
        assert refused.value.code == status, headers

    summary = send(qtbot, window, "def add(a, b):")  # the window's own chat still works
    assert summary["n_predicted"] >= 1

    with qtbot.waitSignal(window.server.stopped, timeout=WAIT_MS):
        panel.toggle.setChecked(False)
    assert panel.status.text().startswith("Off")
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"{base}/health", timeout=5)


def test_a_busy_port_is_a_message_not_a_crash(qtbot, data_dir, tiny_paths):
    window = open_window(qtbot)
    add_models(qtbot, window, [tiny_paths["llama-f32"]])
    load_pair(qtbot, window, tiny_paths["llama-f32"])
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        window.serve_panel.port.setValue(taken.getsockname()[1])
        with qtbot.waitSignal(window.server.failed, timeout=WAIT_MS) as failed:
            window.serve_panel.toggle.setChecked(True)
    assert "cannot listen" in failed.args[0]
    assert not window.serve_panel.toggle.isChecked()
    assert "Could not start" in window.serve_panel.status.text()


def test_loading_another_pair_stops_the_server_and_serves_the_new_one(qtbot, data_dir, tiny_paths):
    window = open_window(qtbot)
    add_models(qtbot, window, [tiny_paths["llama-f32"], tiny_paths["qwen2-f32"]])
    load_pair(qtbot, window, tiny_paths["llama-f32"])
    port = free_port()
    window.serve_panel.port.setValue(port)
    with qtbot.waitSignal(window.server.started, timeout=WAIT_MS):
        window.serve_panel.toggle.setChecked(True)
    with qtbot.waitSignals([window.server.stopped, window.server.started], timeout=WAIT_MS):
        load_pair(qtbot, window, tiny_paths["qwen2-f32"])  # the served pair is being replaced
    assert window.serve_panel.toggle.isChecked() and window.serve_panel.toggle.isEnabled()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5) as response:
        assert json.loads(response.read())["data"][0]["id"] == tiny_paths["qwen2-f32"].stem


def start_serving(qtbot, window, key: str) -> str:
    """Turn the window's Local API server on at a free port with `key`; its base URL."""
    panel = window.serve_panel
    port = free_port()
    panel.port.setValue(port)
    panel.key.setText(key)
    with qtbot.waitSignal(window.server.started, timeout=WAIT_MS):
        panel.toggle.setChecked(True)
    base = f"http://127.0.0.1:{port}"
    assert base in panel.status.text()
    return base
