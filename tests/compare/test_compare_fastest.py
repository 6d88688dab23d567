"""From comparison to choice (headless): the fastest configuration of a real run on tiny models,
and the `specula run` flags that reproduce it, parsed back by the real `specula run` parser."""

from __future__ import annotations

import shlex
import shutil
from dataclasses import replace

import pytest

from app.cli import build_parser, main
from app.compare.fastest import MARGIN, Fastest, fastest, run_command, run_flags, setting_flags
from app.compare.results import (COMPARE_DEFAULTS, LOOKUP, MODEL, NONE, CompareRequest, DraftChoice, RunSettings,
                                 load_run)
from app.compare.summary import table_rows
from app.engine.settings import GenSettings

COPY = "The model reads the file and the model writes the file. " * 3


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """See tests/compare/test_compare.py: tiny models on a loaded two-core machine run far faster on one."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def real_run(tiny_paths, tiny_loaded):
    """none, lookup and a model draft at one fixed length, on a copy prompt and a chat prompt, twice
    (a winner needs runs whose spread does not overlap plain decoding's)."""
    from app.compare.prompts import Prompt
    from app.compare.runner import Runner

    drafts = (DraftChoice(LOOKUP, label=LOOKUP), DraftChoice(MODEL, str(tiny_paths["llama-other"]), "other"))
    settings = RunSettings(replace(COMPARE_DEFAULTS, max_tokens=24, draft_p_min=0.5), draft_sweep=(4,), ignore_eos=True,
                           repeats=2)
    prompts = (Prompt("copy", COPY), Prompt("chat", "hello there, how are you?"))
    request = CompareRequest(str(tiny_paths["llama-f32"]), drafts, prompts, settings, device="cpu", dtype="float32")
    return Runner(request, main=tiny_loaded("llama-f32")).run()


def parsed(flags: list[str]):
    """The real `specula run` parser on the flags (plus the prompt it requires)."""
    return build_parser().parse_args(["run", *flags, "-p", "hello"])


def assert_reproduces(args, choice: Fastest) -> None:
    from app.cli.spec_args import spec_choice

    assert args.model == choice.main_path
    spec = spec_choice(args)  # what `specula run` drafts with, from llama.cpp's flags or ours
    assert spec.ngram == (choice.drafter if choice.drafter not in (NONE, MODEL) else NONE)
    assert spec.draft_model == (choice.draft_path if choice.drafter == MODEL else None)
    if choice.drafter != NONE:
        assert (args.draft_max, args.draft_fixed) == (choice.draft_max, not choice.adaptive)
        assert (args.draft_min, args.draft_p_min) == (choice.draft_min, choice.draft_p_min)


def slowed(run, configs: set[str], factor: float):
    """The run with these configurations' decoding times multiplied (the same tokens)."""
    results = tuple(replace(r, summary=replace(r.summary, decode_s=r.summary.decode_s * factor)) if r.config in configs else r for r in run.results)
    return replace(run, results=results)


def accepting(run, config: str):
    """The run with this configuration credited one accepted draft per reply (a random tiny draft
    model accepts none, and a drafter that never drafts right is never the fastest)."""
    return replace(run, results=tuple(replace(r, summary=replace(r.summary, n_accepted=max(r.summary.n_accepted, 1))) if r.config == config else r
                                      for r in run.results))


def test_the_fastest_is_the_best_overall_speedup(real_run):
    choice = fastest(real_run)
    overall = {r.config: r.speedup for r in table_rows(real_run) if r.category == "all"}
    best = max(overall, key=overall.get)
    if choice.config != NONE:  # a lead within the runs' noise is none's (tests/compare/test_compare_spread.py)
        assert choice.config == best and overall[best] >= MARGIN and choice.speedup == overall[best]
    assert choice.main_path == real_run.main.path


def test_each_kind_of_winner_carries_its_drafter_and_length(real_run, tiny_paths):
    lookup = fastest(slowed(real_run, {NONE, "other k=4"}, 50.0))
    assert (lookup.config, lookup.drafter, lookup.draft_path) == ("lookup k=4", LOOKUP, None)
    assert (lookup.draft_max, lookup.adaptive, lookup.draft_p_min, lookup.pays_off) == (4, False, 0.5, True)
    model = fastest(slowed(accepting(real_run, "other k=4"), {NONE, "lookup k=4"}, 50.0))
    assert (model.config, model.drafter, model.draft_path) == ("other k=4", MODEL, str(tiny_paths["llama-other"]))
    plain = fastest(slowed(real_run, {"lookup k=4", "other k=4"}, 50.0))
    assert (plain.config, plain.drafter, plain.pays_off) == (NONE, NONE, False)
    assert plain.describe().startswith("no clear winner: plain decoding")


def test_a_lead_within_one_runs_noise_is_not_a_choice(real_run):
    """lookup 2% faster than plain decoding (and the model draft far slower): none is chosen."""
    run = slowed(real_run, {"other k=4"}, 50.0)
    lookup = {r.config: r.speedup for r in table_rows(run) if r.category == "all"}["lookup k=4"]
    run = slowed(run, {"lookup k=4"}, lookup / 1.02)
    speedups = {r.config: r.speedup for r in table_rows(run) if r.category == "all"}
    assert 1.0 < speedups["lookup k=4"] < MARGIN and speedups["other k=4"] < 1.0  # the setup holds
    choice = fastest(run)
    assert choice.drafter == NONE and "lookup k=4, was 1.02x the speed" in choice.describe()
    assert fastest(slowed(run, {"lookup k=4"}, 1 / 3)).config == "lookup k=4"  # a lead past the spread is


def test_no_baseline_no_fastest(real_run):
    assert fastest(None) is None
    assert fastest(replace(real_run, results=())) is None
    assert fastest(replace(real_run, results=tuple(r for r in real_run.results if r.config != NONE))) is None


@pytest.mark.parametrize("choice", [
    Fastest("none", "/models/main.gguf", NONE, None, 16, True, 0, 0.75, 1.0),
    Fastest("lookup k=8", "/models/main.gguf", LOOKUP, None, 8, False, 0, 0.75, 2.3),
    Fastest("lookup+ngram-cache", "/models/main.gguf", "lookup+ngram-cache", None, 16, True, 0, 0.75, 1.5),
    Fastest("draft", "/my models/main model.gguf", MODEL, "/my models/it's a draft.gguf", 16, True, 2, 0.6, 1.4),
])
def test_flags_parse_back_to_the_choice_with_quoting(choice):
    assert_reproduces(parsed(run_flags(choice)), choice)
    command = run_command(choice)
    assert shlex.split(command)[:2] == ["specula", "run"]
    assert_reproduces(parsed(shlex.split(command)[2:]), choice)
    if choice.drafter == NONE:
        assert run_flags(choice) == ["-m", choice.main_path]  # nothing extra for plain decoding
    if choice.adaptive:
        assert "--draft-fixed" not in command
    if (choice.draft_min, choice.draft_p_min) == (0, 0.75):
        assert "n-min" not in command and "p-min" not in command  # defaults stay implicit


def test_specula_compare_prints_the_run_command_of_the_fastest(tiny_paths, tmp_path, capsys):
    folder = tmp_path / "my models"
    folder.mkdir()
    main_path = shutil.copy(tiny_paths["llama-f32"], folder / "main model.gguf")
    draft_path = shutil.copy(tiny_paths["llama-other"], folder / "other draft.gguf")
    out = tmp_path / "run.json"
    code = main(["compare", "-m", str(main_path), "--drafts", f"none,lookup,{draft_path}", "-p", COPY,
                 "-n", "16", "--ignore-eos", "--draft-max", "4", "--draft-p-min", "0.5",
                 "--dtype", "float32", "--device", "cpu", "--json", str(out)])
    stdout = capsys.readouterr().out
    assert code == 0
    lines = stdout.splitlines()
    assert lines[-2].startswith("verdict: ") and lines[-1].startswith("reproduce the fastest (")
    choice = fastest(load_run(out))
    assert f"({choice.describe()}): " in lines[-1]
    argv = shlex.split(lines[-1].split("): ", 1)[1])
    assert argv[:2] == ["specula", "run"]
    assert_reproduces(parsed(argv[2:]), choice)
    assert parsed(argv[2:]).model == str(main_path)  # a path with a space, quoted and parsed back whole
    again = parsed(argv[2:])  # with the settings the run shared: `run` alone samples at 0.8
    assert (again.n_predict, again.temp, again.dtype) == (16, 0.0, "float32")


def test_a_sampled_run_reproduces_with_its_sampling_and_precision():
    settings = RunSettings(GenSettings(max_tokens=48, temperature=0.7, top_k=20, top_p=0.9, min_p=0.1, seed=1234))
    args = parsed(["-m", "/m.gguf", *setting_flags(settings, "bfloat16")])
    assert (args.n_predict, args.temp, args.top_k, args.top_p, args.min_p, args.seed) == (48, 0.7, 20, 0.9, 0.1, 1234)
    assert args.dtype == "bfloat16"
    assert "--dtype" not in setting_flags(RunSettings())  # auto stays implicit
