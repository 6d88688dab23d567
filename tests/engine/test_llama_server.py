"""llama.cpp's own server as Specula starts it and talks to it: found beside the environment,
started on loopback and stopped with its block, and every answer checked: a bad start or a bad
answer is one line, never a traceback."""

from __future__ import annotations

import http.server
import json
import os
import threading

import pytest

from app.engine.llama_server.client import ServerClient, ServerError, parse_completion
from app.engine.llama_server.process import LlamaServer, ServerStartError
from app.engine.llama_server.programs import SERVER, find_program

GOOD = {"tokens": [5, 6, 7], "content": "hi", "timings": {"prompt_n": 3, "prompt_ms": 1.5, "predicted_n": 3,
                                                           "predicted_ms": 20.0, "draft_n": 4, "draft_n_accepted": 3}}


def test_a_good_answer_is_read_with_its_timings():
    reply = parse_completion(GOOD)
    assert reply.tokens == (5, 6, 7) and reply.text == "hi"
    # 3 tokens, the first from the prompt's logits: 2 decode steps in 20 ms, as llama-server counts
    assert reply.decode_tps == pytest.approx(100.0) and reply.accept_rate == pytest.approx(0.75)


@pytest.mark.parametrize("answer", [
    [], "text", {"content": "x"}, {"tokens": ["a"]}, {"tokens": [-1]}, {"tokens": [True]},
    {**GOOD, "content": 5}, {**GOOD, "timings": []},
    {**GOOD, "timings": {"predicted_ms": float("nan")}}, {**GOOD, "timings": {"predicted_ms": -1}},
    {**GOOD, "timings": {"draft_n": 1.5}}, {**GOOD, "timings": {"draft_n": 10 ** 30}},
    {**GOOD, "timings": {"predicted_n": "7"}},
])
def test_a_bad_answer_is_one_line(answer):
    with pytest.raises(ServerError) as caught:
        parse_completion(answer)
    assert "\n" not in str(caught.value)


class _Standin(http.server.BaseHTTPRequestHandler):
    """A server on 127.0.0.1 that answers what the test asks of it."""

    reply: tuple[int, bytes] = (200, b"{}")

    def do_POST(self):  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        status, body = self.reply
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def standin():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Standin)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("status, body, says", [
    (200, b"not json \x1b[2J", "is not JSON: not json \\x1b[2J"),
    (200, b"\xff\xfe", "is not JSON"),
    (500, b"boom", "HTTP 500 boom"),
    (200, json.dumps({"tokens": "nope"}).encode(), "no list of token ids"),
])
def test_a_server_answering_garbage_is_one_line(standin, status, body, says):
    _Standin.reply = (status, body)
    with pytest.raises(ServerError) as caught:
        ServerClient(f"http://127.0.0.1:{standin.server_address[1]}", timeout_s=5).complete([1, 2], 4)
    assert says in str(caught.value) and "\n" not in str(caught.value) and "\x1b" not in str(caught.value)


def test_a_server_that_is_not_there_is_one_line(standin):
    port = standin.server_address[1]
    standin.shutdown()
    standin.server_close()
    with pytest.raises(ServerError, match="could not connect"):
        ServerClient(f"http://127.0.0.1:{port}", timeout_s=5).complete([1], 1)


def _require_server():
    if find_program(SERVER) is None:
        if os.environ.get("SPECULA_REQUIRE_LLAMA") == "1":
            pytest.fail("llama-server is required here (SPECULA_REQUIRE_LLAMA=1)")
        pytest.skip("llama-server is not built here")


def test_a_file_llama_server_refuses_is_one_line_and_no_process_is_left(tmp_path):
    _require_server()
    bad = tmp_path / "notes.gguf"
    bad.write_text("not a model\n" * 100)
    server = LlamaServer(bad, ["-t", "1"], start_timeout_s=60)
    with pytest.raises(ServerStartError) as caught:
        server.start()
    assert "\n" not in str(caught.value) and str(caught.value).startswith("llama-server stopped while starting")
    assert server._process is None


def test_llama_server_answers_greedy_on_loopback_and_stops_with_its_block(tiny_paths):
    _require_server()
    with LlamaServer(tiny_paths["llama-q8"], ["-t", "1"]) as server:
        assert server.url.startswith("http://127.0.0.1:")
        first = server.client.complete([1, 5, 9, 12], 6)
        again = server.client.complete([1, 5, 9, 12], 6)
        raw = server.client.http.post_json("/completion", {"prompt": [1, 5, 9, 12], "n_predict": 6,
                                                            "temperature": 0.0, "ignore_eos": True}, 60)
        process = server._process
    # The bench's rate for llama-server is the one it reports itself, not one step more per reply
    timings = raw["timings"]
    assert parse_completion(raw).decode_tps == pytest.approx(timings["predicted_per_second"], rel=1e-6)
    assert first.tokens == again.tokens and 1 <= len(first.tokens) <= 6
    assert first.predicted_n == len(first.tokens) and first.prompt_n == 4
    assert process.poll() is not None  # stopped with the block
    with pytest.raises(ServerError):
        server.client.complete([1], 1)


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    from app.cli import main

    capsys.readouterr()
    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


def test_run_on_llama_server_gives_our_greedy_reply_and_our_json(capsys, tiny_paths):
    _require_server()
    model = str(tiny_paths["llama-q8"])
    common = ["run", "-m", model, "-p", "The quick brown fox", "-n", "12", "--temp", "0", "--json", "-t", "1"]
    code, out, err = _run(capsys, *common, "--backend", "llama.cpp")
    assert code == 0, err
    ours = json.loads(out.strip().splitlines()[-1])
    code, out, err = _run(capsys, *common, "--engine", "llama-server")
    assert code == 0, err
    theirs = json.loads(out.strip().splitlines()[-1])
    # The text and the count are exact; a tiny random model's bytes are not whole characters,
    # and llama-server streams such a token with the next one under that one's id alone.
    assert theirs["text"] == ours["text"] and theirs["n_predicted"] == ours["n_predicted"] == 12
    assert {"tokens", "text", "n_drafted", "n_accepted", "decode_tps"} <= set(theirs)
    assert theirs["drafter"] == "llama-server none" and "plan: llama-server" in err


def test_a_type_only_llama_server_runs_goes_there_and_its_refusal_is_one_line(capsys, tiny_paths):
    _require_server()
    code, out, err = _run(capsys, "run", "-m", str(tiny_paths["llama-q8"]), "--spec-type", "draft-mtp", "-p", "hi",
                          "-n", "4", "-t", "1")
    assert code == 1 and len(err.strip().splitlines()) == 1, err
    assert "llama-server stopped while starting" in err and "MTP" in err and "Traceback" not in err
    code, _, err = _run(capsys, "run", "-m", str(tiny_paths["llama-q8"]), "--engine", "specula",
                        "--spec-type", "draft-mtp", "-p", "hi")
    assert code == 2 and "runs only on llama-server" in err


@pytest.mark.demo
def test_the_servers_steps_carry_its_own_counts(demo_path):
    """Each StepEvent of a llama-server reply is one verify step: its accepted tokens marked as
    drafts, and the steps' counts add up to the server's own timings (what the charts show)."""
    _require_server()
    from app.engine.llama_server.engine import generate_on_server
    from app.engine.events import DoneEvent, Origin, StepEvent
    from app.engine.loop.sampling import SamplingParams

    from app.cli.bench.common import PROMPTS

    with LlamaServer(demo_path("smollm2-135m"), ["-t", "2", "--spec-type", "ngram-cache"]) as server:
        prompt = server.client.apply_template([{"role": "user", "content": PROMPTS["code-rewrite"]}])
        ids = server.client.tokenize(prompt)
        events = list(generate_on_server(server.client, ids, 64, SamplingParams(temperature=0.0), "ngram-cache"))
        again = server.client.complete(ids, 64)
    steps = [e for e in events if isinstance(e, StepEvent)]
    summary = events[-1].summary
    assert isinstance(events[-1], DoneEvent)
    assert summary.n_drafted > 0 and summary.n_accepted > 0
    assert sum(s.n_drafted for s in steps) == summary.n_drafted
    assert sum(s.n_accepted for s in steps) == summary.n_accepted
    assert sum(o is Origin.DRAFT for s in steps for o in s.origins) == summary.n_accepted
    assert list(summary.tokens) == [t for s in steps for t in s.tokens] == list(again.tokens[:len(summary.tokens)])


@pytest.mark.demo
def test_run_on_llama_server_is_our_greedy_reply_token_for_token(capsys, demo_path):
    _require_server()
    common = ["run", "-m", str(demo_path("smollm2-135m")), "--chat", "-p", "Name three colours.", "-n", "24", "--temp", "0",
              "--json"]
    replies = []
    for engine in ("specula", "llama-server"):
        code, out, err = _run(capsys, *common, "--engine", engine)
        assert code == 0, err
        replies.append(json.loads(out.strip().splitlines()[-1]))
    assert replies[0]["tokens"] == replies[1]["tokens"] and replies[0]["text"] == replies[1]["text"]


def _workers(n: int):
    """n llama.cpp rpc-server workers on 127.0.0.1, as `specula rpc-worker` starts them."""
    import subprocess
    import time

    from app.engine.llama_server.process import free_port
    from app.engine.llama_server.programs import RPC_SERVER

    program = find_program(RPC_SERVER)
    ports = [free_port() for _ in range(n)]
    procs = [subprocess.Popen([str(program), "-H", "127.0.0.1", "-p", str(p), "-t", "1"], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL) for p in ports]
    time.sleep(0.5)
    return procs, ",".join(f"127.0.0.1:{p}" for p in ports)


def test_a_model_split_across_two_rpc_workers_gives_the_local_reply(capsys, tiny_paths):
    _require_server()
    procs, endpoints = _workers(2)
    try:
        common = ["run", "-m", str(tiny_paths["llama-f32"]), "-p", "Once upon a time", "-n", "10", "--temp", "0",
                  "--json", "-t", "1", "--engine", "llama-server"]
        code, out, err = _run(capsys, *common)
        assert code == 0, err
        local = json.loads(out.strip().splitlines()[-1])
        code, out, err = _run(capsys, *common, "--rpc", endpoints)
        assert code == 0, err
        split = json.loads(out.strip().splitlines()[-1])
        assert split["text"] == local["text"] and split["n_predicted"] == local["n_predicted"]
        assert f"split across RPC workers {endpoints}" in err
        procs[1].kill()
        procs[1].wait()
        code, out, err = _run(capsys, *common, "--rpc", endpoints)  # a worker gone: llama-server stops, we say so
        assert code == 1 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
        assert err.startswith("specula: error: llama-server")
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def test_rpc_flags_are_checked_and_a_worker_off_loopback_is_warned_about(capsys, tiny_paths):
    _require_server()
    code, _, err = _run(capsys, "run", "-m", str(tiny_paths["llama-f32"]), "-p", "hi", "--rpc", "nohost")
    assert code == 2 and "'nohost' is not HOST:PORT" in err
    code, _, err = _run(capsys, "run", "-m", str(tiny_paths["llama-f32"]), "-p", "hi", "--rpc", "127.0.0.1:1",
                        "--engine", "specula")
    assert code == 2 and "--rpc runs only on llama-server" in err
    code, _, err = _run(capsys, "rpc-worker", "--host", "256.0.0.1", "--port", "50999")  # no such address
    lines = err.strip().splitlines()
    assert code == 1 and "no authentication" in lines[0] and lines[-1].startswith("specula: error: the RPC worker stopped")


def test_run_against_a_server_at_a_url_with_its_key(capsys, tiny_paths, tmp_path):
    _require_server()
    key_file = tmp_path / "key"
    key_file.write_text("s3cret-key\n")
    wrong = tmp_path / "wrong"
    wrong.write_text("not-it\n")
    with LlamaServer(tiny_paths["llama-q8"], ["-t", "1", "--api-key", "s3cret-key"]) as server:
        common = ["run", "-m", "ignored", "-p", "Once upon a time", "-n", "6", "--temp", "0", "--json",
                  "--server", server.url]
        code, out, err = _run(capsys, *common, "--api-key-file", str(key_file))
        assert code == 0, err
        assert json.loads(out.strip().splitlines()[-1])["n_predicted"] == 6
        assert "s3cret" not in out + err and f"the llama-server at {server.url}" in err
        code, out, err = _run(capsys, *common, "--api-key-file", str(wrong))
        assert code == 1 and len(err.strip().splitlines()) == 1 and "HTTP 401" in err and "not-it" not in err
        url = server.url
    code, _, err = _run(capsys, "run", "-m", "x", "-p", "hi", "--server", url)  # stopped now
    assert code == 1 and "could not connect" in err and len(err.strip().splitlines()) == 1
    code, _, err = _run(capsys, "run", "-m", "x", "-p", "hi", "--server", "ftp://host/")
    assert code == 2 and "is not an http:// or https:// URL" in err


class _Cutoff(_Standin):
    """A stand-in that streams two good chunks and closes the connection mid-reply."""

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for token in (5, 6):
            chunk = {"content": "x", "tokens": [token], "stop": False, "tokens_predicted": token - 4}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
        self.wfile.flush()


def test_a_stream_cut_off_mid_reply_is_one_line():
    from app.engine.llama_server.engine import generate_on_server
    from app.engine.loop.sampling import SamplingParams

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Cutoff)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        client = ServerClient(f"http://127.0.0.1:{server.server_address[1]}", timeout_s=5)
        seen = []
        with pytest.raises(ServerError) as caught:
            for event in generate_on_server(client, [1, 2], 8, SamplingParams(temperature=0.0), "x"):
                seen.append(event)
        assert "the stream ended before the reply did" in str(caught.value)
        assert [t for e in seen for t in e.tokens] == [5, 6]  # what came is kept: the chat keeps it
    finally:
        server.shutdown()
        server.server_close()


def test_a_session_says_a_server_died_mid_reply_and_starts_it_again_on_the_next(tmp_path):
    """The window keeps one session per chat: llama-server dying (an RPC worker gone, out of memory)
    is one line for that reply, and the next reply starts it again."""
    from app.engine.llama_server.session import ServerSession
    from app.engine.llama_server.spec import ServerEngine
    from app.engine.events import DoneEvent
    from app.engine.loop.sampling import SamplingParams
    from tests.tiny_gguf import TinySpec, write_tiny_gguf

    _require_server()
    greedy = SamplingParams(temperature=0.0)
    # The kill must land mid-reply: the tiny models end a greedy reply at EOS within a few tokens
    # and at their 512-token context in well under a second, so this one has a long context and
    # the long reply ignores EOS (seconds of work left when the kill comes, on any machine).
    model = write_tiny_gguf(tmp_path / "long.gguf", TinySpec(arch="llama", qtype="F32", context_length=8192))
    with ServerSession(ServerEngine(threads=1, ctx_size=8192), model) as session:
        ids = session.prompt_ids(text="Once upon a time")
        first = [e for e in session.reply_ids(ids, 8, greedy) if isinstance(e, DoneEvent)][0].summary
        events = session.reply_ids(ids, 8000, greedy, extra={"ignore_eos": True})
        next(events)
        session._server._process.kill()  # as llama.cpp aborts when a worker goes away
        with pytest.raises(ServerError) as caught:
            list(events)
        assert str(caught.value).startswith("llama-server stopped mid-reply: ")
        again = [e for e in session.reply_ids(ids, 8, greedy) if isinstance(e, DoneEvent)][0].summary
        assert again.tokens == first.tokens


@pytest.mark.demo
def test_the_benchs_llama_server_times_our_text_on_a_sliding_window_model(demo_path):
    """Gemma 3 has sliding-window layers: with llama-server's window-sized cache its greedy reply
    to the bench's maths prompt leaves ours at a near-tie on the first tokens; the bench's peer
    keeps the whole window as our engine does (--swa-full) and gives our text."""
    _require_server()
    from app.cli.bench import server as bench_server
    from app.cli.bench.common import PROMPTS, prompt_ids, timed_reply
    from app.engine.drafting.factory import make_drafter
    from app.engine.loader import load_model
    from app.engine.loop.sampling import SamplingParams
    from app.engine.loop.speculative import DecodeSettings

    main = load_model(demo_path("gemma3-270m"))
    ids = prompt_ids(main, PROMPTS["maths"])
    settings = DecodeSettings(max_new_tokens=24, sampling=SamplingParams(temperature=0.0))
    ours = list(timed_reply(main, make_drafter(main, "none"), ids, settings, kv=main.kv_model(4096))[2].tokens)
    # Without the flag the reply left ours at its second token on a Zen 2 (a 0.07-logit near-tie);
    # whether a near-tie flips depends on the CPU's kernels, so only the flag's side is asserted.
    peer = bench_server.LlamaServerPeer(main.path, 2, 4096)
    try:
        assert peer.first("none", ids, 24)[0][:len(ours)] == ours
    finally:
        peer.close()
