"""A llama.cpp self-test that failed for a reason about this start (memory, a kill, a timeout) is
not kept as a verdict about the CPU: the next start runs it again; `specula doctor` runs it now.
Only an illegal instruction, or a crash repeated at three starts, is kept. Each case is a real
child process, in a cache folder of its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.engine.backends.llamacpp import probe as llamacpp_probe
from tests.llama_support import require_llama_cpp

ROOT = Path(__file__).resolve().parents[2]


def _python(code: str, cache: Path, limit_as: int | None = None) -> subprocess.CompletedProcess:
    """`code` in a fresh interpreter whose probe verdicts live in `cache` (under an address-space
    limit, inherited by the self-test child, where given)."""
    env = dict(os.environ, XDG_CACHE_HOME=str(cache), PYTHONPATH=str(ROOT))
    env.pop("SPECULA_LLAMACPP_PROBE", None)
    prefix = (f"import resource; resource.setrlimit(resource.RLIMIT_AS, ({limit_as}, {limit_as}))\n"
              if limit_as else "")
    return subprocess.run([sys.executable, "-c", prefix + code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)


PROBE = ("from app.engine.backends.llamacpp import probe as l\n"
         "{setup}\nok, why = l.probe()\nprint(repr((ok, why)))")


def _verdicts(cache: Path) -> dict:
    path = cache / "specula" / "llamacpp-probe.json"
    return json.loads(path.read_text()) if path.exists() else {}


def test_a_self_test_that_ran_out_of_memory_is_tried_again_at_the_next_start(tmp_path):
    require_llama_cpp()
    starved = _python(PROBE.format(setup=""), tmp_path, limit_as=300_000_000)
    assert "(False," in starved.stdout or starved.returncode != 0, starved
    assert not any(v.get("ok") is False for v in _verdicts(tmp_path).values())  # no verdict about the CPU
    if "(False," in starved.stdout:
        assert "runs again at the next start" in starved.stdout
    healthy = _python(PROBE.format(setup=""), tmp_path)
    assert "(True, '')" in healthy.stdout, healthy.stderr
    assert any(v.get("ok") is True for v in _verdicts(tmp_path).values())


def test_a_self_test_that_timed_out_is_not_kept(tmp_path):
    require_llama_cpp()
    done = _python(PROBE.format(setup="l.PROBE_TIMEOUT_S = 0.01"), tmp_path)
    assert "did not finish in 0.01 s" in done.stdout and "runs again at the next start" in done.stdout, done
    assert _verdicts(tmp_path) == {}


def test_doctor_runs_the_self_test_again_whatever_is_cached(tmp_path):
    require_llama_cpp()
    key = _python("from app.engine.backends.llamacpp import lib as l; print(l.build_key())", tmp_path).stdout.strip()
    folder = tmp_path / "specula"
    folder.mkdir(parents=True)
    (folder / "llamacpp-probe.json").write_text(json.dumps({key: {"ok": False, "reason": "an old bad start"}}))
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path))
    env.pop("SPECULA_LLAMACPP_PROBE", None)
    done = subprocess.run([sys.executable, "-m", "app", "doctor"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0 and "self-test passed on this CPU" in done.stdout, done
    assert _verdicts(tmp_path)[key]["ok"] is True


@pytest.mark.parametrize("sig, kind", [("SIGILL", llamacpp_probe.CPU_VERDICT), ("SIGSEGV", llamacpp_probe.CRASH),
                                      ("SIGKILL", llamacpp_probe.PASSING), ("SIGABRT", llamacpp_probe.PASSING),
                                      (None, llamacpp_probe.PASSING)])
def test_what_each_ending_of_the_child_says(sig, kind):
    """SIGILL is about the CPU; SIGSEGV may be (an AMX tile fault) or memory, so it counts once
    repeated; SIGKILL (the OOM killer), SIGABRT (a failed allocation) and an error exit are about
    this start. A real child ends each way."""
    code = f"import os, signal; os.kill(os.getpid(), signal.{sig})" if sig else "raise SystemExit('no model here')"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    ok, why, found = llamacpp_probe.judge(done.returncode, done.stderr)
    assert ok is False and found == kind and why and "\n" not in why
    assert (sig or "no model here") in why


def test_the_childs_last_line_reaches_no_terminal_as_escapes():
    """llama.cpp's log carries a model's own strings: an OSC 52 clipboard write or a colour in the
    child's last line is written out in the reason that doctor prints and the verdict keeps."""
    code = "import sys; sys.stderr.write('loading\\nname \\x1b]52;c;ZXZpbA==\\x07 \\x1b[31mred\\n'); sys.exit(3)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    ok, why, _ = llamacpp_probe.judge(done.returncode, done.stderr)
    assert ok is False and "\x1b" not in why and "\x07" not in why
    assert why.startswith("name \\x1b]52;c;ZXZpbA==\\x07") and "red" in why
