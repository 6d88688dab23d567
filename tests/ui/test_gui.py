"""The window, for real: a QApplication offscreen, the real MainWindow, tiny real GGUF models
through the real loader and engine on the model host's thread, the real history database.

Set SPECULA_SHOTS=/some/folder to save screenshots of the states these tests reach.
"""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt, QUrl

from app.ui.common.paths import history_path
from app.worker.requests import LOOKUP, MODEL, NONE, GenSettings
from tests.gui_support import (GREEDY_FIXED, LONG, WAIT_MS, add_models, load_pair, marked_chars, open_window, reopen_store, send,
                               shot, start_reply, visible_text)


# --- the whole path -------------------------------------------------------------------------

def test_whole_path_pair_to_marked_streamed_reply_and_charts(qtbot, data_dir, tiny_paths, monkeypatch, tmp_path):
    main, draft = tiny_paths["llama-f32"], tiny_paths["llama-q8"]
    window = open_window(qtbot)
    add_models(qtbot, window, [main, draft, tiny_paths["qwen2-f32"]])
    facts = load_pair(qtbot, window, main, MODEL, draft)
    assert facts.draft_path == str(draft)
    assert window.picker.state_label.text().startswith("Loaded ")
    assert "CPU" in window.pair_label.text()
    shot(window, "01-loaded")

    redraws = window.charts.redraw_count
    summary = send(qtbot, window, "Hello! Write me a few words about foxes.", GREEDY_FIXED)
    assert summary["drafter"] == "llama-q8" and summary["n_accepted"] > 0

    # Saved: the user message, and the reply with its draft spans and stats.
    chat_id = window.controller.chat_id
    user, reply = window.store.messages(chat_id)
    assert user.role == "user" and user.content.startswith("Hello!")
    assert reply.complete and reply.content == summary["text"]
    assert reply.draft_spans and reply.stats["n_accepted"] == summary["n_accepted"]
    assert window.store.chat(chat_id).title == "Hello! Write me a few words about foxes."
    assert window.chat_list.chat_ids() == [chat_id]

    # Shown: the reply, its accepted draft text highlighted, and the stats line under it.
    text = visible_text(window)
    assert "tok/s" in text and f"accepted {summary['n_accepted']}" in text
    assert marked_chars(window.panel.view) > 0
    shot(window, "02-reply-marked")
    window.panel.mark_toggle.setChecked(False)
    assert marked_chars(window.panel.view) == 0
    window.panel.mark_toggle.setChecked(True)
    assert marked_chars(window.panel.view) > 0

    # Charts: one speed point per step after the first, acceptance as the summary counts it.
    charts = window.charts
    assert charts.redraw_count > redraws
    assert len(charts.tps_points()) >= 1 and charts.acceptance_points()
    assert charts.accepted_by_position() == list(summary["accepted_by_position"])
    assert charts.drafted_by_position() == list(summary["drafted_by_position"])


def test_prompt_lookup_reply_and_system_prompt(qtbot, data_dir, tiny_paths):
    window = open_window(qtbot)
    add_models(qtbot, window, [tiny_paths["llama-f32"]])
    facts = load_pair(qtbot, window, tiny_paths["llama-f32"], LOOKUP)
    assert facts.drafter == LOOKUP
    window.panel.system_prompt.setPlainText("You are a fox.")
    summary = send(qtbot, window, "def add(a, b):\n    return a + b\n\nRewrite add with clearer names.")
    assert summary["drafter"] == "lookup"
    assert window.store.system_prompt(window.controller.chat_id) == "You are a fox."
    # The code block of the message is rendered as code, not as text with backticks.
    assert "return a + b" in visible_text(window)


def test_stop_mid_reply_keeps_the_text(qtbot, data_dir, tiny_paths):
    window = open_window(qtbot)
    add_models(qtbot, window, [tiny_paths["llama-f32"]])
    load_pair(qtbot, window, tiny_paths["llama-f32"], NONE)
    with qtbot.waitSignal(window.controller.replyFinished, timeout=WAIT_MS) as blocker:
        start_reply(qtbot, window, "Tell me a very long story.", LONG)
        # The reply streams into the view before it ends.
        qtbot.waitUntil(lambda: len(window.panel.view.streamed_text()) > 10, timeout=WAIT_MS)
        assert window.controller.busy and window.panel.stop_button.isEnabled()
        shot(window, "03-streaming")
        window.on_escape()  # what the Esc shortcut calls
    summary, error = blocker.args
    assert error == "" and summary["stop_reason"] == "cancelled"
    assert summary["n_predicted"] < LONG.max_tokens
    reply = window.store.messages(window.controller.chat_id)[-1]
    assert reply.complete and reply.content == summary["text"] and reply.stats["stop_reason"] == "cancelled"
    assert "stopped" in visible_text(window)
    assert window.panel.send_button.isEnabled() and not window.panel.stop_button.isEnabled()


def test_escape_key_stops_the_reply(qtbot, data_dir, tiny_paths):
    window = open_window(qtbot)
    add_models(qtbot, window, [tiny_paths["llama-f32"]])
    load_pair(qtbot, window, tiny_paths["llama-f32"], NONE)
    window.activateWindow()
    with qtbot.waitSignal(window.controller.replyFinished, timeout=WAIT_MS) as blocker:
        start_reply(qtbot, window, "Tell me a very long story.", LONG)
        qtbot.waitUntil(lambda: len(window.panel.view.streamed_text()) > 0, timeout=WAIT_MS)
        qtbot.keyClick(window.panel.input, Qt.Key.Key_Escape)
    assert blocker.args[0]["stop_reason"] == "cancelled"


def test_regenerate_and_edit_and_resend(qtbot, data_dir, tiny_paths):
    window = open_window(qtbot)
    add_models(qtbot, window, [tiny_paths["llama-f32"]])
    load_pair(qtbot, window, tiny_paths["llama-f32"], LOOKUP)
    sampled = GenSettings(temperature=0.9, max_tokens=24, seed=1)
    send(qtbot, window, "First question", sampled)
    send(qtbot, window, "Second question", sampled)
    chat_id = window.controller.chat_id
    first_user, first_reply, second_user, second_reply = window.store.messages(chat_id)

    # Regenerate the last reply through its link: same conversation, a new version of that reply.
    window.gen_form.set_settings(GenSettings(temperature=0.9, max_tokens=24, seed=2))
    with qtbot.waitSignal(window.controller.replyFinished, timeout=WAIT_MS):
        window.panel.view.anchorClicked.emit(QUrl(f"action:regenerate:{second_reply.id}"))
    rows = window.store.messages(chat_id)
    assert [m.role for m in rows] == ["user", "assistant", "user", "assistant"]
    assert (rows[3].id, rows[3].n_versions) == (second_reply.id, 2) and rows[:3] == [first_user, first_reply, second_user]

    # Edit the first question and resend: everything after it is replaced.
    window.panel.view.anchorClicked.emit(QUrl(f"action:edit:{first_user.id}"))
    assert window.panel.edit_banner.isVisibleTo(window) and window.panel.input.toPlainText() == "First question"
    shot(window, "04-editing")
    send(qtbot, window, "First question, edited", sampled)
    rows = window.store.messages(chat_id)
    assert [(m.role, m.content if m.role == "user" else "") for m in rows] == [
        ("user", "First question, edited"), ("assistant", "")]
    assert not window.panel.edit_banner.isVisibleTo(window)


def test_new_chat_and_switching_chats(qtbot, data_dir, tiny_paths):
    window = open_window(qtbot)
    add_models(qtbot, window, [tiny_paths["llama-f32"]])
    load_pair(qtbot, window, tiny_paths["llama-f32"], LOOKUP)
    send(qtbot, window, "About foxes")
    first = window.controller.chat_id
    window.activateWindow()
    qtbot.keyClick(window.panel.input, Qt.Key.Key_N, Qt.KeyboardModifier.ControlModifier)  # New chat
    second = window.controller.chat_id
    assert second != first and window.store.messages(second) == []
    assert window.chat_list.current_chat_id() == second and visible_text(window) == ""
    window.new_chat_action.trigger()  # an empty chat is reused, not piled up
    assert window.controller.chat_id == second
    send(qtbot, window, "About dogs")
    assert window.store.chat(second).title == "About dogs"
    window.chat_list.list.setCurrentRow(window.chat_list.chat_ids().index(first))  # the user clicks
    assert window.controller.chat_id == first and "About foxes" in visible_text(window)

    # Deleting the chat on screen moves to its neighbour; the deleted one is gone for good.
    window.chat_list.confirm_delete = lambda title: True  # the confirmation dialog, answered
    window.chat_list.delete_current()
    assert window.store.chat(first) is None
    assert window.controller.chat_id == second and "About dogs" in visible_text(window)


def test_deleting_the_chat_of_a_streaming_reply_stops_it(qtbot, data_dir, tiny_paths):
    window = open_window(qtbot)
    add_models(qtbot, window, [tiny_paths["llama-f32"]])
    load_pair(qtbot, window, tiny_paths["llama-f32"], NONE)
    window.chat_list.confirm_delete = lambda title: True
    with qtbot.waitSignal(window.controller.replyFinished, timeout=WAIT_MS):
        start_reply(qtbot, window, "Tell me a very long story.", LONG)
        window.chat_list.delete_current()
    assert window.store.chats() == [] and not window.controller.busy
    assert window.controller.chat_id is None and visible_text(window) == ""


def test_no_draft_speed_becomes_the_charts_reference(qtbot, data_dir, tiny_paths):
    window = open_window(qtbot)
    main = tiny_paths["llama-f32"]
    add_models(qtbot, window, [main])
    load_pair(qtbot, window, main, NONE)
    summary = send(qtbot, window, "Hello there")
    assert summary["drafter"] == "none" and summary["n_predicted"] >= 8
    assert window.controller.reference_tps(str(main)) == pytest.approx(summary["decode_tps"])
    load_pair(qtbot, window, main, LOOKUP)
    line = window.charts._reference_line
    assert line.isVisible() and line.value() == pytest.approx(summary["decode_tps"])


@pytest.mark.demo
def test_a_declined_draft_model_is_said_under_the_reply(qtbot, data_dir, tmp_path):
    """SmolLM2 with a draft of 25 of its own 30 layers: a drafted token costs 5/6 of a main step,
    so the schedule never runs it, and the window says why under the reply, as `run` does."""
    from app.engine.gguf.layer_draft import default_layers, write_layer_draft
    from app.hub.builtin import builtin_path

    main = builtin_path("smollm2-135m")
    draft = tmp_path / "smollm2-25-of-30.gguf"
    write_layer_draft(main, default_layers(30), draft)
    window = open_window(qtbot)
    add_models(qtbot, window, [draft])
    load_pair(qtbot, window, main, MODEL, draft)
    summary = send(qtbot, window, "Name three colours.", GenSettings(temperature=0.0, max_tokens=24))
    assert summary["n_drafted"] == 0
    assert summary["schedule_note"].startswith("drafting declined in all"), summary["schedule_note"]
    assert summary["schedule_note"] in visible_text(window)
    shot(window, "declined-draft-model")


def test_restart_restores_history_and_settings(qtbot, data_dir, tiny_paths):
    window = open_window(qtbot)
    main = tiny_paths["llama-f32"]
    add_models(qtbot, window, [main, tiny_paths["llama-q8"]])
    load_pair(qtbot, window, main, MODEL, tiny_paths["llama-q8"])
    send(qtbot, window, "A finished question")
    # Stopped at once, the engine stops after its first step; but where other programs keep the
    # cores busy, the worker can write the tiny model's whole reply before the GUI thread runs
    # stop(): a reply that ended by itself is asked again.
    for _ in range(5):
        with qtbot.waitSignal(window.controller.replyFinished, timeout=WAIT_MS) as blocker:
            start_reply(qtbot, window, "A question stopped mid-reply", GenSettings(temperature=0.0, max_tokens=400, top_k=7))
            window.controller.stop()
        if blocker.args[0]["stop_reason"] == "cancelled":
            break
    chat_id = window.controller.chat_id
    before = window.store.messages(chat_id)
    shown_before = visible_text(window)
    window.main_splitter.setSizes([300, 640, 500])
    splitter_sizes = window.main_splitter.sizes()
    window.close()

    again = open_window(qtbot)
    assert again.controller.chat_id == chat_id and again.chat_list.current_chat_id() == chat_id
    assert again.store.messages(chat_id) == before
    assert visible_text(again) == shown_before
    assert before[-1].stats["stop_reason"] == "cancelled" and "stopped" in shown_before
    # Settings: the sampling values, and the last pair selected (not loaded) in the picker.
    assert again.gen_form.settings().top_k == 7
    assert again.picker.main_path() == str(main)
    assert again.picker.draft_choice() == (MODEL, str(tiny_paths["llama-q8"]))
    assert again.loaded_facts is None
    assert again.main_splitter.sizes() == splitter_sizes
    shot(again, "05-restored")


def test_close_during_a_reply_stops_it_and_keeps_the_text(qtbot, data_dir, tiny_paths):
    window = open_window(qtbot)
    add_models(qtbot, window, [tiny_paths["llama-f32"]])
    load_pair(qtbot, window, tiny_paths["llama-f32"], NONE)
    start_reply(qtbot, window, "Tell me a very long story.", LONG)
    qtbot.waitUntil(lambda: len(window.panel.view.streamed_text()) > 10, timeout=WAIT_MS)
    shown = window.controller.stream.text
    chat_id = window.controller.chat_id
    window.close()
    assert not window.host_thread.is_running() and not window.thread_stuck
    with reopen_store(data_dir) as store:
        reply = store.messages(chat_id)[-1]
    assert reply.role == "assistant" and reply.complete
    assert reply.content.startswith(shown) and reply.stats["stop_reason"] == "cancelled"


def test_sending_without_a_model_says_so(qtbot, data_dir):
    window = open_window(qtbot)
    window.panel.input.setPlainText("Hello?")
    qtbot.keyClick(window.panel.input, Qt.Key.Key_Return, Qt.KeyboardModifier.ControlModifier)
    assert not window.controller.busy
    assert "no model is loaded" in window.statusBar().currentMessage()
    assert window.panel.input.toPlainText() == "Hello?"  # nothing typed is lost
    assert history_path().exists()


def test_a_failed_reply_is_a_message_and_the_question_is_kept(qtbot, data_dir, tiny_paths):
    window = open_window(qtbot)
    add_models(qtbot, window, [tiny_paths["llama-f32"]])
    load_pair(qtbot, window, tiny_paths["llama-f32"], LOOKUP)
    too_long = "The quick brown fox jumps over the lazy dog. " * 200  # beyond the 512-token context
    with qtbot.waitSignal(window.controller.replyFinished, timeout=WAIT_MS) as blocker:
        start_reply(qtbot, window, too_long)
    summary, error = blocker.args
    assert summary is None and "context holds 512" in error
    assert window.statusBar().currentMessage().startswith("reply failed: the prompt needs")
    [question] = window.store.messages(window.controller.chat_id)
    assert question.role == "user" and question.content == too_long
    # The window is usable again at once.
    assert send(qtbot, window, "Short one")["n_predicted"] > 0
