"""`specula run --server URL` against servers speaking OpenAI's API: a stand-in shaped as vLLM
(its counters in /metrics) and made to misbehave, llama-server itself through that API with
--metrics (its counts must equal those of its own API on the same request), and Specula's own
`specula serve` as "another Specula". Every failure is one line and exit 1, never a traceback,
never the key."""

from __future__ import annotations

import json
import re

import pytest

from app.engine.llama_server.client import ServerError
from app.engine.llama_server.session import ServerSession
from app.engine.llama_server.spec import ServerEngine
from app.engine.events import DoneEvent, StepEvent
from app.engine.loop.sampling import SamplingParams
from tests.engine.test_llama_server import _run
from tests.openai_standin import ACCEPTED_PER_REPLY, DRAFTED_PER_REPLY, STEPS_PER_REPLY, Standin, StandinServer

KEY = "s3cret-remote-key"


@pytest.fixture
def key_file(tmp_path):
    path = tmp_path / "key"
    path.write_text(KEY + "\n")
    return str(path)


def test_run_on_an_openai_server_prints_its_reply_and_its_metrics_counts(capsys, key_file):
    with StandinServer(key=KEY) as server:
        code, out, err = _run(capsys, "run", "-m", "anything", "--server", server.url, "--api-key-file", key_file,
                              "--chat", "-p", "Say hello", "-n", "16", "--temp", "0", "--json")
    assert code == 0, err
    result = json.loads(out.strip().splitlines()[-1])
    assert out.startswith("Hello, world!") and result["text"] == "Hello, world!"
    assert (result["n_drafted"], result["n_accepted"], result["n_steps"]) == (DRAFTED_PER_REPLY, ACCEPTED_PER_REPLY,
                                                                          STEPS_PER_REPLY)
    assert result["accepted_by_position"] == [2, 2] and result["drafted_by_position"] == [2, 2]
    assert result["n_predicted"] == 4 and result["n_prompt"] == 7 and result["decode_tps"] > 0
    assert result["tokens"] is None and result["unknown"] == ["tokens"]
    request = Standin.seen[-1]
    assert request["model"] == "org/tiny-model" and request["temperature"] == 0.0 and request["max_tokens"] == 16
    assert request["messages"] == [{"role": "user", "content": "Say hello"}] and request["stream"] is True
    assert "through OpenAI's API (model org/tiny-model" in err and KEY not in out + err


def test_run_on_a_server_needs_no_model_flag_and_without_either_says_what_is_missing(capsys):
    """Issue 60 item 14: `run --server URL` as the README writes it: the server names its model."""
    with StandinServer("no-metrics") as server:
        code, out, err = _run(capsys, "run", "--server", server.url, "-p", "Once", "-n", "8", "--json")
    assert code == 0, err
    assert json.loads(out.strip().splitlines()[-1])["text"] == "Hello, world!"
    assert Standin.seen[-1]["model"] == "org/tiny-model"  # the one it serves
    code, out, err = _run(capsys, "run", "-p", "Once", "-n", "8")
    assert code == 2 and "-m/--model is required" in err and "--server" in err and "Traceback" not in err


def test_raw_text_goes_to_completions_and_a_server_without_counters_says_unknown(capsys):
    with StandinServer("no-metrics") as server:
        code, out, err = _run(capsys, "run", "-m", "x", "--server", server.url, "-p", "Once", "-n", "8", "--json")
    assert code == 0, err
    result = json.loads(out.strip().splitlines()[-1])
    assert Standin.seen[-1]["prompt"] == "Once" and "messages" not in Standin.seen[-1]
    assert result["text"] == "Hello, world!" and result["n_drafted"] is None and result["accept_rate"] is None
    assert {"tokens", "n_drafted", "n_accepted", "acceptance_by_position"} <= set(result["unknown"])
    assert "n_drafted = unknown" in err and "accept    = unknown" in err


@pytest.mark.parametrize("mode, says", [
    ("garbage", "a streamed chunk is not JSON: {not json\\x1b[2J"),
    ("cutoff", "the stream ended before the reply did"),
    ("huge", "a streamed chunk is larger than 4 MiB"),
    ("error", "the server failed mid-reply: the engine died"),
    ("not-utf8", "a streamed chunk is not JSON"),
    ("bad-usage", "usage.completion_tokens is not a count"),
    ("models-garbage", "/v1/models: the answer is not JSON"),
    ("models-cutoff", "/v1/models: the answer was cut off after 10 bytes"),
])
def test_a_server_misbehaving_is_one_line_and_exit_1(capsys, key_file, mode, says):
    with StandinServer(mode, key=KEY) as server:
        code, out, err = _run(capsys, "run", "-m", "x", "--server", server.url, "--api-key-file", key_file,
                              "--chat", "-p", "hi", "-n", "8")
    lines = err.strip().splitlines()
    assert code == 1 and len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("specula: error: ") and says in lines[0] and "\x1b" not in err
    assert KEY not in out + err


def test_a_refused_key_and_a_server_that_is_not_there_are_one_line(capsys, tmp_path):
    wrong = tmp_path / "wrong"
    wrong.write_text("not-the-key\n")
    with StandinServer(key=KEY) as server:
        code, _, err = _run(capsys, "run", "-m", "x", "--server", server.url, "--api-key-file", str(wrong), "-p", "hi")
        url = server.url
    assert code == 1 and len(err.strip().splitlines()) == 1 and "HTTP 401" in err
    assert "not-the-key" not in err  # the stand-in echoes the key it was sent; the line hides it
    code, _, err = _run(capsys, "run", "-m", "x", "--server", url, "-p", "hi")
    assert code == 1 and len(err.strip().splitlines()) == 1 and "could not connect" in err


@pytest.mark.parametrize("mode", ["slow", "models-slow"])
def test_a_slow_server_is_one_line_after_the_timeout(mode):
    with StandinServer(mode) as server:
        engine = ServerEngine(url=server.url, timeout_s=1.0)
        with pytest.raises(ServerError) as caught, ServerSession(engine) as session:
            list(session.reply_to(8, SamplingParams(), messages=[{"role": "user", "content": "hi"}]))
    assert "\n" not in str(caught.value) and "timed out" in str(caught.value)


def test_a_password_in_the_url_is_never_shown(capsys):
    code, _, err = _run(capsys, "run", "-m", "x", "--server", "http://user:hunter2@127.0.0.1:9/", "-p", "hi")
    assert code == 1 and "hunter2" not in err and "http://127.0.0.1:9" in err


@pytest.mark.demo
def test_llama_server_through_openais_api_counts_what_its_own_api_counts(demo_path):
    """The same greedy chat through llama-server's native API (per-step counts in its chunks) and
    through OpenAI's (counts from its --metrics before and after): same text, same counts."""
    from tests.engine.test_llama_server import _require_server
    from app.engine.llama_server.process import LlamaServer

    _require_server()
    messages = [{"role": "user", "content": "Repeat exactly: def add(a, b): return a + b; def add(a, b): return a + b"}]
    summaries = {}
    with LlamaServer(demo_path("smollm2-135m"), ["-t", "2", "--metrics", "--spec-type", "ngram-simple"]) as server:
        for api in ("auto", "openai"):
            with ServerSession(ServerEngine(url=server.url, api=api)) as session:
                assert session.speaks_openai is (api == "openai")
                events = list(session.reply_to(48, SamplingParams(temperature=0.0), messages=messages))
            assert isinstance(events[-1], DoneEvent) and all(isinstance(e, StepEvent) for e in events[:-1])
            summaries[api] = events[-1].summary
    native, openai = summaries["auto"], summaries["openai"]
    assert openai.text == native.text and native.n_drafted > 0
    assert (openai.n_drafted, openai.n_accepted, openai.n_steps) == (native.n_drafted, native.n_accepted, native.n_steps)
    assert sum(openai.accepted_by_position) == native.n_accepted
    assert openai.unknown == ("tokens",) and native.unknown == ()


def test_another_specula_answers_with_its_own_draft_counts(capsys, tiny_paths, key_file):
    """`specula serve` (a tiny main model and a tiny draft) as a team's server: its reply and its
    drafted/accepted counts, from its /metrics, equal those it reports itself in the reply's timings."""
    import httpx2

    from tests.cli.test_server_cli import ServerProcess

    tiny, draft = str(tiny_paths["llama-f32"]), str(tiny_paths["llama-q8"])
    # A fixed draft length: the two requests below draft alike (an adaptive one follows the timings).
    server = ServerProcess(["-m", tiny, "-md", draft, "--device", "cpu", "--dtype", "float32", "--port", "0",
                            "--api-key", KEY, "--draft-fixed", "--spec-draft-n-max", "4"])
    try:
        url = server.wait_ready()
        code, out, err = _run(capsys, "run", "-m", "llama-f32", "--server", url, "--api-key-file", key_file,
                              "--chat", "-p", "What is the capital of France?", "-n", "16", "--temp", "0", "--json")
        assert code == 0, err
        ours = json.loads(out.strip().splitlines()[-1])
        body = {"model": "llama-f32", "messages": [{"role": "user", "content": "What is the capital of France?"}],
                "max_tokens": 16, "temperature": 0.0, "stream": False}
        theirs = httpx2.post(f"{url}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {KEY}"},
                             timeout=120).json()
    finally:
        server.stop()
    assert ours["text"] == theirs["choices"][0]["message"]["content"]
    assert ours["n_drafted"] == theirs["timings"]["draft_n"] > 0
    assert ours["n_accepted"] == theirs["timings"]["draft_n_accepted"]
    assert ours["n_steps"] is None and "n_steps" in ours["unknown"]  # its /metrics counts no steps
    assert re.search(r"through OpenAI's API \(model llama-f32", err) and KEY not in out + err


def test_an_https_server_whose_certificate_is_not_trusted_is_refused(tmp_path):
    """TLS is verified: a self-signed certificate (made here with the openssl program) is one line."""
    import shutil
    import ssl
    import subprocess

    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl program to make a certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    with StandinServer() as server:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        server.server.socket = context.wrap_socket(server.server.socket, server_side=True)
        engine = ServerEngine(url=server.url.replace("http://", "https://"), timeout_s=5.0)
        with pytest.raises(ServerError) as caught, ServerSession(engine):
            pass
    assert "\n" not in str(caught.value) and "TLS failed" in str(caught.value)
    assert "CERTIFICATE_VERIFY_FAILED" in str(caught.value)
