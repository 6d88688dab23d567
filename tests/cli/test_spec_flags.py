"""llama.cpp's speculative flags and the older names (aliases) in run, bench, serve and compare."""

from __future__ import annotations

import json

import pytest

from app.cli import build_parser, main
from app.cli.compare import drafts_arg
from app.cli.spec_args import SpecChoice, spec_choice

COMMANDS = ["run", "bench", "serve"]


def parse(*argv: str):
    extra = ["-p", "hi"] if argv[0] == "run" else []
    return build_parser().parse_args([argv[0], "-m", "main.gguf", *extra, *argv[1:]])


@pytest.mark.parametrize("command", COMMANDS)
def test_new_and_old_names_set_the_same_values(command):
    new = parse(command, "--spec-draft-model", "d.gguf", "--spec-draft-n-max", "5", "--spec-draft-n-min", "2",
                "--spec-draft-p-min", "0.4")
    old = parse(command, "-md", "d.gguf", "--draft-max", "5", "--draft-min", "2", "--draft-p-min", "0.4")
    older = parse(command, "--model-draft", "d.gguf", "--draft", "5", "--draft-min", "2", "--draft-p-min", "0.4")
    for args in (new, old, older):
        assert (args.model_draft, args.draft_max, args.draft_min, args.draft_p_min) == ("d.gguf", 5, 2, 0.4)
        assert spec_choice(args) == SpecChoice("none", "d.gguf")
    assert parse(command).draft_max == 64 and parse(command).draft_p_min == 0.75  # our defaults


@pytest.mark.parametrize("argv,ngram,model", [
    (["--lookup"], "lookup", None),
    (["--spec-type", "ngram-simple"], "lookup", None),
    (["--spec-type", "ngram-cache,ngram-simple"], "lookup+ngram-cache", None),
    (["--spec-type", "ngram-cache", "--lookup"], "lookup+ngram-cache", None),
    (["--spec-type", "ngram-mod,ngram-cache"], "ngram-mod+ngram-cache", None),
    (["--spec-type", "draft-simple,ngram-cache", "-md", "d.gguf"], "ngram-cache", "d.gguf"),
    (["--spec-type", "ngram-cache", "-md", "d.gguf"], "ngram-cache", "d.gguf"),  # -md implies draft-simple
    (["--spec-type", "none"], "none", None),
    ([], "none", None),
])
def test_spec_types_map_to_drafters(argv, ngram, model):
    choice = spec_choice(parse("run", *argv))
    assert (choice.ngram, choice.draft_model) == (ngram, model)


def test_ngram_mod_parameters():
    choice = spec_choice(parse("serve", "--spec-type", "ngram-mod", "--spec-ngram-mod-n-match", "8",
                               "--spec-ngram-mod-n-min", "2", "--spec-ngram-mod-n-max", "32"))
    assert choice.ngram == "ngram-mod" and choice.mod == (8, 2, 32)


@pytest.mark.parametrize("value,message", [
    ("draft-eagle3", "draft-eagle3 is not implemented in specula's own loop"),
    ("draft-dflash", "`specula run --engine llama-server --spec-type draft-dflash` runs it"),
    ("ngram-fancy", "unknown type 'ngram-fancy'"),
    ("none,ngram-simple", "none cannot be combined"),
    (",", "needs a type"),
])
@pytest.mark.parametrize("command", ["bench", "serve", "compare"])
def test_bad_types_are_one_line_and_exit_2(capsys, command, value, message):
    if command == "serve" and value.startswith("draft-"):  # serve runs them on llama-server (--engine)
        assert parse(command, "--spec-type", value).spec_type == (value,)
        return
    with pytest.raises(SystemExit) as caught:
        parse(command, "--spec-type", value)
    assert caught.value.code == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


@pytest.mark.parametrize("argv,message", [
    (["--spec-type", "draft-simple"], "draft-simple needs a draft model"),
    (["--spec-type", "none", "--lookup"], "none cannot be combined"),
    (["--spec-type", "none", "-md", "d.gguf"], "none cannot be combined"),
    (["-lcd", "x.ngc"], "--lookup-cache-dynamic is the file of --spec-type ngram-cache"),
    (["--spec-type", "ngram-mod", "--spec-ngram-mod-n-match", "0"], "must be at least 1"),
])
@pytest.mark.parametrize("command", ["run", "serve"])
def test_conflicting_flags_are_one_line_and_exit_2_before_loading(capsys, command, argv, message):
    extra = ["-p", "hi"] if command == "run" else ["--port", "0"]
    assert main([command, "-m", "missing.gguf", *extra, *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "missing.gguf" not in err


def test_compare_takes_the_new_names_and_combines_ngram_types():
    args = build_parser().parse_args(["compare", "-m", "m.gguf", "--spec-type", "ngram-cache,ngram-simple",
                                      "--spec-draft-model", "d.gguf", "--spec-draft-n-max", "4,8",
                                      "--spec-draft-n-min", "1", "--spec-draft-p-min", "0.5"])
    assert drafts_arg(args) == "none,lookup+ngram-cache+ngram-mod,lookup+ngram-cache,d.gguf"  # the default, then these
    assert (args.draft_max, args.draft_min, args.draft_p_min) == ("4,8", 1, 0.5)
    old = build_parser().parse_args(["compare", "-m", "m.gguf", "--draft-max", "4,8", "--draft-min", "1"])
    assert (old.draft_max, old.draft_min) == ("4,8", 1)


def test_run_learns_into_the_cache_file_and_drafts_from_it_next_time(capsys, tiny_paths, tmp_path):
    cache = tmp_path / "c.ngc"
    base = ["run", "-m", str(tiny_paths["llama-f32"]), "-p", "The model reads the file.", "-n", "24",
            "--temp", "0", "--dtype", "float32", "--json"]
    results = []
    for argv in (base, [*base, "--spec-type", "ngram-cache", "-lcd", str(cache)],
                 [*base, "--spec-type", "ngram-simple,ngram-cache", "-lcd", str(cache)]):
        assert main(argv) == 0
        results.append(json.loads(capsys.readouterr().out.strip().splitlines()[-1]))
    plain, first, second = results
    assert first["tokens"] == second["tokens"] == plain["tokens"]
    assert first["drafter"] == "ngram-cache" and second["drafter"] == "lookup+ngram-cache"
    assert cache.exists() and second["n_accepted"] > first["n_accepted"]
