"""Changing only the drafter keeps the main model loaded (issue 43 item 11), as LM Studio loads
a draft beside the loaded main: lookup, the n-gram cache and none are instant; a draft model
is the only thing loaded."""

from __future__ import annotations

import time

from PySide6.QtCore import Qt

from app.worker.requests import LOOKUP, MODEL, NGRAM_CACHE, NONE
from tests.llama_support import require_llama_cpp
from tests.gui_support import GREEDY, WAIT_MS, add_models, load_pair, open_window, send, shot  # noqa: F401


def _apply(qtbot, window, stages: list[str]) -> float:
    """Press the picker's button and wait for the load or swap to end; its wall time."""
    stages.clear()
    picker = window.picker
    started = time.monotonic()
    with qtbot.waitSignal(window.host.loaded, timeout=WAIT_MS):
        qtbot.mouseClick(picker.load_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not picker.cancel_button.isEnabled(), timeout=WAIT_MS)
    return time.monotonic() - started


def test_changing_only_the_drafter_keeps_the_main_model_loaded(qtbot, data_dir, tiny_paths):
    require_llama_cpp()
    window = open_window(qtbot)
    picker = window.picker
    main, draft = tiny_paths["llama-q8"], tiny_paths["llama-f32"]
    add_models(qtbot, window, [main, draft])
    stages: list[str] = []
    window.host.loadProgress.connect(lambda stage, _frac: stages.append(stage))
    started = time.monotonic()
    load_pair(qtbot, window, main, LOOKUP)
    load_wall = time.monotonic() - started
    first = window.host.current_session()
    assert any(s.startswith("main model") for s in stages)

    for kind, path in ((NGRAM_CACHE, None), (MODEL, draft), (NONE, None), (LOOKUP, None)):
        assert picker.select_draft(kind, str(path) if path else None)
        assert picker.load_button.text() == "Apply"
        wall = _apply(qtbot, window, stages)
        session = window.host.current_session()
        assert window.loaded_facts.drafter == kind
        assert session.pair.main is first.pair.main and session.kv is first.kv, f"{kind}: the main model was reloaded"
        assert not [s for s in stages if s.startswith("main model")], stages
        message = window.statusBar().currentMessage()
        assert window.loaded_facts.main_kept and "stayed loaded" in message
        assert message.startswith("drafting off (") if kind == NONE else "now drafting with" in message, message
        if kind == MODEL:
            assert session.pair.draft is not None and any(s.startswith("draft model") for s in stages)
        else:
            assert session.pair.draft is None and wall < max(load_wall / 3, 0.5), (kind, wall, load_wall)
        shot(window, f"drafter-swap-{kind}")
    summary = send(qtbot, window, "Hello there", GREEDY)  # the kept main model still answers
    assert summary["n_predicted"] > 0

    # A different main model is a load: it says so, and loads it.
    picker.set_backend("torch")
    assert picker.load_button.text() == "Load"
    _apply(qtbot, window, stages)
    assert window.host.current_session().pair.main is not first.pair.main
    assert any(s.startswith("main model") for s in stages)
    window.close()
