"""`specula bench-gpu` on tiny shapes, float32 on the CPU (exact greedy identity)."""

from __future__ import annotations

import json

import pytest
import torch

from app.cli import main


@pytest.fixture
def one_thread():
    # Two threads on a shared two-core machine make each tiny forward 100x slower (spin waits).
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_bench_gpu_tiny_cpu(tmp_path, capsys, one_thread):
    out = tmp_path / "out.json"
    code = main(["bench-gpu", "--shapes", "tiny", "--device", "cpu", "--dtype", "float32", "-n", "16",
                 "--json", str(out)])
    assert code == 0
    data = json.loads(out.read_text())
    rows = {r["config"]: r for r in data["rows"]}
    kinds = {r["kind"] for r in data["rows"]}
    assert {"plain", "draft=main fixed 4", "draft=main fixed 16"} <= set(rows)
    assert kinds == {"plain", "self", "small", "shallow"}
    assert any(r["kind"] == "small" and "1B" in r["config"] for r in data["rows"])
    assert any(r["kind"] == "shallow" and "main[:2]" in r["config"] for r in data["rows"])

    plain = rows["plain"]
    assert plain["n_predicted"] == 16 and len(plain["tokens"]) == 16
    assert plain["accept_rate"] is None and plain["speedup"] == pytest.approx(1.0)
    for name in ("draft=main fixed 4", "draft=main fixed 16"):
        row = rows[name]
        assert row["n_drafted"] > 0 and row["n_accepted"] == row["n_drafted"]
        assert row["accept_rate"] == 1.0
        assert row["tokens"] == plain["tokens"] and row["identical"]
    for row in data["rows"]:  # greedy: every drafter gives plain decoding's tokens
        assert row["tokens"] == plain["tokens"]
        assert row["tokens_per_s"] > 0

    assert [v["k"] for v in data["verify"]] == [0, 1, 2, 4, 8, 16]
    assert all(v["ms"] > 0 and v["n_tokens"] == v["k"] + 1 for v in data["verify"])
    assert data["verify"][0]["ratio"] == 1.0
    assert data["meta"]["device"] == "cpu" and data["meta"]["dtype"] == "float32"
    assert data["meta"]["peak_gpu_gib"] is None

    printed = capsys.readouterr().out
    assert "verify k" in printed and "acc" in printed
    for name in rows:
        assert name[:22] in printed
    assert "100.0%" in printed


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_bench_gpu_cuda_missing(capsys):
    code = main(["bench-gpu", "--shapes", "tiny", "--device", "cuda"])
    assert code == 1
    err = capsys.readouterr().err
    assert err.startswith("specula: error: ") and "cuda" in err.lower()
    assert err.count("\n") == 1


def test_bench_gpu_parser_imports_no_torch():
    import subprocess
    import sys

    code = ("import sys; from app.cli import build_parser; build_parser(); "
            "sys.exit(1 if {'torch', 'app.cli.bench.gpu'} & set(sys.modules) else 0)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
