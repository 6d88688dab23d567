"""The command line against hostile flag values (issue 42, item 11): whatever a flag holds, the
answer is a non-zero exit and one line on stderr, never a traceback. In this process (`app.cli.main`)
on the tiny models of tests/tiny_gguf.py: an exception escaping main() is the traceback a user
would see. Seeded and bounded in time."""

from __future__ import annotations

import os
import random
import time

import pytest

VALUES = ["99999999999999999999999", "-99999999999999999999999", "1e309", "nan", "-inf", "", "0x10", "-1",
          "0", "2147483648", "18446744073709551616", "\x00", "\udcff", "../../x", "/", "/dev/zero", "é" * 300]

INT_FLAGS = ["--seed", "-n", "--top-k", "-c", "-cd", "--draft-max", "--draft-min", "-ngl", "--spec-ngram-mod-n-max",
             "--spec-ngram-mod-n-match", "--spec-ngram-mod-n-min"]
FLOAT_FLAGS = ["--temp", "--top-p", "--min-p", "--draft-p-min"]


@pytest.fixture
def specula(capsys, monkeypatch):
    from app.cli import main

    for name in ("TRANSFORMERS_VERBOSITY", "HF_HUB_DISABLE_PROGRESS_BARS", "TQDM_DISABLE"):
        monkeypatch.delenv(name, raising=False)

    def call(*args: str) -> tuple[int, str]:
        capsys.readouterr()
        try:
            code = main(list(args))
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            if isinstance(exc.code, str):
                print(exc.code, file=__import__("sys").stderr)
        return code, capsys.readouterr().err

    return call


def assert_one_line_failure(result: tuple[int, str], args) -> str:
    code, err = result
    lines = err.strip().splitlines()
    assert code != 0, (args, err)
    assert len(lines) == 1 and "Traceback" not in err, (args, err)
    return lines[0]


def test_reported_tracebacks_are_one_line(specula, tiny_paths, tmp_path):
    tiny = str(tiny_paths["llama-f32"])
    run = ["run", "-m", tiny, "-p", "x", "-n", "2", "--device", "cpu", "--dtype", "float32"]
    for seed in ("99999999999999999999999", str(2**64)):  # (a negative one means random)
        line = assert_one_line_failure(specula(*run, "--seed", seed), seed)
        assert "seed" in line, line
    for path in ("/", str(tmp_path), "/dev/zero"):
        line = assert_one_line_failure(specula(*run, "--spec-type", "ngram-cache", "-lcd", path), path)
        assert "not a regular file" in line, line
    for repo in ("../../x", "user/x..y", "a/b/c", "x/" + "y" * 200):
        for command in (["hub", "info", repo, "model.gguf"], ["hub", "download", repo, "model.gguf"],
                        ["hub", "files", repo]):
            line = assert_one_line_failure(specula(*command), command)
            assert "repository id" in line, line


def test_fuzzed_flag_values_exit_non_zero_in_one_line(specula, tiny_paths):
    """Random hostile values in random flags of `run`: every one either runs (a value that is
    fine) or fails in one line. Bounded: at most 20 s of it."""
    tiny = str(tiny_paths["llama-f32"])
    rng = random.Random(int(os.environ.get("SPECULA_FUZZ_SEED", "11")))
    deadline = time.monotonic() + 20.0
    tried = 0
    while time.monotonic() < deadline and tried < 60:
        flags: list[str] = []
        for _ in range(rng.randint(1, 2)):
            flags += [rng.choice(INT_FLAGS + FLOAT_FLAGS), rng.choice(VALUES)]
        args = ["run", "-m", tiny, "-p", "x", "-n", "2", "--device", "cpu", "--dtype", "float32", *flags]
        code, err = specula(*args)
        if code != 0:
            assert_one_line_failure((code, err), flags)
        tried += 1
    assert tried >= 10
