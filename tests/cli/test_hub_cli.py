"""`specula hub ...` and `specula models` for real, in subprocesses pointed at the fake hub with
HF_ENDPOINT / HF_HOME (as a user would), checking that none of them imports torch."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.hf_server import (BIG_FILE, GOOD_TOKEN, REPO_BIG, REPO_GATED, REPO_MID, SPLIT_FIRST,  # noqa: F401
                             fake_hub, hub, hub_env, hub_files)

ROOT = Path(__file__).resolve().parents[2]
# Runs the real entry point, then says on stderr whether torch got imported along the way.
RUNNER = ("import sys; from app.cli import main; rc = main(sys.argv[1:]); "
          "sys.stderr.write('TORCH WAS IMPORTED\\n' if 'torch' in sys.modules else ''); sys.exit(rc)")


def command(args: list[str]) -> list[str]:
    return [sys.executable, "-c", RUNNER, *args]


def run(args: list[str], env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess:
    result = subprocess.run(command(args), cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert "TORCH WAS IMPORTED" not in result.stderr, args
    assert "Traceback" not in result.stderr, result.stderr
    return result


def test_search_files_info_and_errors(hub, hub_files):
    env = hub_env(hub, hub.home)
    cases = {
        "search": ["hub", "search", "tiny-llama", "--json"],
        "search-text": ["hub", "search", "tiny-llama", "--sort", "likes"],
        "files": ["hub", "files", REPO_BIG, "--json"],
        "files-text": ["hub", "files", REPO_BIG],
        "info": ["hub", "info", REPO_BIG, BIG_FILE, "--json", "--main", str(hub_files["mid"])],
        "info-text": ["hub", "info", REPO_MID, "Tiny-Llama-2L-Q8_0.gguf"],
        "missing-repo": ["hub", "files", "nobody/nothing"],
        "gated": ["hub", "info", REPO_GATED, "Tiny-Llama-Gated-Q8_0.gguf"],
        "bad-sort": ["hub", "search", "x", "--sort", "best"],
    }
    with ThreadPoolExecutor(4) as pool:
        out = dict(zip(cases, pool.map(lambda a: run(a, env), cases.values())))
    for name in ("search", "search-text", "files", "files-text", "info", "info-text"):
        assert out[name].returncode == 0, (name, out[name].stderr)
    assert [r["repo_id"] for r in json.loads(out["search"].stdout)][0] == REPO_MID
    assert out["search-text"].stdout.splitlines()[1].startswith("specula-test/Tiny-Llama-1L-GGUF")
    files = json.loads(out["files"].stdout)
    assert {f["filename"]: f["is_split"] for f in files} == {BIG_FILE: False, SPLIT_FIRST: True}
    assert "Q8_0" in out["files-text"].stdout and "(2 parts)" in out["files-text"].stdout
    info = json.loads(out["info"].stdout)
    assert info["info"]["architecture"] == "llama" and info["info"]["n_layers"] == 4
    assert info["bytes_transferred"] < info["file_size"] / 20
    assert info["fit"]["fits"] in (True, False) and info["fit"]["reason"]
    assert info["draft_for_main"]["compatible"] is True
    text = out["info-text"].stdout
    assert "architecture:" in text and "this machine:" in text and "range request" in text
    for name, pattern in (("missing-repo", "no repository nobody/nothing"),
                          ("gated", "is gated: accept its terms")):
        err = out[name].stderr.strip()
        assert out[name].returncode == 1 and len(err.splitlines()) == 1 and pattern in err, err
    assert out["bad-sort"].returncode == 2 and len(out["bad-sort"].stderr.strip().splitlines()) == 1


def test_download_then_models(hub, hub_files, tmp_path):
    env = hub_env(hub, hub.home)
    got = run(["hub", "download", REPO_BIG, BIG_FILE], env)
    assert got.returncode == 0, got.stderr
    path = Path(got.stdout.strip())
    assert path.read_bytes() == hub_files["big"].read_bytes()
    assert "100.0%" in got.stderr and "ETA" in got.stderr  # the progress bar
    dest = tmp_path / "dir"
    got = run(["hub", "download", REPO_MID, "Tiny-Llama-2L-Q8_0.gguf", "--dir", str(dest)], env)
    assert got.returncode == 0 and (dest / "Tiny-Llama-2L-Q8_0.gguf").exists()
    listed = run(["models", "--json", "--no-builtin", "--dir", str(dest)], env)
    models = json.loads(listed.stdout)["models"]
    assert [(m["source"], m["name"]) for m in models] == [("hf-cache", f"{REPO_BIG} (F32)"),
                                                          ("folder", "Tiny-Llama-2L-Q8_0.gguf")]
    assert all(m["error"] is None and m["architecture"] == "llama" for m in models)
    full = run(["hub", "download", REPO_BIG, BIG_FILE], {**env, "SPECULA_FAKE_FREE_BYTES": "10"})
    assert full.returncode == 0  # already downloaded: nothing to fit


def test_download_refused_when_the_disk_is_too_small(hub):
    env = {**hub_env(hub, hub.home), "SPECULA_FAKE_FREE_BYTES": "1000"}
    got = run(["hub", "download", REPO_BIG, BIG_FILE], env)
    assert got.returncode == 1 and "not enough disk space" in got.stderr
    assert hub.cdn_gets() == []


def test_ctrl_c_leaves_a_partial_that_the_next_run_resumes(hub, hub_files):
    data = hub_files["big"].read_bytes()
    env = hub_env(hub, hub.home)
    hub.faults.throttle_bps = 1 << 20
    # As from a terminal: a suite started in the background (a shell's `&`) hands its children
    # SIGINT ignored, and Python then installs no Ctrl-C handler at all.
    proc = subprocess.Popen(command(["hub", "download", REPO_BIG, BIG_FILE]), cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    blobs = hub.home / "hub" / f"models--{REPO_BIG.replace('/', '--')}" / "blobs"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        partial = next(iter(blobs.glob("*.incomplete")), None) if blobs.exists() else None
        if partial is not None and partial.stat().st_size >= 512 * 1024:
            break
        time.sleep(0.05)
    else:
        proc.kill()
        pytest.fail("the download did not start")
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert f"run `specula hub download {REPO_BIG} {BIG_FILE}` to resume" in err
    assert "Traceback" not in err and out == ""
    kept = partial.stat().st_size
    assert 0 < kept < len(data)
    listed = json.loads(run(["models", "--json", "--no-builtin"], env).stdout)
    assert listed["models"] == [] and listed["pending"][0]["done"] == kept
    hub.reset()
    again = run(["hub", "download", REPO_BIG, BIG_FILE], env)
    assert again.returncode == 0 and Path(again.stdout.strip()).read_bytes() == data
    [get] = hub.cdn_gets(data)
    assert get.range == f"bytes={kept}-" and get.body_bytes == len(data) - kept


def test_login_reads_the_token_from_stdin_and_stores_it_like_the_hf_cli(hub):
    env = hub_env(hub, hub.home)
    rejected = subprocess.run(command(["hub", "login"]), input="hf_wrong\n", cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=60)
    assert rejected.returncode == 1 and "rejected this token" in rejected.stderr
    assert not (hub.home / "token").exists()
    saved = subprocess.run(command(["hub", "login"]), input=GOOD_TOKEN + "\n", cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=60)
    assert saved.returncode == 0 and saved.stdout.strip() == "token saved"
    assert (hub.home / "token").read_text() == GOOD_TOKEN
    got = run(["hub", "download", REPO_GATED, "Tiny-Llama-Gated-Q8_0.gguf"], env)  # now allowed
    assert got.returncode == 0, got.stderr


def test_models_lists_one_file_once_with_where_else_it_is(tiny_paths, tmp_path):
    """The same file in two folders is one model, its other place said below it (issue 52 item 5)."""
    import os

    folders = [tmp_path / "a", tmp_path / "b"]
    for folder in folders:
        folder.mkdir()
        (folder / "tiny-Q8_0.gguf").write_bytes(tiny_paths["llama-q8"].read_bytes())
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}
    env.pop("HF_HUB_CACHE", None)
    listed = run(["models", "--no-builtin", "--dir", str(folders[0]), "--dir", str(folders[1])], env)
    lines = listed.stdout.splitlines()
    assert len(lines) == 2 and lines[0].startswith("folder") and "tiny-Q8_0.gguf" in lines[0], lines
    assert lines[1].strip() == f"also here: {folders[1] / 'tiny-Q8_0.gguf'} (the same file)"
