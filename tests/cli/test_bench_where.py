"""`specula bench --via ...` (issue 61 item 1): the same chat timed in this process, through the real
window offscreen, through `specula serve` (plain and streamed) and through llama-server, every way
loaded at once and paired round by round. A table check, not a timing: its rows, its columns and a
ratio to cli for every other way."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from app.engine.llama_server.programs import SERVER, find_program

ROOT = Path(__file__).resolve().parents[2]


def bench_via(ways: str, model: Path, rounds: int) -> tuple[subprocess.CompletedProcess, list[str]]:
    """`specula bench --via WAYS` of 8 tokens in a child process, as a user runs it: it must exit 0."""
    env = {**os.environ, "TRANSFORMERS_VERBOSITY": "error", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-m", "app", "bench", "--via", ways, "-m", str(model), "-n", "8",
                           "-r", str(rounds)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return done, done.stdout.splitlines()


@pytest.mark.skipif(find_program(SERVER) is None, reason="needs llama-server (built from the binding's sdist)")
def test_bench_via_prints_one_paired_row_per_drafter_for_every_way(tiny_paths):
    done, lines = bench_via("cli,window,serve,serve-stream,llama-server", tiny_paths["llama-q8"], rounds=2)
    assert lines[0].startswith("# llama-q8.gguf on ") and "2 paired rounds" in lines[0]
    assert lines[1] == "| drafter | cli | window | serve | serve-stream | llama-server |"
    rows = [line for line in lines if line.startswith("| none |") or line.startswith("| lookup+ngram-cache+ngram-mod |")]
    assert len(rows) == 2, done.stdout
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")][1:]
        assert re.fullmatch(r"\d+\.\d", cells[0]), row  # cli: its rate
        for cell in cells[1:]:
            assert re.fullmatch(r"\d+\.\d \(\d+\.\d\dx\)( †\d)?", cell), row  # every other way: rate (ratio to cli)
    assert sum("serve / llama-server, paired median" in line for line in lines) == 2


def test_a_reply_that_left_clis_says_where():
    """A † cell's reply is another text: the bench says where it left cli's (llama-server's
    drafted Qwen2.5-Coder reply left plain decoding's at a near-tie, its own plain reply did not)."""
    from app.cli.bench.where import where_apart

    assert (where_apart("physical activity can help improve", "physical activity helps to maintain")
            == "at character 18: 'al activity helps to mai', cli 'al activity can help imp'")
    assert where_apart("abc", "abcdef") == "at character 3: 'abcdef', cli 'abc'"  # a longer reply


def test_bench_via_names_an_unknown_way(tiny_paths, capsys):
    from app.cli import main

    assert main(["bench", "--via", "cli,telepathy", "-m", str(tiny_paths["llama-q8"])]) == 2
    assert ("--via: telepathy is not one of cli, window, serve, serve-stream, llama-server, llama-server-each"
            in capsys.readouterr().err)


@pytest.mark.skipif(find_program(SERVER) is None, reason="needs llama-server (built from the binding's sdist)")
def test_bench_via_llama_server_each_puts_our_drafter_against_llama_cpps_best_type(tiny_paths):
    """Issue 61 item 2: our best drafter against llama-server's best type, both driven as servers."""
    done, lines = bench_via("serve,llama-server,llama-server-each", tiny_paths["llama-q8"], rounds=1)
    types = ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")
    assert lines[1] == "| drafter | serve | llama-server | " + " | ".join(f"llama-server:{t}" for t in types) + " |"
    none = next(line for line in lines if line.startswith("| none |"))
    assert [c.strip() for c in none.strip("|").split("|")][3:] == [""] * len(types)  # one plain llama-server
    drafted = next(line for line in lines if line.startswith("| lookup+ngram-cache+ngram-mod |"))
    assert all(re.fullmatch(r"\d+\.\d", c.strip()) for c in drafted.strip("|").split("|")[1:]), drafted
    best = [line for line in lines if "serve / llama-server's best type here (" in line]
    assert len(best) == 1 and best[0].startswith("#   lookup+ngram-cache+ngram-mod:"), done.stdout
    assert re.search(r"paired median \d+\.\d{3}x$", best[0]), best[0]


@pytest.mark.skipif(find_program(SERVER) is None, reason="needs llama-server (built from the binding's sdist)")
def test_llama_server_answers_a_model_without_a_template_in_our_frame(tiny_paths):
    """A model without a chat template: llama-server gets our fallback frame, so both engines
    answer the same prompt (Gemma 3 270M, framed in ChatML by llama-server, repeated ChatML
    markers, a reply every drafter predicts, and the drafters were timed on different texts)."""
    from app.cli.bench.where import fallback_frame_file, open_cli, open_llama_server

    model = tiny_paths["llama-notemplate"]
    assert fallback_frame_file(tiny_paths["llama-q8"]) is None  # a model with its own template keeps it
    cli, server = open_cli(model, "none"), open_llama_server(model, "none")
    try:
        question = "Name three colours."
        ours, theirs = cli.reply(question, 16)[1], server.reply(question, 16)[1]
        assert ours and theirs == ours
    finally:
        cli.close()
        server.close()
