"""What runs and what is only chosen (issue 43 items 1 and 2): after a change the Model tab shows
the pending choice plainly with one Load/Apply action, while the plan line, the progress bar, the
state line and the status bar go on describing what runs; a control whose value is not the
running one says so beside it; Load/Apply clears it all."""

from __future__ import annotations

from PySide6.QtCore import Qt

from app.compare.fastest import Fastest
from app.worker.requests import LOOKUP, NGRAM_CACHE
from tests.llama_support import require_llama_cpp
from tests.gui_support import WAIT_MS, add_models, load_pair, open_window, shot  # noqa: F401


def press(qtbot, window) -> None:
    picker = window.picker
    with qtbot.waitSignal(window.host.loaded, timeout=WAIT_MS):
        qtbot.mouseClick(picker.load_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not picker.cancel_button.isEnabled(), timeout=WAIT_MS)


def describes_running(window, main: str) -> None:
    """The plan line, the state line and the status bar name the running model, the bar is not
    a full "loaded" bar under another choice."""
    picker = window.picker
    assert picker.state_label.text().startswith(f"Loaded {main} ")
    assert window.pair_label.toolTip().startswith(f"{main} · ")
    assert "Runs on llama.cpp" in picker.plan_label.text()


def test_a_pending_change_is_shown_beside_what_runs_and_cleared_by_load(qtbot, data_dir, tiny_paths):
    require_llama_cpp()
    window = open_window(qtbot)
    picker = window.picker
    add_models(qtbot, window, [tiny_paths["llama-q8"], tiny_paths["llama-f32"]])
    load_pair(qtbot, window, tiny_paths["llama-q8"], LOOKUP)
    assert not picker.pending_change() and picker.progress.format() == "loaded"
    assert picker.load_button.text() == "Reload"

    # Another main model: chosen, not running; Load is the one action.
    assert picker.select_main(str(tiny_paths["llama-f32"]))
    assert picker.pending_label.isVisibleTo(window)
    assert "not running yet: main model llama-f32" in picker.pending_label.text()
    assert picker.load_button.text() == "Load"
    assert picker.progress.value() == 0 and picker.progress.format() == "change not applied yet"
    assert picker.plan_label.text().startswith("Running now: llama-q8 — Runs on llama.cpp")
    describes_running(window, "llama-q8")
    shot(window, "pending-main")

    # Back to the running choice: nothing pending.
    assert picker.select_main(str(tiny_paths["llama-q8"])) and picker.select_draft(LOOKUP)
    assert not picker.pending_change() and picker.progress.format() == "loaded"
    assert picker.plan_label.text().startswith("Runs on llama.cpp")

    # Only the drafter: Apply, and the line says the main model stays.
    assert picker.select_draft(NGRAM_CACHE)
    assert "drafting with n-gram cache" in picker.pending_label.text()
    assert "main model stays loaded" in picker.pending_label.text() and picker.load_button.text() == "Apply"
    shot(window, "pending-drafter")
    press(qtbot, window)
    assert not picker.pending_change() and not picker.pending_label.isVisibleTo(window)
    assert "n-gram cache" in picker.state_label.text() and picker.progress.format() == "loaded"
    describes_running(window, "llama-q8")

    # Compare's "Use in chat": the choice is pending, the status bar says so in full.
    choice = Fastest(config="none", main_path=str(tiny_paths["llama-f32"]), drafter="none", draft_path=None,
                     draft_max=16, adaptive=True, draft_min=0, draft_p_min=0.75, speedup=1.0)
    window.use_compare_choice(choice)
    assert picker.pending_change() and "main model llama-f32" in picker.pending_label.text()
    describes_running(window, "llama-q8")
    bar, message = window.statusBar(), window.statusBar().currentMessage()
    assert "press Load" in message
    room = bar.width() - window.pair_label.width() - 24
    assert bar.fontMetrics().horizontalAdvance(message) <= room, "the status-bar hint is cut off"
    shot(window, "pending-compare")
    press(qtbot, window)
    assert not picker.pending_change()
    describes_running(window, "llama-f32")
    window.close()


def test_controls_that_need_a_reload_say_so_beside_them(qtbot, data_dir, tiny_paths):
    require_llama_cpp()
    window = open_window(qtbot)
    picker = window.picker
    add_models(qtbot, window, [tiny_paths["llama-q8"]])
    load_pair(qtbot, window, tiny_paths["llama-q8"], LOOKUP)
    plan = picker.plan_label.text()

    picker.set_backend("torch")  # the backend combo
    assert picker.backend_note.isVisibleTo(window) and "Needs Load" in picker.backend_note.text()
    assert "auto" in picker.backend_note.text() and picker.plan_label.text() == plan
    assert "backend torch" in picker.pending_label.text()
    # The GPU layers slider, where a GPU is found: what runs has no layers on it.
    picker.main_offload.set_devices({"gpu": "cuda", "name": "a GPU"})
    assert picker.main_offload.note.isVisibleTo(window)
    assert picker.main_offload.note.text() == "Needs Load: no layers on the GPU in what runs now."
    shot(window, "pending-controls")
    picker.main_offload.set_devices({"gpu": None, "reason": "no GPU"})
    assert not picker.main_offload.note.isVisibleTo(window)

    press(qtbot, window)
    assert window.loaded_facts.backend == "torch" and not picker.pending_change()
    assert not picker.backend_note.isVisibleTo(window)
    picker.set_backend("auto")
    assert picker.backend_note.text() == "Needs Load: the model runs on backend “torch” until then."
    assert picker.plan_label.text().startswith("Runs on torch")  # the plan is what runs
    window.close()
