"""Draft marks on rendered Markdown, the streaming reply's spans, and the plain request types."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from PySide6.QtGui import QTextDocument

from app.engine.events import Origin, StepEvent
from app.ui.chat.controller import StreamingReply
from app.ui.chat.conversation import ConversationView
from app.ui.chat.render import align, rendered_runs
from app.worker.requests import GenSettings, PairChoice
from tests.gui_support import marked_chars  # noqa: F401


def rendered(markdown: str) -> str:
    doc = QTextDocument()
    doc.setMarkdown(markdown)
    return doc.toRawText()


def marked_text(markdown: str, spans) -> str:
    shown = rendered(markdown)
    return "|".join(shown[a:b] for a, b in rendered_runs(markdown, shown, spans))


@pytest.mark.parametrize("markdown, spans, expected", [
    ("Some **bold** words", [(5, 13)], "bold"),  # the asterisks are not shown, the word is marked
    ("a &amp; b", [(2, 7)], "&"),
    ("Text\n\n```python\ndef f(a):\n    return a\n```\n", [(16, 25)], "def f(a):"),
    ("- one\n- two\n", [(8, 11)], "two"),
    ("plain text", [], ""),
    ("x" * 10, [(0, 3), (7, 10)], "xxx|xxx"),
])
def test_marks_follow_the_source_into_rendered_markdown(qapp, markdown, spans, expected):
    assert marked_text(markdown, spans) == expected


def test_alignment_never_goes_backwards_and_skips_unknown_characters():
    mapping = align("ab\n\ncd", "ab\u2029\ufdd0cd")
    assert mapping == [0, 1, 2, None, 4, 5]
    assert align("abc", "xyz") == [None, None, None]


@dataclass
class Row:
    id: int
    role: str
    content: str
    draft_spans: tuple
    stats: dict | None
    complete: bool


def test_conversation_marks_exactly_the_draft_text(qapp):
    view = ConversationView()
    reply = "The **answer** is `forty two`."
    view.set_messages([Row(1, "user", "What is it?", (), None, True),
                       Row(2, "assistant", reply, ((4, 14), (19, 28)), {"decode_tps": 10.0}, True)])
    # "answer" (6) and "forty two" (9) are marked; the Markdown syntax around them is not shown.
    assert marked_chars(view) == 15
    assert "The answer is forty two." in view.document().toPlainText()
    view.set_mark_drafts(False)
    assert marked_chars(view) == 0


def test_long_code_lines_wrap_inside_the_view_and_stay_code(qtbot):
    """Issue 60 item 12: a long code line wraps at the view's edge; no horizontal scrolling."""
    view = ConversationView()
    qtbot.addWidget(view)
    view.resize(500, 400)
    view.show()
    line = "result = compute(" + ", ".join(f"argument_{i}" for i in range(40)) + ")"
    view.set_messages([Row(1, "assistant", f"Here:\n\n```python\n{line}\n```\n", (), None, True)])
    qtbot.waitUntil(lambda: view.isVisible())
    assert view.horizontalScrollBar().maximum() == 0
    block = view.document().find(line).block()
    assert block.isValid() and block.layout().lineCount() > 1  # wrapped, all of it there
    assert block.charFormat().fontFixedPitch() or block.begin().fragment().charFormat().fontFixedPitch()


def test_streaming_view_shows_partial_markdown(qapp):
    view = ConversationView()
    view.set_messages([Row(1, "user", "Hi", (), None, True), Row(2, "assistant", "", (), None, False)],
                      streaming_id=2)
    assert view.streamed_text() == ""
    view.update_stream("Here:\n\n```\ncode", [(0, 4)])  # an unclosed fence renders as code
    assert view.streamed_text() == "Here:\u2029code"
    assert "generating…" in view.document().toPlainText()
    assert marked_chars(view) == 4


def step(text: str, draft_chars: int) -> StepEvent:
    return StepEvent((1,), (Origin.MAIN,), text, draft_chars, 0, 0, 0.0, 0.0, 0.0)


def test_streaming_reply_merges_adjacent_draft_spans():
    reply = StreamingReply(chat_id=1, message_id=2)
    for text, n in [("Hel", 0), ("lo wo", 3), ("rld", 3), ("!", 0), ("ab", 5)]:
        reply.add(step(text, n))
    assert reply.text == "Hello world!ab"
    # "lo " then "rld" continue each other only when adjacent: "lo " ends at 6, "rld" starts at 8.
    assert reply.spans == [[3, 6], [8, 11], [12, 14]]


def test_gen_settings_survive_junk_from_a_settings_file():
    settings = GenSettings.from_dict({"temperature": "0.3", "top_k": "x", "unknown": 1, "seed": 5.0})
    assert settings.temperature == 0.3 and settings.top_k == 40 and settings.seed == 5
    assert GenSettings.from_dict(None) == GenSettings()
    assert GenSettings.from_dict(settings.to_dict()) == settings
    assert GenSettings.from_dict({"adaptive_draft": "false"}).adaptive_draft is False


def test_pair_spec_refuses_nonsense():
    with pytest.raises(ValueError):
        PairChoice("main.gguf", "model")
    with pytest.raises(ValueError):
        PairChoice("main.gguf", "ngram")


def test_dark_palette_gets_dark_colours_and_keeps_the_marks(qapp):
    from PySide6.QtGui import QColor, QPalette

    view = ConversationView()
    view.set_messages([Row(1, "assistant", "draft text here", ((0, 5),), None, True)])
    light = view.theme
    palette = view.palette()
    palette.setColor(QPalette.ColorRole.Base, QColor("#1e1e1e"))
    palette.setColor(QPalette.ColorRole.Text, QColor("#e5e5e5"))
    view.setPalette(palette)
    assert view.theme.draft != light.draft and view.theme.draft.lightness() < 128
    assert marked_chars(view) == 5  # re-rendered with the dark highlight


def test_html_in_a_reply_is_shown_as_text(qapp):
    view = ConversationView()
    view.set_messages([Row(1, "assistant", "Use #include <stdio.h> and <b>this</b>.", (), None, True)])
    assert "#include <stdio.h> and <b>this</b>." in view.document().toPlainText()


def test_library_scan_lists_a_folder_once_and_explains_unusable_files(data_dir, tmp_path, tiny_paths):
    import shutil

    from app.hub.library_entries import scan_library

    (tmp_path / "models" / "sub").mkdir(parents=True)
    shutil.copy(tiny_paths["llama-q8"], tmp_path / "models" / "sub" / "a.gguf")
    (tmp_path / "models" / "notes.txt").write_text("not a model")
    (tmp_path / "models" / "bad.gguf").write_bytes(b"nope")
    direct = tmp_path / "models" / "sub" / "a.gguf"
    entries = scan_library([str(direct)], [str(tmp_path / "models"), str(tmp_path / "gone")], builtins=False)
    assert [(e.path, e.source, e.usable) for e in entries] == [
        (str(tmp_path / "models" / "bad.gguf"), "folder", False),
        (str(direct), "folder", True),  # also added as a file: listed once
        (str(tmp_path / "gone"), "folder", False),
    ]
    assert "not a GGUF file" in entries[0].error and entries[2].error.endswith("folder not found")
    assert entries[1].facts().startswith("llama · 146K params · Q8_0 · context 512 tokens · vocabulary 559")


def test_the_windows_saved_gen_settings_from_before_issue_49_load_into_the_form(qtbot, data_dir):
    """gen/settings as the window saved it before GenSettings moved to the engine
    (tests/data/gen_settings_v1.json): the form shows it and saves it back unchanged."""
    import json
    from pathlib import Path

    from app.ui.common.paths import open_settings
    from tests.gui_support import open_window, shot

    saved = (Path(__file__).resolve().parents[1] / "data" / "gen_settings_v1.json").read_text()
    settings = open_settings()
    settings.setValue("gen/settings", saved)
    settings.sync()
    window = open_window(qtbot)
    assert window.gen_form.settings() == GenSettings.from_dict(json.loads(saved))
    assert window.gen_form.settings().temperature == 0.3 and window.gen_form.settings().adaptive_draft is False
    shot(window.gen_form, "gen-settings-v1-loaded")
    window.save_settings()
    assert json.loads(open_settings().value("gen/settings")) == json.loads(saved)
