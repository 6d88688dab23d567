"""Compare across engines: llama.cpp's own speculation (llama-server started here with any
--spec-type) and a server at a URL in the same table as Specula's drafters, on the same prompt
ids, with the server's own counts; a server that fails is one error line for its row."""

from __future__ import annotations

import json

import pytest

from app.compare.choices import resolve_draft, server_choice
from app.compare.fastest import Fastest, run_flags
from app.compare.results import LLAMA_SERVER, SERVER_URL, load_run
from app.engine.errors import SpeculaError
from app.engine.llama_server.process import LlamaServer
from tests.engine.test_llama_server import _require_server, _run

REPEATS = "Repeat this list exactly, twice: apples, pears, plums, figs, dates, limes, kiwis, grapes."


def test_llama_server_rows_are_named_checked_and_reproduced():
    choice = resolve_draft("llama-server:ngram-mod+ngram-simple")
    assert (choice.kind, choice.label, choice.server_types) == (LLAMA_SERVER, "llama-server ngram-mod+ngram-simple",
                                                                "ngram-mod,ngram-simple")
    assert (resolve_draft("llama-server:none").server_types, resolve_draft("llama-server:none").label) == ("", "llama-server plain")
    with pytest.raises(SpeculaError, match="'ngram-huge' is not a llama.cpp --spec-type"):
        server_choice("ngram-huge")
    with pytest.raises(SpeculaError, match="draft-simple needs a draft model"):
        server_choice("draft-simple")
    won = Fastest("llama-server ngram-mod", "/m/main.gguf", LLAMA_SERVER, None, 16, True, 0, 0.75, 1.4,
                  server_types="ngram-mod")
    assert run_flags(won) == ["-m", "/m/main.gguf", "--engine", "llama-server", "--spec-type", "ngram-mod"]
    remote = Fastest("server x", "/m/main.gguf", SERVER_URL, None, 16, True, 0, 0.75, 1.2, server_url="http://h:1")
    assert run_flags(remote) == ["-m", "/m/main.gguf", "--server", "http://h:1"]


@pytest.mark.demo
def test_compare_puts_llama_servers_types_beside_ours_with_its_own_counts(capsys, tmp_path, demo_path):
    _require_server()
    out_file = tmp_path / "run.json"
    code, out, err = _run(capsys, "compare", "-m", str(demo_path("smollm2-135m")), "-t", "2", "-n", "40", "-r", "1",
                          "--drafts", "lookup,llama-server:none,llama-server:ngram-mod+ngram-simple", "-p", REPEATS,
                          "--json", str(out_file))
    assert code == 0, err
    run = load_run(out_file)
    names = [c.name for c in run.configs]
    assert names == ["none", "lookup", "llama-server plain", "llama-server ngram-mod+ngram-simple"]
    rows = {r.config: r for r in run.results}
    assert set(rows) == set(names) and not run.errors
    base = rows["none"]
    for name in names[1:]:  # greedy: every engine's reply is plain decoding's
        assert rows[name].summary.text == base.summary.text, name
    spec = rows["llama-server ngram-mod+ngram-simple"]
    spec = spec.summary
    assert spec.n_drafted > 0 and 0 < spec.n_accepted <= spec.n_drafted  # llama.cpp's own timings
    assert sum(spec.accepted_by_position) == spec.n_accepted
    assert rows["llama-server plain"].summary.n_drafted == 0
    assert "llama-server ngram-mod+ngram-simpl" in out and "Traceback" not in err


def test_a_server_at_a_url_is_a_row_and_one_that_fails_is_one_error_line(capsys, tmp_path, tiny_paths):
    _require_server()
    key = tmp_path / "key"
    key.write_text("k3y-for-compare\n")
    with LlamaServer(tiny_paths["llama-q8"], ["-t", "1", "--api-key", "k3y-for-compare"]) as server:
        common = ["compare", "-m", str(tiny_paths["llama-q8"]), "-t", "1", "-n", "8", "-r", "1", "--drafts", "none",
                  "-p", "Once upon a time", "--server", server.url]
        out_file = tmp_path / "ok.json"
        code, out, err = _run(capsys, *common, "--api-key-file", str(key), "--json", str(out_file))
        assert code == 0, err
        run = load_run(out_file)
        row = [r for r in run.results if r.config.startswith("server 127.0.0.1")]
        assert len(row) == 1 and row[0].summary.n_predicted > 0 and not run.errors
        assert "k3y-for-compare" not in out + err + out_file.read_text()
        url = server.url
    bad = tmp_path / "bad.json"
    code, out, err = _run(capsys, "compare", "-m", str(tiny_paths["llama-q8"]), "-n", "8", "-r", "1", "--drafts",
                          "none", "-p", "Once upon a time", "--server", url, "--json", str(bad))
    assert code == 0, err  # the other rows finished; the server's row says why it has no result
    errors = json.loads(bad.read_text())["errors"]
    assert len(errors) == 1 and "could not connect" in errors[0]["message"] and "\n" not in errors[0]["message"]


def test_compare_splits_llama_servers_rows_across_rpc_workers(capsys, tmp_path, tiny_paths):
    from tests.engine.test_llama_server import _workers

    _require_server()
    procs, endpoints = _workers(2)
    try:
        out_file = tmp_path / "rpc.json"
        code, out, err = _run(capsys, "compare", "-m", str(tiny_paths["llama-f32"]), "-t", "1", "-n", "8", "-r", "1",
                              "--drafts", "llama-server:none", "-p", "Once upon a time", "--rpc", endpoints,
                              "--json", str(out_file))
        assert code == 0, err
        run = load_run(out_file)
        assert not run.errors and {r.config for r in run.results} == {"none", "llama-server plain"}
        assert all(r.identical for r in run.results if r.config != "none")
        for proc in procs:  # the workers gone: the llama-server row cannot start, the others finish
            proc.kill()
            proc.wait()
        code, out, err = _run(capsys, "compare", "-m", str(tiny_paths["llama-f32"]), "-t", "1", "-n", "8", "-r", "1",
                              "--drafts", "llama-server:none", "-p", "Once upon a time", "--rpc", endpoints,
                              "--json", str(out_file))
        errors = json.loads(out_file.read_text())["errors"]
        assert code == 0 and len(errors) == 1 and errors[0]["config"] == "llama-server plain", err
        code, _, err = _run(capsys, "compare", "-m", str(tiny_paths["llama-f32"]), "--rpc", "nohost")
        assert code == 2 and "'nohost' is not HOST:PORT" in err
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
