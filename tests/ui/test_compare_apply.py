"""From comparison to choice, in the window: a real comparison on tiny models (offscreen Qt, the
real engine on the comparison's worker thread), then "Use in chat" puts its fastest configuration
into the main window's pair picker and draft settings.

Set SPECULA_SHOTS=/some/folder to save more screenshots; /tmp/compare_apply.png is always written.
"""

from __future__ import annotations

import shutil
from dataclasses import replace

from PySide6.QtCore import Qt

from app.compare.fastest import fastest
from app.compare.results import MODEL, NONE
from app.ui.compare.choice import USE_TEXT
from tests.ui.test_compare_view import WAIT_MS, one_torch_thread, set_up, wait_done  # noqa: F401 (autouse fixture)
from tests.gui_support import add_models, open_window, shot  # noqa: F401

def compared(qtbot, tiny_paths):
    """The main window with two tiny models, its Compare window after a finished real run."""
    main_window = open_window(qtbot)
    add_models(qtbot, main_window, [tiny_paths["llama-f32"], tiny_paths["llama-other"]])
    main_window.open_compare()
    window = main_window.compare_window
    set_up(window, tiny_paths)
    window.setup.sweep.setChecked(True)
    window.setup.sweep_lengths.setText("4")
    qtbot.mouseClick(window.setup.run_button, Qt.MouseButton.LeftButton)
    assert not window.fastest_row.button.isEnabled()  # not while it runs
    wait_done(qtbot, window)
    return main_window, window


def use_in_chat(qtbot, window) -> None:
    assert window.fastest_row.isVisible() and window.fastest_row.button.text() == USE_TEXT
    assert window.fastest_row.button.isEnabled()
    qtbot.mouseClick(window.fastest_row.button, Qt.MouseButton.LeftButton)


def slowed(run, configs: set[str], factor: float = 50.0):
    """The run with these configurations' decoding times multiplied (the same tokens)."""
    return replace(run, results=tuple(replace(r, summary=replace(r.summary, decode_s=r.summary.decode_s * factor)) if r.config in configs else r
                                      for r in run.results))


def test_use_in_chat_applies_the_fastest_to_the_pair_picker(qtbot, data_dir, tiny_paths):
    main_window, window = compared(qtbot, tiny_paths)
    choice = fastest(window.run)
    assert choice is not None and choice.short().lower() in window.fastest_row.label.full_text().lower()
    assert choice.describe().lower() in window.details_label.text().lower()
    assert "specula run -m " in window.fastest_row.label.toolTip()
    main_window.models_tabs.setCurrentIndex(1)  # the Library tab: the button brings the picker back
    use_in_chat(qtbot, window)

    picker, settings = main_window.picker, main_window.gen_form.settings()
    assert picker.main_path() == str(tiny_paths["llama-f32"]) == choice.main_path
    assert picker.draft_choice() == (choice.drafter, choice.draft_path)
    if choice.pays_off:
        assert (settings.draft_max, settings.adaptive_draft) == (4, False)
    assert main_window.models_tabs.currentIndex() == 0
    status = main_window.statusBar().currentMessage()
    assert status.startswith("From the comparison") and "press Load" in status
    shot(main_window, "compare-apply-window")
    shot(window, "compare-apply-view")


def test_no_draft_wins_and_a_draft_missing_from_the_library_is_added(qtbot, data_dir, tiny_paths, tmp_path):
    main_window, window = compared(qtbot, tiny_paths)
    run = window.run
    drafters = {c.name for c in run.configs if c.drafter != NONE}
    window.set_run(slowed(run, drafters))  # every drafter slower than plain decoding
    assert fastest(window.run).drafter == NONE
    assert window.fastest_row.label.full_text().startswith("No clear winner: plain decoding")
    use_in_chat(qtbot, window)
    assert main_window.picker.draft_choice() == (NONE, None)
    assert "no drafter was clearly faster" in main_window.statusBar().currentMessage()

    # A draft the library does not list (as a hub file the comparison downloaded): added, then applied.
    # (Another file than the library's draft: a byte copy of it would be that entry, listed once.)
    other = shutil.copy(tiny_paths["llama-notemplate"], tmp_path / "downloaded-draft.gguf")
    model = next(c for c in run.configs if c.drafter == MODEL)
    configs = tuple(replace(c, draft_path=str(other)) if c == model else c for c in run.configs)
    accepting = tuple(replace(r, summary=replace(r.summary, n_accepted=max(r.summary.n_accepted, 1))) if r.config == model.name else r
                      for r in run.results)  # a random tiny draft accepts nothing: never a winner
    window.set_run(slowed(replace(run, configs=configs, results=accepting), ({NONE} | drafters) - {model.name}))
    assert fastest(window.run).draft_path == str(other)
    use_in_chat(qtbot, window)
    qtbot.waitUntil(lambda: main_window.picker.draft_choice() == (MODEL, str(other)), timeout=WAIT_MS)
    assert str(other) in {e.path for e in main_window.library.entries()}
    assert "draft max 4 (fixed)" in main_window.statusBar().currentMessage()

    gone = replace(window.run, configs=tuple(replace(c, draft_path=str(tmp_path / "gone.gguf"))
                                             if c.drafter == MODEL else c for c in window.run.configs))
    window.set_run(gone)
    use_in_chat(qtbot, window)
    assert "gone.gguf is no longer there" in main_window.statusBar().currentMessage()


def test_the_status_line_names_each_kind_of_winner():
    from app.compare.fastest import Fastest
    from app.ui.compare.choice import applied_text

    cache = Fastest("lookup+ngram-cache", "/m/main.gguf", "lookup+ngram-cache", None, 16, True, 0, 0.75, 1.5)
    assert "main with prompt lookup + n-gram cache, draft max 16 — press Load" in applied_text(cache, "main", None)
    lookup = Fastest("lookup k=8", "/m/main.gguf", "lookup", None, 8, False, 0, 0.75, 1.3)
    assert "main with prompt lookup, draft max 8 (fixed)" in applied_text(lookup, "main", None)
    model = Fastest("draft", "/m/main.gguf", MODEL, "/m/small draft.gguf", 16, True, 0, 0.75, 1.2)
    assert "main with Small, draft max 16" in applied_text(model, "main", "Small")
    assert "main with small draft, draft max 16" in applied_text(model, "main", None)


def test_use_in_chat_applies_a_winner_on_another_engine_to_where_it_runs(qtbot, data_dir, tiny_paths):
    """A comparison won by llama.cpp's own ngram-mod (or a server at a URL) puts the Model tab on
    that engine with that type: the chat then runs what won."""
    from app.compare.fastest import Fastest
    from app.compare.results import LLAMA_SERVER, SERVER_URL
    from app.worker.requests import AT_URL, HERE, LLAMA_SERVER as RUNS_ON_LLAMA_SERVER

    main_window = open_window(qtbot)
    add_models(qtbot, main_window, [tiny_paths["llama-f32"]])
    main = str(tiny_paths["llama-f32"])
    before = main_window.gen_form.settings()
    won = Fastest("llama-server ngram-mod", main, LLAMA_SERVER, None, 64, True, 0, 0.75, 1.4, server_types="ngram-mod")
    main_window.use_compare_choice(won)
    engine = main_window.picker.engine
    assert (engine.runs_on(), engine.spec_type_value()) == (RUNS_ON_LLAMA_SERVER, "ngram-mod")
    assert main_window.picker.main_path() == main and main_window.gen_form.settings() == before
    assert "on llama-server, --spec-type ngram-mod — press Load" in main_window.statusBar().currentMessage()
    both = replace(won, server_types="ngram-mod,ngram-simple")
    main_window.use_compare_choice(both)
    assert "runs one llama.cpp type at a time: ngram-mod is chosen" in main_window.statusBar().currentMessage()
    remote = Fastest("server h:1", main, SERVER_URL, None, 64, True, 0, 0.75, 1.2, server_url="http://127.0.0.1:9")
    main_window.use_compare_choice(remote)
    assert (engine.runs_on(), engine.server_url()) == (AT_URL, "http://127.0.0.1:9")
    ours = Fastest("lookup", main, "lookup", None, 64, True, 0, 0.75, 1.3)
    main_window.use_compare_choice(ours)
    assert engine.runs_on() == HERE and main_window.picker.draft_choice() == ("lookup", None)
