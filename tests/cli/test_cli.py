"""The `specula` command line on tiny GGUF models, run for real in subprocesses (`python -m app ...`).

Each subprocess spends seconds importing torch and transformers, so every subprocess command of
this module is declared once in `commands()` and all of them run concurrently the first time a test
asks for one (`cli` fixture); each test then checks the results of its commands. A few more checks
of the same code paths (argparse errors, header-only subcommands) call `app.cli.main` in this
process (`specula` fixture), where a subprocess would add seconds and nothing else.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.header_gguf import make_tokens, write_gguf
from tests.tiny_gguf import CHATML, VOCAB_SIZE, tiny_vocab

ROOT = Path(__file__).resolve().parents[2]
ANSI = re.compile(r"\x1b\[[0-9;]*m")
PROMPT = "def add(a, b):\n    return a + b\n\ndef add(a, b):\n"
SYSTEM = "You are a helpful assistant."
CHAT_PROMPT = "What is the capital of France?"
JSON_KEYS = {"text", "tokens", "n_prompt", "n_predicted", "n_drafted", "n_accepted",
             "accept_rate", "encode_tps", "decode_tps"}
GREEDY = ["--temp", "0", "-n", "24", "--json"]


def commands(files: dict[str, Path]) -> dict[str, list[str]]:
    """name -> arguments of `python -m app`; files holds the models and bad files."""
    tiny, other, notemplate = str(files["llama-f32"]), str(files["llama-other"]), str(files["llama-notemplate"])
    return {
        # Decoding: the same greedy tokens whatever drafts them.
        "none": ["run", "-m", tiny, "-p", PROMPT, *GREEDY],
        # Fixed: whether the adaptive length drafts at all weighs a cost curve measured while the
        # other commands run beside it (on a 2-core AVX-512 machine a curve measured so said
        # drafting never pays, and these drafted nothing); its choice is tested in test_schedule.
        "lookup": ["run", "-m", tiny, "--lookup", "-p", PROMPT, "--draft-fixed", *GREEDY],
        "draft-other": ["run", "-m", tiny, "-md", other, "-p", PROMPT, "--draft-fixed", *GREEDY],
        "draft-same": ["run", "-m", tiny, "-md", tiny, "-p", PROMPT, "--color", "--draft-fixed", *GREEDY],
        "chat": ["run", "-m", tiny, "--chat", "-sys", SYSTEM, "-p", CHAT_PROMPT, "-n", "8", "--temp", "0", "--json"],
        "chat-notemplate": ["run", "-m", notemplate, "--chat", "-sys", SYSTEM, "-p", CHAT_PROMPT,
                            "-n", "8", "--temp", "0", "--json"],
        # Errors: a bad flag (exit 2), a bad model file (1), a draft for another vocabulary (3).
        "unknown-flag": ["run", "-m", tiny, "-p", "x", "--no-such-flag"],
        "truncated": ["run", "-m", str(files["truncated"]), "-p", "x"],
        "draft-incompatible": ["run", "-m", tiny, "-md", str(files["other-vocab-type"]), "-p", "x", "-n", "4"],
        "pair-bad": ["check-pair", tiny, str(files["other-vocab-type"])],
        # Header facts and the benchmark.
        "inspect-json": ["inspect", tiny, "--json"],
        "bench": ["bench", "-m", tiny, "-n", "8", "--prompts", "chat", "--no-hf", "--no-llama-cpp", "--no-server",
                  "-r", "3"],
    }


@pytest.fixture(scope="module")
def files(tiny_paths, tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("cli-files")
    text = folder / "readme.gguf"
    text.write_text("This is a text file, not a model.\n" * 10)
    data = tiny_paths["llama-f32"].read_bytes()
    truncated = folder / "cut.gguf"
    truncated.write_bytes(data[: len(data) // 2])
    # Header-only files (no weights: compatibility is decided before anything is loaded). Same
    # vocabulary size and type as the tiny models, other token texts / another vocabulary type.
    other_tokens = write_gguf(folder / "foreign-tokens.gguf", tokens=make_tokens(VOCAB_SIZE, "zz"))
    tokens, _, merges = tiny_vocab()
    spm_type = write_gguf(folder / "spm-vocab.gguf", tokens=tokens, vocab_type="llama", merges=merges)
    # A tokenizer model we cannot build a tokenizer from: no text-level drafting either.
    other_type = write_gguf(folder / "wpm-vocab.gguf", tokens=tokens, vocab_type="bert", merges=merges)
    return {**tiny_paths, "dir": folder, "text": text, "truncated": truncated,
            "other-tokens": other_tokens, "spm-vocab-type": spm_type, "other-vocab-type": other_type}


@pytest.fixture(scope="module")
def cli(files) -> dict[str, subprocess.CompletedProcess]:
    env = {**os.environ, "TRANSFORMERS_VERBOSITY": "error", "HF_HUB_OFFLINE": "1"}

    def run(args: list[str]) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "app", *args], cwd=ROOT, env=env, capture_output=True,
            encoding="utf-8", errors="replace", timeout=300,
        )

    todo = commands(files)
    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 1)) as pool:
        results = dict(zip(todo, pool.map(run, todo.values())))
    return results


@pytest.fixture
def specula(capsys, monkeypatch):
    """In-process `specula ARGS...` -> (exit code, stdout, stderr)."""
    from app.cli import main

    for name in ("TRANSFORMERS_VERBOSITY", "HF_HUB_DISABLE_PROGRESS_BARS", "TQDM_DISABLE"):
        monkeypatch.delenv(name, raising=False)  # main() sets them; restored after the test

    def call(*args: str) -> tuple[int, str, str]:
        capsys.readouterr()
        try:
            code = main(list(args))
        except SystemExit as exc:  # argparse, --version
            code = exc.code if isinstance(exc.code, int) else 1
        out, err = capsys.readouterr()
        return code, out, err

    return call


def last_json(result: subprocess.CompletedProcess) -> dict:
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def one_line(stderr: str) -> str:
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    return lines[0]


# ---------------------------------------------------------------------------------------------
# run


def test_run_json_and_greedy_identity_across_drafters(cli):
    none, lookup, other = last_json(cli["none"]), last_json(cli["lookup"]), last_json(cli["draft-other"])
    for data in (none, lookup, other):
        assert JSON_KEYS <= data.keys()
        assert data["n_predicted"] == len(data["tokens"]) > 0
        assert data["n_prompt"] > 0
        assert 0.0 <= data["accept_rate"] <= 1.0
        assert data["n_accepted"] <= data["n_drafted"]
        assert data["encode_tps"] > 0 and data["decode_tps"] > 0
    assert lookup["tokens"] == none["tokens"]
    assert other["tokens"] == none["tokens"]
    assert lookup["text"] == none["text"] == other["text"]
    assert none["n_drafted"] == 0
    assert lookup["n_drafted"] > 0  # the prompt repeats itself, so lookup found drafts
    assert other["n_drafted"] > 0
    # Without --color, the streamed text is the plain text, before the JSON line.
    stream = cli["lookup"].stdout.rstrip("\n").rsplit("\n", 1)[0]
    assert stream == lookup["text"]
    assert "\x1b[" not in cli["lookup"].stdout


def test_run_color_marks_accepted_draft_text(cli):
    result = cli["draft-same"]
    data = last_json(result)
    assert data["tokens"] == last_json(cli["none"])["tokens"]
    assert data["n_accepted"] > 0 and data["accept_rate"] == 1.0  # a draft equal to the main model
    stream = result.stdout.rstrip("\n").rsplit("\n", 1)[0]
    assert "\x1b[32m" in stream and "\x1b[0m" in stream
    assert ANSI.sub("", stream) == data["text"]


def test_run_stderr_summary_like_llama_cpp(cli):
    stderr = cli["draft-same"].stderr
    data = last_json(cli["draft-same"])
    assert re.search(rf"^n_drafted\s*=\s*{data['n_drafted']}$", stderr, re.M), stderr
    assert re.search(rf"^n_accept\s*=\s*{data['n_accepted']}$", stderr, re.M), stderr
    assert re.search(r"^accept\s*=\s*100\.000%$", stderr, re.M), stderr
    assert re.search(rf"^decoded\s+{data['n_predicted']} tokens in\s+[\d.]+ seconds, speed:", stderr, re.M)
    assert re.search(r"^encoded\s+\d+ tokens in", stderr, re.M)
    # Nothing else: no transformers progress bars or warnings.
    assert "Loading weights" not in stderr and "%|" not in stderr and "Traceback" not in stderr


def test_run_chat_with_system_prompt(cli, tiny_loaded):
    tokenizer = tiny_loaded("llama-f32").tokenizer
    chatml = (f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{CHAT_PROMPT}<|im_end|>\n"
              "<|im_start|>assistant\n")
    fallback = f"{SYSTEM}\n\nUser: {CHAT_PROMPT}\nAssistant:"
    for name, text in (("chat", chatml), ("chat-notemplate", fallback)):
        data = last_json(cli[name])
        assert data["n_prompt"] == len(tokenizer.encode(text)), name
        assert data["n_predicted"] <= 8
    assert tiny_loaded("llama-f32").tokenizer.chat_template == CHATML


# ---------------------------------------------------------------------------------------------
# Errors: one line on stderr, the documented exit codes


def test_bad_flags_exit_2_with_one_line(cli, specula, tiny_paths):
    result = cli["unknown-flag"]
    assert result.returncode == 2, result.stderr
    assert one_line(result.stderr).startswith("specula: error:")
    assert "--no-such-flag" in result.stderr
    assert result.stdout == ""

    tiny = str(tiny_paths["llama-f32"])
    for args, needle in (
        (["run", "-p", "x"], "-m/--model"),
        (["run", "-m", tiny, "-p", "x", "--temp", "abc"], "--temp"),
        (["run", "-m", tiny, "-p", "x", "-n", "4", "--bogus"], "--bogus"),
        (["run", "-m", tiny], "-p/--prompt"),
        (["frobnicate"], "frobnicate"),
    ):
        code, out, err = specula(*args)
        assert code == 2, (args, err)
        line = one_line(err)
        assert line.startswith("specula") and needle in line, (args, line)
        assert out == ""


def test_unusable_sampling_flags_are_one_line_errors_and_edges_work(specula, tiny_paths):
    """--temp nan used to end in a traceback (run) or a 500 on every request (serve); --top-p 0
    in a NaN. Now: one line, non-zero exit, before a model is loaded or a port bound."""
    tiny = str(tiny_paths["llama-f32"])
    for flags, needle in ((["--temp", "nan"], "temperature"), (["--temp", "-1"], "temperature"),
                          (["--top-p", "nan"], "top-p"), (["--min-p", "inf"], "min-p"),
                          (["--draft-p-min", "nan"], "draft p-min")):
        for command in (["run", "-m", tiny, "-p", "x", "-n", "2"], ["serve", "-m", tiny, "--port", "0"]):
            code, out, err = specula(*command, *flags)
            assert code == 1, (command, flags, err)
            line = one_line(err)
            assert line.startswith("specula: error: ") and needle in line, line
    code, out, err = specula("run", "-m", tiny, "-p", "x", "-n", "3", "--temp", "0.8", "--top-p", "0",
                             "--device", "cpu", "--dtype", "float32", "--json")
    assert code == 0, err
    assert json.loads(out.strip().splitlines()[-1])["n_predicted"] == 3
    code, out, err = specula("run", "-m", tiny, "-p", "x", "-n", "3", "--temp", "1e-40",
                             "--device", "cpu", "--dtype", "float32", "--json")
    greedy = specula("run", "-m", tiny, "-p", "x", "-n", "3", "--temp", "0",
                     "--device", "cpu", "--dtype", "float32", "--json")
    assert code == 0 and greedy[0] == 0, err
    tokens = [json.loads(o.strip().splitlines()[-1])["tokens"] for o in (out, greedy[1])]
    assert tokens[0] == tokens[1]  # a temperature too small to divide by is greedy


def test_bad_model_files_exit_1_with_one_line(cli, specula, files):
    result = cli["truncated"]
    assert result.returncode == 1, result.stderr
    line = one_line(result.stderr)
    assert line.startswith("specula: error: cut.gguf") and "truncated" in line
    assert result.stdout == ""

    for path in (files["dir"] / "missing.gguf", files["text"]):
        code, out, err = specula("run", "-m", str(path), "-p", "x")
        assert code == 1, err
        line = one_line(err)
        assert line.startswith("specula: error:") and path.name in line, line
        assert out == ""


def test_incompatible_draft_exits_3(cli):
    result = cli["draft-incompatible"]
    assert result.returncode == 3, result.stderr
    line = one_line(result.stderr)
    # Another vocabulary would draft through text; a WordPiece one cannot even do that.
    assert "wpm-vocab.gguf" in line and "cannot re-tokenize drafts" in line
    assert result.stdout == ""


def test_incompatible_draft_fails_before_the_main_model_loads(specula, files, monkeypatch):
    import app.engine.loader as loader

    def no_load(*args, **kwargs):
        raise AssertionError("the main model was loaded before its draft was checked")

    monkeypatch.setattr(loader, "load_model", no_load)
    code, out, err = specula("run", "-m", str(files["llama-f32"]), "-md", str(files["other-vocab-type"]), "-p", "x")
    assert code == 3, err
    assert "cannot re-tokenize drafts" in one_line(err)
    assert out == ""


# ---------------------------------------------------------------------------------------------
# check-pair, inspect, --version, bench


def test_check_pair(cli, specula, tiny_paths, files):
    code, out, err = specula("check-pair", str(tiny_paths["llama-f32"]), str(tiny_paths["qwen2-q8"]))
    assert code == 0, err
    assert out.startswith("compatible") and "qwen2-q8.gguf" in out and "llama-f32.gguf" in out
    assert "token-level" in out and "text-level" not in out
    assert err == ""

    bad = cli["pair-bad"]
    assert bad.returncode == 3, bad.stderr
    line = one_line(bad.stderr)
    assert "vocab_type" in line and "'gpt2'" in line and "'bert'" in line and "re-tokenize" in line
    assert bad.stdout == ""

    # Another vocabulary that both sides can tokenize: text-level, with a word on the cost.
    for other, rule in (("other-tokens", "token text differs"), ("spm-vocab-type", "vocabulary types differ"),
                        ("llama-b", "token text differs")):
        code, out, err = specula("check-pair", str(tiny_paths["llama-f32"]), str(files[other]))
        assert code == 0, err
        assert "text-level (different vocabularies: drafts are re-tokenized, each step costs more)" in out
        assert rule in out


def test_inspect(cli, specula, tiny_paths):
    as_json = cli["inspect-json"]
    assert as_json.returncode == 0, as_json.stderr
    data = json.loads(as_json.stdout)
    assert data["architecture"] == "llama"
    assert data["vocab_size"] == VOCAB_SIZE
    assert data["n_layers"] == 2
    assert data["has_chat_template"] is True
    assert data["memory_bytes"] == 2 * data["n_params"] > 0  # bfloat16 by default
    # 2 layers x 2 KV heads x (16 + 16) x 2 bytes
    assert data["kv_bytes_per_token"] == 2 * 2 * 32 * 2

    code, out, _ = specula("inspect", str(tiny_paths["qwen2-f32"]))
    assert code == 0
    assert re.search(r"^architecture:\s+qwen2$", out, re.M), out
    assert "qwen2-f32.gguf" in out
    code, out, _ = specula("inspect", str(tiny_paths["llama-notemplate"]), "--json")
    assert code == 0 and json.loads(out)["has_chat_template"] is False


def test_calibrate_on_torch_says_there_is_nothing_to_calibrate(specula, tiny_paths):
    """Only llama.cpp's step costs are measured ahead; torch's schedule measures as it goes."""
    code, out, err = specula("calibrate", str(tiny_paths["llama-q8"]), "--backend", "torch")
    assert code == 2 and out == ""
    assert one_line(err).startswith("specula: nothing to calibrate on torch (")


def test_bench_without_llama_cpps_rows_when_it_cannot_load_the_file(specula, tiny_paths, monkeypatch):
    """llama-cpp-python raises ValueError("Failed to load model from file: ...") for a file its
    llama.cpp cannot run (an architecture newer than it, say): our rows still come, with one line."""
    from app.cli.bench import llamacpp as bench_llamacpp

    class RefusingPeer:
        def __init__(self, path, **_settings):
            raise ValueError(f"Failed to load model from file: {path}")

    monkeypatch.setattr(bench_llamacpp, "available", lambda: True)
    monkeypatch.setattr(bench_llamacpp, "LlamaCppPeer", RefusingPeer)
    tiny = tiny_paths["llama-f32"]
    code, out, err = specula("bench", "-m", str(tiny), "-n", "4", "--prompts", "chat", "--no-hf", "--no-server")
    assert code == 0, err
    assert one_line(err) == (f"specula: llama.cpp could not run {tiny.name} (Failed to load model from file: "
                             f"{tiny}): its rows are left out")
    configs = {line[15:55].strip() for line in out.splitlines() if line.startswith("chat ")}
    assert configs == OUR_BENCH_ROWS


def test_version(specula):
    from app import __version__

    code, out, _ = specula("--version")
    assert code == 0
    assert out.strip() == f"specula {__version__}"


def test_bench_table(cli):
    result = cli["bench"]
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    header = next(line for line in lines if line.startswith("prompt"))
    assert header.split()[-1] == "identical"
    assert "each row the median of 3 runs" in lines[0]
    rows = {line[15:55].strip(): line.split() for line in lines if line.startswith("chat ")}
    # A drafter that learns is asked the same request again (a regenerate) after its first reply.
    assert set(rows) == OUR_BENCH_ROWS
    assert all(row[-1] == "yes" for row in rows.values())  # --no-hf, --no-llama-cpp, --no-server: no peer rows


# Our bench rows: plain, prompt lookup, and each drafter that learns asked first and again.
OUR_BENCH_ROWS = {"none", "lookup", *[kind + again for kind in ("lookup+ngram-cache", "ngram-mod",
                                                                 "lookup+ngram-cache+ngram-mod")
                                      for again in ("", " (again)")]}


def test_bench_puts_llama_servers_speculation_beside_ours(specula, tiny_paths):
    """llama-server (built from the binding's source) on the same file and prompt ids: plain and
    every n-gram type, the first request on a fresh server and the same request again, its greedy
    reply the same as ours, and the verdict table of our best against its best."""
    from app.cli.bench.server import SERVER_TYPES, available
    from tests.llama_support import require_llama_cpp

    require_llama_cpp()
    if available() is not None and os.environ.get("SPECULA_REQUIRE_LLAMA") != "1":
        pytest.skip(available())
    code, out, err = specula("bench", "-m", str(tiny_paths["llama-q8"]), "-n", "8", "--prompts", "chat,rewrite",
                             "--no-hf", "--no-llama-cpp", "-r", "1", "--backend", "llama.cpp")
    assert code == 0, err
    rows = {(line[:14].strip(), line[15:55].strip()): line.split() for line in out.splitlines()
            if line.startswith(("chat ", "rewrite "))}
    for prompt in ("chat", "rewrite"):
        for spec_type in SERVER_TYPES:
            assert (prompt, f"server {spec_type}") in rows and (prompt, f"server {spec_type} (again)") in rows
        assert rows[(prompt, "server none")][-1] == "yes"  # llama.cpp's own greedy reply is ours
    verdict = out[out.index("ours best against llama-server's best"):].splitlines()
    cells = [line.split() for line in verdict if line.startswith(("chat ", "rewrite "))]
    assert [(c[0], c[1]) for c in cells] == [("chat", "first"), ("chat", "again"), ("rewrite", "first"),
                                             ("rewrite", "again")]
    assert all(c[-1].endswith("x") and float(c[-1][:-1]) > 0 for c in cells)
    assert verdict[-1].startswith("geometric mean ")


def test_bench_on_a_pair_has_the_rows_a_pair_user_tries_on_both_engines(specula, tiny_paths):
    """With -md: plain, the default n-gram drafter, the draft model as scheduled and at llama.cpp's
    fixed length, the draft model with n-gram drafts; llama-server plain, draft-simple at its defaults
    and at 8 drafts, ngram-mod, and draft-simple with ngram-mod; each first and again."""
    from app.cli.bench.server import PAIR_TYPES, available
    from tests.llama_support import require_llama_cpp

    require_llama_cpp()
    server = available() is None
    if not server and os.environ.get("SPECULA_REQUIRE_LLAMA") == "1":
        pytest.fail(available())
    main, draft = tiny_paths["llama-f32"], tiny_paths["llama-q8"]
    code, out, err = specula("bench", "-m", str(main), "-md", str(draft), "-n", "8", "--prompts", "chat",
                             "--no-hf", "--no-llama-cpp", "-r", "1", "--backend", "llama.cpp", "--explain",
                             *([] if server else ["--no-server"]))
    assert code == 0, err
    rows = {line[15:55].strip(): line.split() for line in out.splitlines() if line.startswith("chat ")}
    name = "draft model"
    assert f"draft model: {draft.name}" in out.splitlines()[0]
    ours = {"none", "lookup+ngram-cache+ngram-mod", name, f"{name} fixed 3", "draft model + n-gram"}
    assert ours <= set(rows) and {f"{row} (again)" for row in ours - {"none"}} <= set(rows), out
    if server:
        for row in PAIR_TYPES:
            assert f"server {row}" in rows and f"server {row} (again)" in rows, sorted(rows)
        assert rows["server none"][-1] == "yes"
    why = out[out.index("why, row by row"):]
    assert f"chat / {name}: a drafted token costs" in why  # the draft model's tokens are priced


def test_bench_without_llama_server_says_so_in_one_line(specula, tiny_paths, tmp_path, monkeypatch):
    from tests.llama_support import require_llama_cpp

    require_llama_cpp()
    monkeypatch.setenv("SPECULA_LLAMA_BIN", str(tmp_path))  # a folder without it
    code, out, err = specula("bench", "-m", str(tiny_paths["llama-q8"]), "-n", "4", "--prompts", "chat", "--no-hf",
                             "--no-llama-cpp", "--backend", "llama.cpp", "--explain")
    assert code == 0, err
    assert one_line(err).startswith("specula: llama-server is not built here") and "rows are left out" in err
    assert "server " not in out
    # --explain: each priced row of ours says what its drafts cost and the acceptance they need
    why = out[out.index("why, row by row"):].splitlines()[1:]
    assert why and all(line.startswith("  chat / ") for line in why)
    assert all("a verify of 4 drafts" in line and "acceptance" in line for line in why), why


def test_bench_repeats_run_in_rounds_and_keep_each_rows_run_of_median_time():
    from app.cli.bench.command import _interleaved_runs, _median_run

    times = {"plain": iter([0.9, 0.3, 0.5, 2.0, 0.4]), "lookup": iter([0.2, 0.6, 0.1, 0.7, 0.3])}
    calls = []

    def run(name):
        calls.append(name)
        return (["tokens"], next(times[name]), name)

    done = _interleaved_runs(5, {("", "plain"): lambda: run("plain"), ("", "lookup"): lambda: run("lookup")})
    assert calls == ["plain", "lookup"] * 5  # rounds: a drift of the machine's speed hits both rows alike
    assert [r[1] for r in done[("", "lookup")]] == [0.2, 0.6, 0.1, 0.7, 0.3]  # in round order
    assert _median_run(done[("", "plain")]) == (["tokens"], 0.5, "plain")
    assert _median_run(done[("", "lookup")]) == (["tokens"], 0.3, "lookup")
    assert _median_run(_interleaved_runs(1, {("hf", "x"): lambda: ([], 1.5)})[("hf", "x")])[1] == 1.5


def test_bench_speedups_are_the_median_of_each_rounds_ratio():
    """A row's speedup pairs it with plain decoding's run of the same round: the machine's speed
    drifts between rounds, and the median runs of two rows may come from rounds far apart."""
    from types import SimpleNamespace

    from app.cli.bench.command import _paired_speedups

    def ours(seconds, decode_tps):
        return ([1] * 10, seconds, SimpleNamespace(decode_tps=decode_tps))

    # The machine halves its speed in round 2: both rows slow down alike.
    plain = [ours(1.0, 10.0), ours(2.0, 5.0), ours(1.0, 10.0)]
    lookup = [ours(0.5, 20.0), ours(1.0, 10.0), ours(0.55, 18.0)]
    total, decode = _paired_speedups("ours", lookup, plain)
    assert total == pytest.approx(2.0) and decode == pytest.approx(2.0)
    hf = [([1] * 10, 2.0), ([1] * 10, 4.0), ([1] * 10, 2.0)]
    assert _paired_speedups("hf", hf, plain) == (pytest.approx(0.5), None)  # no decode rate of its own
    llama = [([1] * 10, 0.5, 40.0), ([1] * 10, 1.0, 20.0), ([1] * 10, 0.5, 40.0)]
    assert _paired_speedups("llama.cpp", llama, plain) == (pytest.approx(2.0), pytest.approx(4.0))


def test_calibrate_on_llama_cpp_measures_its_steps(specula, tiny_paths):
    from tests.llama_support import require_llama_cpp

    require_llama_cpp()
    code, out, err = specula("calibrate", str(tiny_paths["llama-q8"]), "-t", "1", "--backend", "llama.cpp")
    assert code == 0, err
    assert out.startswith("llama.cpp on CPU, 1 threads: a step feeding n tokens")
    rows = [line.split() for line in out.splitlines() if line.strip()[:1].isdigit()]
    assert [int(r[0]) for r in rows] == [1, 2, 3, 5, 9, 17, 33, 65] and rows[0][2] == "1.00x"
    assert ("cached in " in out) or ("not kept" in out)


def test_bench_rows_counts_batch_rows_against_one_token_rows(specula, tiny_paths):
    from tests.llama_support import require_llama_cpp

    require_llama_cpp()
    code, out, err = specula("bench-rows", "-m", str(tiny_paths["llama-q8"]), "--cases", "3", "-t", "1", "-fa", "on")
    assert code == 0, err
    found = re.search(r"^llama-q8\.gguf: -t 1 -fa on: (\d+)/(\d+) batch rows bit-identical to one-token rows, "
                      r"(\d+)/(\d+) with the same argmax, max \|diff\| [\d.]+; plain decoding [\d.]+ tok/s$", out.strip())
    assert found, out
    same, total, argmax, total2 = map(int, found.groups())
    assert total == total2 and 6 <= total <= 27 and same <= argmax <= total


def test_bench_busy_prints_a_row_per_thread_count(specula, tiny_paths):
    from tests.llama_support import require_llama_cpp

    require_llama_cpp()
    code, out, err = specula("bench-busy", "-m", str(tiny_paths["llama-q8"]), "-n", "8", "-r", "1")
    assert code == 0, err
    rows = [line for line in out.splitlines() if line.startswith(("default", "-t "))]
    assert rows and rows[0].startswith("default (") and any(r.startswith("-t 1 ") for r in rows), out
    for row in rows:
        quiet, busy, again = (float(v) for v in row.split()[-3:])
        assert quiet > 0 and busy > 0 and again > 0


def test_inspect_names_the_model_as_the_window_does(specula, tiny_paths, demo_path, tmp_path):
    """One name for a model everywhere (issue 52 item 8): `specula inspect` leads with the
    library's name, not the header's general.name, which stays, labelled as the file's own."""
    import shutil

    demo_path("smollm2-135m")  # installed by the README's setup
    code, out, _ = specula("inspect", "smollm2-135m")
    assert code == 0
    assert re.search(r"^model:\s+SmolLM2 135M Instruct \(Q4_1\)$", out, re.M), out
    assert re.search(r"^general\.name:\s+Smollm2 135M 8k Lc100K Mix1 Ep2$", out, re.M), out
    assert not re.search(r"^name:", out, re.M)

    snapshot = tmp_path / "models--someone--Tiny-Llama-GGUF" / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    cached = shutil.copy(tiny_paths["llama-q8"], snapshot / "tiny-llama.Q8_0.gguf")
    code, out, _ = specula("inspect", str(cached), "--json")
    assert code == 0 and json.loads(out)["model"] == "someone/Tiny-Llama-GGUF (Q8_0)"
    code, out, _ = specula("inspect", str(tiny_paths["qwen2-f32"]))
    assert re.search(r"^model:\s+qwen2-f32$", out, re.M), out
