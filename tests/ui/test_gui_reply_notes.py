"""The grey lines under a reply say why drafting went as it did, and only where something drafted:
with no drafter, nothing about drafting (issue 60 item 5); on llama-server, a drafted reply slower
than plain decoding says why with llama-server's own counts (issue 60 item 6)."""

from __future__ import annotations

from app.engine.llama_server.notes import server_draft_note
from app.ui.chat.controller import _reference_key
from app.ui.chat.conversation import ending_note
from app.worker.requests import LLAMA_SERVER, MODEL, NONE, GenSettings
from tests.gui_support import add_models, load_pair, open_window, send, shot, visible_text

DRAFT_WORDS = ("draft", "propose", "copy")
PROMPT = "Write a function that adds two numbers."


def test_no_drafter_says_nothing_about_drafting(qtbot, data_dir, tiny_paths):
    window = open_window(qtbot)
    add_models(qtbot, window, [tiny_paths["llama-f32"]])
    load_pair(qtbot, window, tiny_paths["llama-f32"], NONE)
    summary = send(qtbot, window, PROMPT, GenSettings(temperature=0.0, max_tokens=48))
    assert summary["drafter"] == "none" and summary["n_predicted"] >= 8
    assert summary.get("schedule_note") is None
    note = ending_note(window.store.messages(window.controller.chat_id)[-1])
    assert note and not any(word in note.lower() for word in DRAFT_WORDS), note
    assert "nothing to propose" not in visible_text(window)
    shot(window, "60-5-no-drafter-stats")


def test_a_llama_server_draft_slower_than_plain_says_why_with_its_counts(qtbot, data_dir, tiny_paths):
    from tests.engine.test_llama_server import _require_server
    from tests.ui.test_gui_engines import choose, press_load

    _require_server()
    main = tiny_paths["llama-f32"]
    window = open_window(qtbot)
    add_models(qtbot, window, [main, tiny_paths["llama-other"]])
    assert window.picker.select_main(str(main))
    choose(window, LLAMA_SERVER, "none")
    press_load(qtbot, window)
    assert window.loaded_facts is not None, window.picker.state_label.text()
    greedy = GenSettings(temperature=0.0, max_tokens=48)
    plain = send(qtbot, window, PROMPT, greedy)
    assert plain["drafter"] == "llama-server none" and plain.get("schedule_note") is None
    note = ending_note(window.store.messages(window.controller.chat_id)[-1])
    assert not any(word in note.lower() for word in DRAFT_WORDS), note
    # llama-server's plain reply is this model's plain speed, as our loop's is.
    assert window.controller.reference_tps(str(main)) == plain["decode_tps"]

    choose(window, LLAMA_SERVER, "draft-simple")
    assert window.picker.draft_choice() == (MODEL, str(tiny_paths["llama-other"]))
    press_load(qtbot, window)
    assert window.loaded_facts is not None, window.picker.state_label.text()
    # Tiny models decode at thousands of tokens a second, drafted or not: a plain speed this
    # reply cannot reach stands in for a real pair's (13.8 tok/s drafted against ~21 plain).
    window.settings.setValue(_reference_key(str(main)), plain["decode_tps"] * 50)
    drafted = send(qtbot, window, PROMPT, greedy)
    assert drafted["drafter"] == "llama-server draft-simple" and drafted["n_drafted"] > 0
    note = drafted["schedule_note"]
    assert note.startswith(f"llama-server drafted {drafted['n_drafted']} tokens, accepted {drafted['n_accepted']} (")
    assert "so drafting was slower" in note and f"{drafted['decode_tps']:.1f} tok/s against" in note
    assert note in visible_text(window).replace("\u2028", "\n")
    assert window.why.words.text().startswith("llama-server drafted")  # beside the charts too
    shot(window, "60-6-llama-server-slow-draft")


def test_the_slow_draft_note_reads_llama_servers_counts():
    # The reply: 13.8 tok/s with draft-simple against ~21 plain.
    note = server_draft_note("llama-server draft-simple", predicted=256, drafted=240, accepted=72, steps=60,
                             tps=13.8, plain_tps=21.0)
    assert note == ("llama-server drafted 240 tokens, accepted 72 (30%): a verify step gave 2.2 tokens (1.2 "
                    "accepted + 1 of the main model's) and took as long as 4.4 plain ones (13.8 tok/s against "
                    "this model's 21.0 plain), so drafting was slower; it pays only where a step gives more "
                    "tokens than it costs")
    assert server_draft_note("llama-server draft-simple", 256, 240, 200, 60, 25.0, 21.0) is None  # it paid
    assert server_draft_note("llama-server draft-simple", 256, 240, 72, 60, 13.8, None) is None  # no plain known
    assert server_draft_note("llama-server none", 256, 0, 0, 0, 13.8, 21.0) is None
    assert "drafted nothing" in server_draft_note("llama-server ngram-mod", 64, 0, 0, 0, 20.0, 21.0)
