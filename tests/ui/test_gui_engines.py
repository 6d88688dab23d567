"""The Model tab's "Where it runs" (issue 50 item 2), driven in the window offscreen with the real
programs on loopback: llama-server started here with llama.cpp's own --spec-type, a llama-server
at a URL with an API key, and the main model split across two rpc-server workers. Each streams
into the same chat, stats line and charts as Specula's own loop; a server that goes away is one
line and the chat keeps what it had."""

from __future__ import annotations

import json
import os
import stat

import pytest
from PySide6.QtCore import Qt

from app.engine.llama_server.keys import KEYS_FILE
from app.engine.llama_server.process import LlamaServer
from app.ui.common.format import stats_line
from app.worker.requests import AT_URL, HERE, LLAMA_SERVER, MODEL, GenSettings
from tests.gui_support import WAIT_MS, add_models, open_window, send, shot, start_reply  # noqa: F401
from tests.engine.test_llama_server import _require_server, _run, _workers
from tests.tiny_gguf import TinySpec, write_tiny_gguf

REPEATS = ("Copy this list exactly, twice: red apple, green pear, yellow lemon, purple plum, orange "
           "peach, red cherry, green lime, blue berry.")


def choose(window, runs_on: str, spec_type: str = "none", rpc: str = "", url: str = "", key: str = "") -> None:
    engine = window.picker.engine
    engine.set_runs_on(runs_on)
    engine.set_spec_type(spec_type)
    engine.rpc.setText(rpc)
    engine.url.setText(url)
    engine.key.setText(key)


def press_load(qtbot, window) -> None:
    picker = window.picker
    qtbot.mouseClick(picker.load_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not picker.cancel_button.isEnabled(), timeout=WAIT_MS)


def reply_of(qtbot, window, text: str, settings: GenSettings) -> tuple[dict | None, str]:
    with qtbot.waitSignal(window.controller.replyFinished, timeout=WAIT_MS) as blocker:
        start_reply(qtbot, window, text, settings)
    return blocker.args


def chat_rows(window) -> list[tuple[str, str]]:
    return [(m.role, m.content) for m in window.store.messages(window.controller.chat_id)]


@pytest.mark.demo
def test_llama_server_ngram_mod_streams_into_the_chat_with_its_own_counts(qtbot, data_dir, demo_path, capsys):
    _require_server()
    model = demo_path("smollm2-135m")
    window = open_window(qtbot)
    add_models(qtbot, window, [model])
    assert window.picker.select_main(str(model))
    shot(window, "50-window-model-this-computer")
    choose(window, LLAMA_SERVER, "ngram-mod")
    assert not window.picker.backend_combo.isVisible() and not window.picker.draft_box.isVisible()
    press_load(qtbot, window)
    assert window.loaded_facts is not None, window.picker.state_label.text()
    assert "--spec-type ngram-mod" in window.picker.plan_label.text()
    shot(window, "50-window-model-llama-server")

    greedy = GenSettings(temperature=0.0, max_tokens=64)
    first, error = reply_of(qtbot, window, REPEATS, greedy)
    assert error == "" and first["drafter"] == "llama-server ngram-mod"
    code, out, err = _run(capsys, "run", "-m", str(model), "--chat", "-p", REPEATS, "-n", "64", "--temp", "0",
                          "--json", "--engine", "llama-server", "--spec-type", "ngram-mod")
    assert code == 0, err
    assert first["text"] == json.loads(out.strip().splitlines()[-1])["text"]  # the CLI's greedy reply

    summary, error = reply_of(qtbot, window, REPEATS, greedy)  # ngram-mod drafts what it wrote before
    assert error == "" and summary["n_drafted"] > 0 and summary["n_accepted"] > 0
    charts = window.charts
    charts.redraw()
    assert charts.drafted_by_position()[0] == summary["n_steps"]  # each verify step's first draft position
    assert sum(charts.drafted_by_position()) == summary["n_drafted"]
    assert charts.cumulative_acceptance_points()[-1][1] == pytest.approx(summary["n_accepted"] / summary["n_drafted"])
    assert sum(charts.accepted_by_position()) == summary["n_accepted"]
    line = stats_line(summary)
    assert f"drafted {summary['n_drafted']} / accepted {summary['n_accepted']}" in line
    assert line in window.panel.view.document().toPlainText()
    shot(window, "50-window-chat-llama-server-ngram-mod")


def test_a_server_at_a_url_with_its_key_and_one_that_goes_down(qtbot, data_dir, tiny_paths):
    _require_server()
    window = open_window(qtbot)
    with LlamaServer(tiny_paths["llama-q8"], ["-t", "1", "--api-key", "s3cret-key"]) as server:
        url = server.url
        choose(window, AT_URL, url=url, key="wrong-key")
        assert not window.picker.main_box.isVisible()
        press_load(qtbot, window)
        assert window.loaded_facts is None and "HTTP 401" in window.picker.state_label.text()

        window.picker.engine.key.setText("s3cret-key")
        press_load(qtbot, window)
        assert window.loaded_facts is not None, window.picker.state_label.text()
        shot(window, "50-window-model-url")
        keys = data_dir / KEYS_FILE
        assert stat.S_IMODE(os.stat(keys).st_mode) == 0o600 and "s3cret-key" in keys.read_text()
        assert window.picker.engine.key.text() == "" and "stored" in window.picker.engine.key.placeholderText()
        window.settings.sync()
        assert "s3cret" not in (data_dir / "settings.ini").read_text()
        summary = send(qtbot, window, "Once upon a time", GenSettings(temperature=0.0, max_tokens=8))
        assert summary["n_predicted"] >= 1 and summary["drafter"] == "llama-server at its URL"
        assert "drafted nothing in this reply" in window.charts.acceptance_note()
    kept = chat_rows(window)
    summary, error = reply_of(qtbot, window, "Are you there?", GenSettings(temperature=0.0, max_tokens=8))
    assert summary is None and "\n" not in error and ("could not connect" in error or "connection failed" in error)
    assert chat_rows(window)[:len(kept)] == kept and ("user", "Are you there?") in chat_rows(window)
    press_load(qtbot, window)  # the URL is down: one line, nothing loaded, the chat as it was
    assert window.loaded_facts is None and "could not connect" in window.picker.state_label.text()
    assert chat_rows(window)[:len(kept)] == kept


def test_a_model_split_across_two_rpc_workers_and_a_worker_killed_mid_reply(qtbot, data_dir, tmp_path):
    _require_server()
    model = write_tiny_gguf(tmp_path / "long.gguf", TinySpec(arch="llama", qtype="F32", seed=0, context_length=8192))
    window = open_window(qtbot)
    add_models(qtbot, window, [model])
    assert window.picker.select_main(str(model))
    greedy = GenSettings(temperature=0.0, max_tokens=12)
    choose(window, HERE)
    press_load(qtbot, window)
    local = send(qtbot, window, "Once upon a time", greedy)

    procs, endpoints = _workers(2)
    try:
        choose(window, LLAMA_SERVER, "none", rpc=endpoints)
        assert "split across 2 worker(s)" in window.picker.engine.rpc_note.text()
        press_load(qtbot, window)
        assert window.loaded_facts is not None, window.picker.state_label.text()
        assert f"split across RPC workers {endpoints}" in window.picker.plan_label.text()
        shot(window, "50-window-model-rpc")
        window.controller.new_chat()
        split = send(qtbot, window, "Once upon a time", greedy)
        assert split["text"] == local["text"]  # the local greedy reply

        kept = chat_rows(window)
        # On the host's thread, as the first token arrives: the worker goes away mid-reply.
        window.host.steps.connect(lambda _events: procs[1].poll() is None and procs[1].kill(),
                                 Qt.ConnectionType.DirectConnection)
        summary, error = reply_of(qtbot, window, "Tell me everything.", GenSettings(temperature=0.0, max_tokens=8000))
        assert summary is None and error.startswith("llama-server stopped mid-reply") and "\n" not in error
        assert chat_rows(window)[:len(kept)] == kept
        shot(window, "50-window-rpc-worker-died")
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    choose(window, HERE)  # the window still works: back to this computer, and chat
    press_load(qtbot, window)
    assert window.loaded_facts is not None and not window.loaded_facts.engine_line
    window.controller.new_chat()
    assert send(qtbot, window, "Once upon a time", greedy)["text"] == local["text"]


def test_draft_types_offer_the_draft_models_and_a_worker_off_loopback_is_warned_about(qtbot, data_dir, tiny_paths):
    from app.engine.llama_server.spec import LLAMA_SPEC_TYPES, RPC_WARNING

    window = open_window(qtbot)
    add_models(qtbot, window, [tiny_paths["llama-f32"], tiny_paths["llama-q8"]])
    picker = window.picker
    assert picker.select_main(str(tiny_paths["llama-f32"]))
    engine = picker.engine
    assert [engine.spec_type.itemData(i) for i in range(engine.spec_type.count())] == list(LLAMA_SPEC_TYPES)
    choose(window, LLAMA_SERVER, "draft-simple")
    assert picker.draft_box.isVisible()
    shown = [picker.draft_combo.itemText(r) for r in range(picker.draft_combo.count())
             if not picker.draft_combo.view().isRowHidden(r)]
    assert shown and all("lookup" not in t.lower() and "none" not in t.lower() for t in shown)
    assert picker.draft_choice()[0] == MODEL  # one is chosen for it
    assert picker.select_draft(MODEL, str(tiny_paths["llama-q8"]))
    spec = picker.spec()
    assert spec.runs_on == LLAMA_SERVER and spec.spec_type == "draft-simple"
    assert spec.draft_path == str(tiny_paths["llama-q8"])
    engine.rpc.setText("10.0.0.7:50052")
    assert engine.rpc_note.text().count(RPC_WARNING.split(":")[0]) == 1 and engine.rpc_note.isVisible()
    shot(window, "50-window-model-llama-server-draft-simple")
    shot(picker, "50-window-model-llama-server-draft-simple-whole-tab")  # the Draft box below the fold
    engine.rpc.setText("nohost")
    press_load(qtbot, window)  # refused before anything starts, in one line
    assert window.loaded_facts is None and "'nohost' is not HOST:PORT" in picker.state_label.text()


class _Garbage(__import__("http.server").server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's name
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"<html>not a llama-server \x1b[2J</html>")

    do_POST = do_GET

    def log_message(self, *args):
        pass


def test_a_url_that_answers_garbage_is_one_line(qtbot, data_dir):
    import http.server
    import threading

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Garbage)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        window = open_window(qtbot)
        choose(window, AT_URL, url=f"http://127.0.0.1:{server.server_address[1]}")
        press_load(qtbot, window)
        text = window.picker.state_label.text()
        assert window.loaded_facts is None and "is not JSON" in text and "\x1b" not in text
    finally:
        server.shutdown()
        server.server_close()


def test_a_cancelled_start_stops_llama_server_and_leaves_no_process(tiny_paths):
    """The Model tab's Cancel while llama-server loads: the host's cancel flag reaches the wait."""
    from app.engine.errors import LoadCancelled

    _require_server()
    server = LlamaServer(tiny_paths["llama-q8"], ["-t", "1"])
    with pytest.raises(LoadCancelled):
        server.start(cancelled=lambda: True)
    assert server._process is None and not server.running()


def test_a_server_speaking_openais_api_chats_with_tok_s_and_its_metrics_counts(qtbot, data_dir):
    """A team's server (vLLM's shape: OpenAI's API and /metrics counters) from the window: the
    reply streams into the chat, the tok/s chart counts its chunks, and the acceptance is the
    change in its /metrics over the reply."""
    from tests.openai_standin import ACCEPTED_PER_REPLY, DRAFTED_PER_REPLY, REPLY, StandinServer

    with StandinServer(key="team-key") as server:
        window = open_window(qtbot)
        choose(window, AT_URL, url=server.url, key="team-key")
        press_load(qtbot, window)
        assert window.loaded_facts is not None, window.picker.state_label.text()
        assert "OpenAI's API" in window.picker.plan_label.text()
        summary = send(qtbot, window, "Say hello", GenSettings(temperature=0.0, max_tokens=16))
        assert summary["text"] == "".join(REPLY)
        assert (summary["n_drafted"], summary["n_accepted"]) == (DRAFTED_PER_REPLY, ACCEPTED_PER_REPLY)
        window.charts.redraw()
        assert window.charts.tps_points(), "the tok/s chart counts the streamed chunks"
        assert window.charts.acceptance_note() == ("this server counts drafts for the whole reply only (its /metrics): "
                                                   f"{ACCEPTED_PER_REPLY} of {DRAFTED_PER_REPLY} accepted (67%)")
        assert ("assistant", "".join(REPLY)) in chat_rows(window)
        shot(window, "50-window-chat-openai-server")
