"""`specula compare` headless: the runner on tiny real GGUF models, results files, the CLI.

Drafts with known behaviour: the main model drafting for itself (every draft accepted), a one-layer
model of another seed (a useless draft: almost nothing accepted), prompt lookup on a prompt that
repeats itself (the tiny random model's reply falls into a loop, which lookup predicts). Float32 on
the CPU, so greedy outputs must be identical token for token (facts.md). The acceptance figures use
a fixed draft length and p-min 0 (every step drafts 4 tokens): the adaptive default chooses lengths
from measured times, which a busy machine would make vary from run to run.
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from app.compare.choices import parse_drafts, parse_lengths, plan_configs, resolve_draft
from app.compare.export import CSV_COLUMNS, csv_text, format_table, save_csv
from app.compare.prompts import (
    CATEGORIES, OWN, Prompt, PromptFileError, builtin_prompts, parse_prompts, prompts_from_arg,
)
from app.compare.results import (
    COMPARE_DEFAULTS, DEFAULT_DRAFT_MAX, CANCELLED, COMPLETE, LOOKUP, MODEL, NONE, CompareFileError, CompareRequest, CompareRun, DraftChoice,
    RunSettings, load_run,
)
from app.compare.summary import ALL, delta_line, deltas, speed_curve, table_rows
from app.compare.verdict import verdict
from app.engine.errors import IncompatibleDraftError, SpeculaError

ROOT = Path(__file__).resolve().parents[2]
COPY = "The model reads the file and the model writes the file. " * 3
PROMPTS = (Prompt("copy", COPY), Prompt("chat", "hello there, how are you?"))
N = 48
K = 4
# Every reply runs to N tokens; each step drafts K tokens whatever the draft's confidence.
SETTINGS = RunSettings(replace(COMPARE_DEFAULTS, max_tokens=N, draft_p_min=0.0), draft_sweep=(K,), ignore_eos=True)
LOOKUP_K, SAME_K, USELESS_K = f"lookup k={K}", f"same k={K}", f"useless k={K}"


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """Tiny models on one thread: on a loaded two-core machine, two threads spinning for each
    64-wide matrix product made this module 20x slower (38 s against 1.9 s for one comparison)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def request_for(tiny_paths, drafts, prompts=PROMPTS, settings=SETTINGS) -> CompareRequest:
    return CompareRequest(str(tiny_paths["llama-f32"]), tuple(drafts), tuple(prompts), settings,
                          device="cpu", dtype="float32")


def compare(tiny_paths, tiny_loaded, drafts, **kwargs) -> CompareRun:
    from app.compare.runner import Runner

    runner_args = {k: kwargs.pop(k) for k in ("save_to", "cancel", "on_update", "on_progress") if k in kwargs}
    return Runner(request_for(tiny_paths, drafts, **kwargs), main=tiny_loaded("llama-f32"), **runner_args).run()


@pytest.fixture(scope="module")
def saved(tiny_paths, tiny_loaded, tmp_path_factory):
    """One real comparison: none, lookup, the main model as its own draft, a useless draft."""
    path = tmp_path_factory.mktemp("compare") / "run.json"
    drafts = [DraftChoice(LOOKUP, label=LOOKUP), DraftChoice(MODEL, str(tiny_paths["llama-f32"]), "same"),
              DraftChoice(MODEL, str(tiny_paths["llama-other"]), "useless")]
    progress = []
    run = compare(tiny_paths, tiny_loaded, drafts, save_to=path, on_progress=progress.append)
    return run, path, progress


# --- the runner ------------------------------------------------------------------------------


def test_every_configuration_runs_every_prompt_with_identical_greedy_output(saved):
    run, _, progress = saved
    assert run.status == COMPLETE and not run.errors
    assert [c.name for c in run.configs] == [NONE, LOOKUP_K, SAME_K, USELESS_K]
    assert len(run.results) == run.n_expected == 8
    assert all(r.summary.n_predicted == N and len(r.summary.tokens) == N for r in run.results)
    baseline = {r.prompt_index: r.summary.tokens for r in run.results_of(NONE)}
    for r in run.results:
        if r.config == NONE:
            assert r.identical is None and r.summary.n_drafted == 0
        else:
            assert r.identical is True and r.summary.tokens == baseline[r.prompt_index]
    assert (progress[-1].done, progress[-1].total, progress[-1].stage) == (8, 8, COMPLETE)
    assert any(p.stage.startswith("draft useless") for p in progress)  # the draft's load is reported


def test_acceptance_follows_the_drafts_known_behaviour(saved):
    run = saved[0]
    rows = {(r.config, r.category): r for r in table_rows(run)}
    same, useless = rows[(SAME_K, ALL)], rows[(USELESS_K, ALL)]
    lookup_copy, lookup_chat = rows[(LOOKUP_K, "copy")], rows[(LOOKUP_K, "chat")]
    assert same.accept_rate == 1.0 and same.mean_accepted > K - 0.5  # shorter near the end
    assert useless.accept_rate < 0.05
    # Lookup drafts from the loop the reply falls into: on the repetitive prompt, more than on chat.
    assert lookup_copy.accept_rate > 0.3 and lookup_copy.accept_rate > lookup_chat.accept_rate
    assert same.accept_rate > lookup_copy.accept_rate > useless.accept_rate + 0.25
    assert rows[(NONE, ALL)].speedup == 1.0 and rows[(NONE, ALL)].accept_rate is None
    for config in (SAME_K, USELESS_K, LOOKUP_K):
        assert rows[(config, ALL)].identical_text == "yes"


def test_figures_are_measured_per_prompt(saved):
    run = saved[0]
    for r in run.results:
        assert r.summary.decode_s > 0 and r.summary.ttft_s > 0 and r.summary.decode_tps > 0
        assert r.timeline[0] == (1, 0.0) and r.timeline[-1][0] == N
        assert all(b[0] > a[0] and b[1] >= a[1] for a, b in zip(r.timeline, r.timeline[1:]))
        assert sum(r.summary.drafted_by_position[:1]) == r.summary.n_steps  # every drafting step drafts position 1
        if r.config in (SAME_K, USELESS_K):
            assert len(r.summary.drafted_by_position) == K
        if sys.platform.startswith("linux"):
            assert r.peak_rss_bytes and r.peak_rss_bytes > 50 << 20  # torch alone is more
    curve = speed_curve(run.results_of(NONE))
    assert curve and curve[0][0] == 9 and curve[-1][0] == N and all(y > 0 for _, y in curve)


def test_the_verdict_names_every_drafter(saved):
    line = verdict(saved[0])
    assert "\n" not in line
    for name in (LOOKUP, "same", "useless"):  # one length each: named without it
        assert f"{name}:" in line
    # The verdict follows the measured table (speeds vary by machine: no fixed outcome here).
    useless = next(r for r in table_rows(saved[0]) if r.config == USELESS_K and r.category == ALL)
    assert ("useless: slower than none" in line) == (useless.speedup < 1.0)


# --- results files ---------------------------------------------------------------------------


def test_json_is_written_as_the_run_goes_and_reopens(saved):
    run, path, _ = saved
    assert not path.with_name(path.name + ".part").exists()
    assert load_run(path) == run
    data = json.loads(path.read_text())
    assert data["format"] == "specula-compare" and data["status"] == COMPLETE
    assert len(data["results"]) == 8 and data["results"][0]["summary"]["tokens"]


def test_csv_parses_back_to_the_table(saved, tmp_path):
    run = saved[0]
    path = save_csv(run, tmp_path / "table.csv")
    rows = list(csv.DictReader(io.StringIO(path.read_text())))
    table = table_rows(run)
    assert tuple(rows[0].keys()) == CSV_COLUMNS
    assert len(rows) == len(table) == 4 * 3  # 4 configurations x (2 categories + all)
    for written, row in zip(rows, table):
        assert (written["config"], written["category"]) == (row.config, row.category)
        assert float(written["tokens_per_s"]) == pytest.approx(row.tps, rel=1e-3)
        assert int(written["tokens"]) == row.n_tokens
    same_all = next(r for r in rows if r["config"] == SAME_K and r["category"] == ALL)
    assert float(same_all["accept_rate"]) == 1.0 and same_all["identical"] == "yes"


def test_text_table_says_how_it_was_measured(saved):
    text = format_table(saved[0])
    assert "greedy" in text and f"fixed draft lengths {K}" in text and "peak RSS" in text
    header = next(line for line in text.splitlines() if line.startswith("category"))
    assert header.split()[-2:] == ["identical", "why"]
    assert sum(1 for line in text.splitlines() if line.startswith("all ")) == 4


def test_a_damaged_or_foreign_file_is_one_line(tmp_path):
    cases = {"missing.json": None, "text.json": "not json", "other.json": json.dumps({"format": "x"}),
             "cut.json": json.dumps({"format": "specula-compare", "version": 1, "main": {}})}
    for name, content in cases.items():
        path = tmp_path / name
        if content is not None:
            path.write_text(content)
        with pytest.raises(CompareFileError) as info:
            load_run(path)
        assert "\n" not in str(info.value) and name in str(info.value)


def test_comparison_with_an_earlier_run(saved):
    run = saved[0]
    slower = replace(run, results=tuple(replace(r, summary=replace(r.summary, decode_s=r.summary.decode_s * 2)) for r in run.results), created=0.0)
    changes = deltas(run, slower)
    assert set(changes) == {(r.config, r.category) for r in table_rows(run)}
    assert all(d.tps_change == pytest.approx(1.0) for d in changes.values())  # twice as fast now
    assert all(d.speedup_now == pytest.approx(d.speedup_before) for d in changes.values())
    assert "none +100%" in delta_line(run, slower)


# --- cancel ----------------------------------------------------------------------------------


def test_cancel_mid_prompt_keeps_the_finished_results_saved(tiny_paths, tiny_loaded, tmp_path):
    path = tmp_path / "cancelled.json"
    stages = []
    checks = itertools.count()
    # Cancel a few steps into lookup's first prompt: none's three results are kept, that one dropped.
    cancel = lambda: f"{LOOKUP_K} · copy (1/3)" in stages and next(checks) >= 5  # noqa: E731
    run = compare(tiny_paths, tiny_loaded, [DraftChoice(LOOKUP, label=LOOKUP)], save_to=path,
                  cancel=cancel, on_progress=lambda p: stages.append(p.stage),
                  prompts=PROMPTS + (Prompt("more", "one more prompt"),))
    assert next(checks) == 6  # cancelled at the sixth check between that prompt's steps
    assert run.status == CANCELLED
    assert len(run.results) == 3
    assert [(r.config, r.prompt_index) for r in run.results] == [(NONE, 0), (NONE, 1), (NONE, 2)]
    assert all(r.summary.n_predicted == N for r in run.results)
    reopened = load_run(path)
    assert reopened == run and reopened.status == CANCELLED
    assert "run cancelled: 3 of 6 results" in format_table(reopened)


# --- drafts, sweeps, prompts -----------------------------------------------------------------


def test_sweep_runs_each_drafter_at_each_fixed_length(tiny_paths, tiny_loaded):
    settings = replace(SETTINGS, gen=replace(SETTINGS.gen, max_tokens=16), draft_sweep=(2, 4))
    run = compare(tiny_paths, tiny_loaded, [DraftChoice(MODEL, str(tiny_paths["llama-f32"]), "same")],
                  prompts=PROMPTS[:1], settings=settings)
    assert [(c.name, c.draft_max, c.adaptive) for c in run.configs] == [
        (NONE, DEFAULT_DRAFT_MAX, True), ("same k=2", 2, False), ("same k=4", 4, False)]
    for k in (2, 4):
        (result,) = run.results_of(f"same k={k}")
        assert len(result.summary.drafted_by_position) == k and result.identical
    assert verdict(run).startswith("same (best k=")
    assert "fixed draft lengths 2,4" in format_table(run)


def test_incompatible_draft_is_refused_before_anything_runs(tiny_paths):
    from app.compare.runner import Runner
    from tests.header_gguf import make_tokens, write_gguf
    from tests.tiny_gguf import VOCAB_SIZE

    folder = tiny_paths["llama-f32"].parent
    foreign = write_gguf(folder / "foreign-vocab.gguf", tokens=make_tokens(VOCAB_SIZE, "zz"), vocab_type="bert")
    request = request_for(tiny_paths, [DraftChoice(MODEL, str(foreign), "foreign")])
    with pytest.raises(IncompatibleDraftError) as info:
        Runner(request).run()
    assert getattr(info.value, "exit_code", None) == 3 and "foreign-vocab.gguf" in str(info.value)


def test_draft_names_and_configurations(tiny_paths):
    assert parse_drafts("lookup, x.gguf,none,lookup") == [NONE, LOOKUP, "x.gguf"]
    assert parse_lengths("4,8,16") == (4, 8, 16) and parse_lengths(None) == ()
    for bad in ("4,x", "0,4"):
        with pytest.raises(SpeculaError):
            parse_lengths(bad)
    local = resolve_draft(str(tiny_paths["llama-other"]))
    assert local.kind == MODEL and local.path == str(tiny_paths["llama-other"]) and local.label
    builtin = resolve_draft("smollm2-135m")  # called as the window calls it, not by its header's name
    assert builtin.kind == MODEL and builtin.label == "SmolLM2 135M Instruct (Q4_1)" and Path(builtin.path).is_file()
    with pytest.raises(SpeculaError, match="no such file"):
        resolve_draft("missing-draft.gguf")
    two = [DraftChoice(MODEL, "a.gguf", "Tiny"), DraftChoice(MODEL, "b.gguf", "Tiny")]
    assert [c.name for c in plan_configs(two)] == [NONE, "Tiny", "Tiny #2"]


def test_prompt_files_and_arguments(tmp_path):
    assert [p.category for p in builtin_prompts()] == list(CATEGORIES) == ["chat", "code", "rewrite", "summarise", "maths"]
    assert [p.category for p in prompts_from_arg("maths,code")] == ["code", "maths"]
    paragraphs = parse_prompts("First prompt\nstill first.\n\n  \nSecond prompt.\n")
    assert paragraphs == [Prompt(OWN, "First prompt\nstill first."), Prompt(OWN, "Second prompt.")]
    lines = tmp_path / "prompts.jsonl"
    lines.write_text('{"category": "code", "prompt": "def f():\\n\\n    pass"}\n\n{"prompt": "hi"}\n')
    assert prompts_from_arg(str(lines)) == [Prompt("code", "def f():\n\n    pass"), Prompt(OWN, "hi")]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"category": "x"}\n')
    for value, message in ((str(bad), "bad.jsonl, line 2"), ("nope", "no such prompt file"),
                           (str(tmp_path / "missing.txt"), "no such prompt file")):
        with pytest.raises(PromptFileError, match=message):
            prompts_from_arg(value)


def test_bench_reuses_the_builtin_prompts():
    from app.cli.bench.args import PROMPTS as BENCH

    assert BENCH["code-rewrite"] == builtin_prompts(["code"])[0].text
    assert set(BENCH) == {"code-rewrite"} | (set(CATEGORIES) - {"code"})


# --- the command line --------------------------------------------------------------------------


def test_cli_table_and_exports(tiny_paths, tmp_path):
    from PySide6.QtGui import QImage

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps({"category": p.category, "prompt": p.text}) for p in PROMPTS))
    out = {kind: tmp_path / f"run.{kind}" for kind in ("json", "csv", "png")}
    args = ["compare", "-m", str(tiny_paths["llama-f32"]), "--drafts", f"none,lookup,{tiny_paths['llama-other']}",
            "--prompts", str(prompts), "-n", "16", "--ignore-eos", "--dtype", "float32", "--device", "cpu",
            "--json", str(out["json"]), "--csv", str(out["csv"]), "--png", str(out["png"])]
    env = {**os.environ, "TRANSFORMERS_VERBOSITY": "error", "HF_HUB_OFFLINE": "1"}
    result = subprocess.run([sys.executable, "-m", "app", *args], cwd=ROOT, env=env, capture_output=True,
                            encoding="utf-8", errors="replace", timeout=300)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    progress = result.stderr.splitlines()
    # Three runs of every drafter by default (-r 3): a winner needs a spread apart from plain decoding's.
    assert "[17/18] llama-other · chat (2/2, run 3/3)" in progress and progress[-1] == "[18/18] complete"
    lines = result.stdout.splitlines()
    assert any(line.startswith("category") and line.endswith("identical  why") for line in lines)
    assert lines[-2].startswith("verdict: lookup:") and "llama-other:" in lines[-2]  # the file's name, not its general.name
    assert lines[-1].startswith("reproduce the fastest (") and "specula run -m " in lines[-1]
    run = load_run(out["json"])
    assert run.status == COMPLETE and len(run.results) == 18 and {r.repeat for r in run.results} == {0, 1, 2}
    assert all(r.identical for r in run.results if r.config != NONE)
    assert list(csv.reader(io.StringIO(out["csv"].read_text())))[1:] == list(csv.reader(io.StringIO(csv_text(run))))[1:]
    image = QImage(str(out["png"]))
    assert not image.isNull() and image.width() >= 1000 and image.height() >= 600


def test_cli_bad_input_is_one_line(tiny_paths, capsys):
    from app.cli import main

    model = str(tiny_paths["llama-f32"])
    cases = {
        ("--drafts", "none,./no-such-draft.gguf"): "no-such-draft.gguf: no such file",
        ("--draft-max", "4,x"): "--draft-max takes whole numbers",
        ("--prompts", "poetry"): "no such prompt file, nor built-in categories",
        ("--json", "/no/such/folder/out.json"): "the folder does not exist",
    }
    for extra, message in cases.items():
        capsys.readouterr()
        try:
            code = main(["compare", "-m", model, *extra])
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
            print(exc.code, file=sys.stderr)
        err = capsys.readouterr().err
        assert code != 0 and message in err, (extra, err)
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_cli_ctrl_c_stops_after_the_step_and_keeps_the_results(tiny_paths, tmp_path):
    import signal
    import time

    out = tmp_path / "run.json"
    args = ["compare", "-m", str(tiny_paths["llama-f32"]), "--drafts", "lookup", "-p", COPY, "-p", "hello",
            "-n", "400", "--ignore-eos", "--dtype", "float32", "--device", "cpu", "--json", str(out)]
    env = {**os.environ, "TRANSFORMERS_VERBOSITY": "error", "HF_HUB_OFFLINE": "1"}
    process = subprocess.Popen([sys.executable, "-m", "app", *args], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, encoding="utf-8", errors="replace")
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and process.poll() is None:
            if out.exists() and load_run(out).results:
                break
            time.sleep(0.05)
        process.send_signal(signal.SIGINT)
        stdout, stderr = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 130, stderr
    assert "stopping after this step" in stderr and "Traceback" not in stderr
    run = load_run(out)
    assert run.status == CANCELLED and 1 <= len(run.results) < 4
    assert "# run cancelled" in stdout and any(line.startswith("verdict: ") for line in stdout.splitlines())


def test_a_draft_with_another_vocabulary_is_compared_through_text(tiny_paths, tiny_loaded):
    """The Compare runner takes a text-level draft like any other: identical replies, counters."""
    run = compare(tiny_paths, tiny_loaded, [DraftChoice(MODEL, str(tiny_paths["llama-b"]), "other vocabulary")])
    drafted = [r for r in run.results if r.config not in (NONE,)]
    assert drafted and all(r.identical for r in drafted)
    assert sum(r.summary.n_drafted for r in drafted) > 0


@pytest.mark.parametrize("backend, plan_start", [("llama.cpp", "llama.cpp on CPU"), ("torch", "CPU, ")])
def test_cli_backend_reaches_the_comparison(tiny_paths, tmp_path, backend, plan_start):
    if backend == "llama.cpp":
        from tests.llama_support import require_llama_cpp

        require_llama_cpp()
    out = tmp_path / "run.json"
    args = ["compare", "-m", str(tiny_paths["llama-q8"]), "--drafts", "none,lookup", "-p", "the model and the model",
            "-n", "8", "-r", "1", "--backend", backend, "--json", str(out)]
    env = {**os.environ, "TRANSFORMERS_VERBOSITY": "error", "HF_HUB_OFFLINE": "1"}
    result = subprocess.run([sys.executable, "-m", "app", *args], cwd=ROOT, env=env, capture_output=True,
                            encoding="utf-8", errors="replace", timeout=300)
    assert result.returncode == 0, result.stderr
    assert load_run(out).main.plan.startswith(plan_start)
