"""The model host on its own QThread: loads, streams, cancels and always reports the end.

Real tiny GGUF models through the real loader and engine; a real QThread and Qt's queued
signals (pytest-qt's qtbot waits on them).
"""

from __future__ import annotations

import threading
import time

import pytest
from PySide6.QtCore import Qt

from app.worker.host import HostThread
from app.worker.requests import LOOKUP, LOOKUP_CACHE, MODEL, NONE, UNTIL_CONTEXT, ChatRequest, GenSettings, PairChoice

WAIT_MS = 120_000
GREEDY = GenSettings(temperature=0.0, max_tokens=40)


@pytest.fixture
def host(qtbot):
    thread = HostThread()
    yield thread.host
    assert thread.stop(30), "the host thread did not stop"


def wait_for(qtbot, signal, start, timeout=WAIT_MS) -> tuple:
    """Call start() and wait for `signal`; its arguments. (qtbot.waitSignal's blocker would be
    called in the host's thread, and stop its timer from there.)"""
    got: list = []
    record = lambda *args: got.append(args)  # noqa: E731
    signal.connect(record)
    try:
        start()
        qtbot.waitUntil(lambda: bool(got), timeout=timeout)
    finally:
        signal.disconnect(record)
    return got[0]


def load(qtbot, host, spec: PairChoice):
    """Load a pair; a loadFailed fails the test with its message."""
    outcome: list = []
    host.loaded.connect(outcome.append)
    host.loadFailed.connect(outcome.append)
    try:
        host.load(spec)
        qtbot.waitUntil(lambda: bool(outcome), timeout=WAIT_MS)
    finally:
        host.loaded.disconnect(outcome.append)
        host.loadFailed.disconnect(outcome.append)
    assert not isinstance(outcome[0], str), f"load failed: {outcome[0]}"
    return outcome[0]


def load_failure(qtbot, host, spec: PairChoice, cancel: bool = False) -> str:
    def start() -> None:
        host.load(spec)
        if cancel:
            host.cancel()  # the job is only queued: its own cancel flag is already set

    return wait_for(qtbot, host.loadFailed, start)[0]


def generate(qtbot, host, request: ChatRequest) -> tuple[dict | None, str, list]:
    steps: list = []
    host.steps.connect(steps.extend)
    try:
        summary, error = wait_for(qtbot, host.finished, lambda: host.generate(request))
    finally:
        host.steps.disconnect(steps.extend)
    return summary, error, steps


def test_draft_model_pair_streams_the_main_models_greedy_reply(qtbot, host, tiny_paths):
    main, draft = str(tiny_paths["llama-f32"]), str(tiny_paths["llama-q8"])
    # float32: greedy identity is exact there (facts.md: half precision may flip near-ties).
    facts = load(qtbot, host, PairChoice(main, NONE, dtype="float32"))
    assert facts.main_path == main and facts.drafter == NONE and facts.load_s > 0
    request = ChatRequest((), "Hello, how are you?", "You are terse.", GREEDY)
    plain, error, _ = generate(qtbot, host, request)
    assert error == "" and plain["drafter"] == "none" and plain["n_drafted"] == 0

    facts = load(qtbot, host, PairChoice(main, MODEL, draft, dtype="float32"))
    assert facts.draft_path == draft and facts.main_plan.endswith("float32")
    fixed, error, _ = generate(qtbot, host, ChatRequest((), request.user_text, request.system_prompt,
                                                         GenSettings(temperature=0.0, max_tokens=40,
                                                                     draft_max=4, adaptive_draft=False)))
    assert error == "" and fixed["text"] == plain["text"]
    assert max(i + 1 for i, n in enumerate(fixed["drafted_by_position"]) if n) <= 4
    summary, error, steps = generate(qtbot, host, request)
    assert error == ""
    # Exact greedy identity in float32: speculative output is the main model's own.
    assert summary["text"] == plain["text"] and summary["tokens"] == plain["tokens"]
    assert summary["n_drafted"] > 0 and summary["n_accepted"] > 0
    # Every token arrived as a step, in order, with the accepted draft text flagged.
    assert "".join(step.text for step in steps) == summary["text"]
    assert sum(len(step.tokens) for step in steps) == summary["n_predicted"]
    assert any(step.draft_chars > 0 for step in steps)


def test_history_is_part_of_the_prompt(qtbot, host, tiny_paths):
    load(qtbot, host, PairChoice(str(tiny_paths["llama-f32"]), LOOKUP))
    alone, _, _ = generate(qtbot, host, ChatRequest((), "And then?", "", GREEDY))
    with_history, _, _ = generate(qtbot, host, ChatRequest(
        (("user", "Tell me about foxes."), ("assistant", "Foxes are quick.")), "And then?", "", GREEDY))
    assert with_history["n_prompt"] > alone["n_prompt"] + 8


def test_cancel_stops_a_reply_and_keeps_what_was_generated(qtbot, host, tiny_paths):
    load(qtbot, host, PairChoice(str(tiny_paths["llama-f32"]), NONE))
    steps: list = []

    def on_steps(events) -> None:
        steps.extend(events)
        if len(steps) >= 3:
            host.cancel()

    host.steps.connect(on_steps)
    request = ChatRequest((), "Tell me a long story.", "", GenSettings(temperature=0.0, max_tokens=400))
    summary, error = wait_for(qtbot, host.finished, lambda: host.generate(request))
    assert error == "" and summary["stop_reason"] == "cancelled"
    assert 3 <= summary["n_predicted"] < 400
    assert "".join(step.text for step in steps) == summary["text"]


def test_errors_end_with_finished_and_the_host_keeps_working(qtbot, host, tiny_paths):
    summary, error, _ = generate(qtbot, host, ChatRequest((), "Hi", "", GREEDY))
    assert summary is None and error.startswith("no model is loaded")

    load(qtbot, host, PairChoice(str(tiny_paths["llama-f32"]), LOOKUP))
    too_long = "The quick brown fox jumps over the lazy dog. " * 200  # far beyond the 512-token context
    summary, error, steps = generate(qtbot, host, ChatRequest((), too_long, "", GREEDY))
    assert summary is None and steps == []
    assert "context holds 512" in error and "\n" not in error

    summary, error, _ = generate(qtbot, host, ChatRequest((), "Hi", "", GREEDY))
    assert error == "" and summary["n_predicted"] > 0


def test_bad_settings_are_refused_with_one_line(qtbot, host, tiny_paths):
    load(qtbot, host, PairChoice(str(tiny_paths["llama-f32"]), NONE))
    summary, error, _ = generate(qtbot, host, ChatRequest((), "Hi", "", GenSettings(max_tokens=0)))
    assert summary is None and error == "the number of tokens to generate must be at least 1"


def test_a_reply_until_the_end_stops_only_where_the_model_or_the_context_ends(qtbot, host, tiny_paths):
    """Issue 60 item 12: the window's default max tokens is "until the end" (llama.cpp's -n -1):
    a coding answer is not cut at a token count."""
    facts = load(qtbot, host, PairChoice(str(tiny_paths["llama-f32"]), NONE))
    summary, error, _ = generate(qtbot, host, ChatRequest((), "Hi", "", GenSettings(temperature=0.0,
                                                                                    max_tokens=UNTIL_CONTEXT)))
    assert error == "" and summary["stop_reason"] in ("eos", "context"), (error, summary and summary["stop_reason"])
    if summary["stop_reason"] == "context":
        assert summary["n_prompt"] + summary["n_predicted"] == facts.n_ctx


def test_load_failures_are_one_line_messages(qtbot, host, tiny_paths, tmp_path):
    garbage = tmp_path / "garbage.gguf"
    garbage.write_bytes(b"this is not a model" * 100)
    assert load_failure(qtbot, host, PairChoice(str(garbage), NONE)).startswith("garbage.gguf: not a GGUF file")
    assert "file not found" in load_failure(qtbot, host, PairChoice(str(tmp_path / "missing.gguf"), NONE))


def test_incompatible_pair_is_refused_before_loading(qtbot, host, tiny_paths, tmp_path):
    from tests.header_gguf import make_tokens, write_gguf
    from tests.tiny_gguf import VOCAB_SIZE

    # A WordPiece vocabulary drafts neither token by token nor through text.
    wordpiece = write_gguf(tmp_path / "wordpiece.gguf", tokens=make_tokens(VOCAB_SIZE, "wp"), vocab_type="bert")
    message = load_failure(qtbot, host, PairChoice(str(tiny_paths["llama-f32"]), MODEL, str(wordpiece)))
    assert "cannot draft for llama-f32.gguf" in message and "cannot re-tokenize drafts" in message


def test_cancel_pressed_before_the_load_starts_is_not_lost(qtbot, host, tiny_paths):
    assert load_failure(qtbot, host, PairChoice(str(tiny_paths["qwen2-f32"]), NONE), cancel=True) == "loading cancelled"
    # The next load is a new job with a fresh flag.
    facts = load(qtbot, host, PairChoice(str(tiny_paths["qwen2-f32"]), NONE))
    assert facts.main_name


def test_device_probe_reports_no_gpu_with_a_reason(qtbot, host):
    (facts,) = wait_for(qtbot, host.devicesFound, host.probe_devices)
    import torch

    if torch.cuda.is_available():
        assert facts["gpu"] == "cuda" and facts["total_bytes"] > 0 and facts["name"]
    else:
        assert facts["gpu"] is None and "no GPU" in facts["reason"] and facts["cpu_dtype"] in ("gguf", "bfloat16", "float32")


def test_jobs_run_on_the_host_thread_and_calls_return_at_once(qtbot, host, tiny_paths):
    """The GUI thread only queues jobs: a call never waits for the model."""
    load(qtbot, host, PairChoice(str(tiny_paths["llama-f32"]), NONE))
    emitted_on: list[int] = []
    record = lambda _event: emitted_on.append(threading.get_ident())  # noqa: E731
    host.steps.connect(record, Qt.ConnectionType.DirectConnection)  # runs in the emitting thread
    request = ChatRequest((), "Tell me a story.", "", GenSettings(temperature=0.0, max_tokens=200))
    call_s: list[float] = []

    def start() -> None:
        started = time.monotonic()
        host.generate(request)
        call_s.append(time.monotonic() - started)

    try:
        wait_for(qtbot, host.finished, start)
        assert call_s[0] < 0.05
    finally:
        host.steps.disconnect(record)
    assert emitted_on and set(emitted_on) != {threading.get_ident()}


@pytest.fixture(scope="session")
def foreign_vocab_path(tmp_path_factory):
    """A tiny llama whose vocabulary differs from the others' in one token's text: valid GGUF,
    same size and type, but llama.cpp's rules say it cannot draft for them."""
    return write_foreign_vocab_model(tmp_path_factory.mktemp("foreign") / "foreign-vocab.gguf")


def write_foreign_vocab_model(path):
    import tests.tiny_gguf as tiny

    original = tiny.tiny_vocab

    def changed_vocab(vocab: str = "a"):
        tokens, types, merges = original(vocab)
        tokens[300] = tokens[300] + "Z"
        return tokens, types, merges

    tiny.tiny_vocab = changed_vocab
    try:
        return tiny.write_tiny_gguf(path, tiny.TinySpec(arch="llama", seed=9))
    finally:
        tiny.tiny_vocab = original


def test_the_pair_specs_dtype_means_torch_in_that_dtype(qtbot, host, tiny_paths):
    path = str(tiny_paths["llama-q8"])
    facts = load(qtbot, host, PairChoice(path, LOOKUP, dtype="bfloat16"))
    assert facts.backend == "torch" and facts.main_plan == "CPU, bfloat16"
    facts = load(qtbot, host, PairChoice(path, LOOKUP, dtype="float32"))
    assert facts.main_plan == "CPU, float32"


def test_the_ngram_cache_learns_from_chat_replies_and_is_kept_across_restarts(qtbot, tiny_paths, tmp_path):
    folder = tmp_path / "ngram-cache"
    spec = PairChoice(str(tiny_paths["llama-f32"]), LOOKUP_CACHE, dtype="float32", ngram_dir=str(folder))
    request = ChatRequest((), "Tell me about foxes.", "", GREEDY)
    first = HostThread()
    try:
        facts = load(qtbot, first.host, spec)
        assert facts.drafter_name == "lookup+ngram-cache" and facts.ngram_entries == 0
        plain, error, _ = generate(qtbot, first.host, request)
        assert error == ""
        qtbot.waitUntil(lambda: any(folder.glob("*.ngc")), timeout=WAIT_MS)  # saved after the reply
    finally:
        assert first.stop(30)
    # A new host (as after a restart) finds what the first learned: the same question's reply
    # is now drafted from the cache, and is the same reply.
    second = HostThread()
    try:
        facts = load(qtbot, second.host, spec)
        assert facts.ngram_entries > 0
        again, error, _ = generate(qtbot, second.host, request)
        assert error == "" and again["text"] == plain["text"]
        assert again["n_accepted"] > plain["n_accepted"]
    finally:
        assert second.stop(30)


def test_a_replys_steps_reach_the_gui_thread_in_batches_the_first_at_once(qtbot, host, tiny_paths):
    """Each hand-off wakes the GUI thread (on two cores, time taken from llama.cpp's spinning
    threads): a fast reply's steps arrive together, at most every STEPS_EVERY_S, the first alone
    (the time to first token), every step once and in order."""
    from app.common.batches import EVERY_S as STEPS_EVERY_S

    load(qtbot, host, PairChoice(str(tiny_paths["llama-f32"]), NONE))
    batches: list = []
    host.steps.connect(batches.append)
    try:
        summary, error = wait_for(qtbot, host.finished, lambda: host.generate(
            ChatRequest((), "Tell me a story.", "", GenSettings(temperature=0.0, max_tokens=200))))
    finally:
        host.steps.disconnect(batches.append)
    steps = [event for batch in batches for event in batch]
    assert error == "" and len(batches[0]) == 1
    assert "".join(step.text for step in steps) == summary["text"]
    assert [s.timestamp for s in steps] == sorted(s.timestamp for s in steps)
    span = steps[-1].timestamp - steps[0].timestamp
    assert len(batches) <= 2 + span / STEPS_EVERY_S < len(steps), (len(batches), len(steps), span)
