"""The grey lines under a reply say why drafting went as it did, and only where something drafted:
with no drafter, nothing about drafting (issue 60 item 5); on llama-server, a drafted reply slower
than plain decoding says why with llama-server's own counts (issue 60 item 6)."""

from __future__ import annotations

from app.ui.chat.conversation import ending_note
from app.worker.requests import NONE, GenSettings
from tests.gui_support import load_pair, open_window, send, shot, visible_text

DRAFT_WORDS = ("draft", "propose", "copy")


def test_no_drafter_says_nothing_about_drafting(qtbot, data_dir, tiny_paths):
    window = open_window(qtbot)
    from tests.gui_support import add_models

    add_models(qtbot, window, [tiny_paths["llama-f32"]])
    load_pair(qtbot, window, tiny_paths["llama-f32"], NONE)
    summary = send(qtbot, window, "Write a function that adds two numbers.",
                   GenSettings(temperature=0.0, max_tokens=48))
    assert summary["drafter"] == "none" and summary["n_predicted"] >= 8
    assert summary.get("schedule_note") is None
    note = ending_note(window.store.messages(window.controller.chat_id)[-1])
    assert note and not any(word in note.lower() for word in DRAFT_WORDS), note
    assert "nothing to propose" not in visible_text(window)
    shot(window, "60-5-no-drafter-stats")
