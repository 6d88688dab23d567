"""llama-server's draft-* types draft token by token only (llama.cpp's
common_speculative_are_compatible): the Model tab offers only the drafts it can use, the best
first, greys the others with llama.cpp's reason, and says before anything starts where there is
none; the command line, serve and Compare refuse such a pair in one line (issue 60 item 2)."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.engine.errors import IncompatibleDraftError
from app.engine.llama_server.drafts import TOKEN_BY_TOKEN
from app.ui.models.pair_picker import PATH_ROLE
from app.worker.requests import HERE, LLAMA_SERVER, MODEL
from tests.engine.test_llama_server import _run
from tests.gui_support import add_models, open_window, shot


def shown_drafts(picker) -> list[tuple[str, bool, str, str]]:
    """(text, enabled, tooltip, path) of the draft rows the list shows."""
    combo, model = picker.draft_combo, picker.draft_combo.model()
    return [(model.item(r).text(), model.item(r).isEnabled(), model.item(r).toolTip(), model.item(r).data(PATH_ROLE))
            for r in range(combo.count()) if not combo.view().isRowHidden(r)]


def show_draft_box(picker) -> None:
    """Scroll the Model tab to the Draft box (below the fold at 1440x900) for a screenshot."""
    from PySide6.QtWidgets import QScrollArea

    area = picker.parentWidget()
    while area is not None and not isinstance(area, QScrollArea):
        area = area.parentWidget()
    if area is not None:
        area.ensureWidgetVisible(picker.draft_box)


def test_draft_simple_offers_only_same_vocabulary_drafts_best_first(qtbot, data_dir, tiny_paths):
    main, smaller, same_size, other_family, other_vocab = (
        tiny_paths[n] for n in ("llama-f32", "llama-other", "llama-q8", "qwen2-f32", "llama-b"))
    window = open_window(qtbot)
    add_models(qtbot, window, [other_vocab, other_family, main, same_size, smaller])
    picker = window.picker
    assert picker.select_main(str(main))
    here = {path: enabled for _, enabled, _, path in shown_drafts(picker)}
    assert here[str(other_vocab)] is True  # Specula's own loop drafts with it through text
    kept = picker.draft_choice()

    picker.engine.set_runs_on(LLAMA_SERVER)
    picker.engine.set_spec_type("draft-simple")
    rows = shown_drafts(picker)
    enabled = [path for _, on, _, path in rows if on]
    # Only the same vocabulary: the same family's smaller model first, then its own family; the
    # chosen draft is the first.
    assert enabled == [str(smaller), str(same_size), str(other_family)]
    assert picker.draft_choice() == (MODEL, str(smaller))
    greyed = {path: (text, tip) for text, on, tip, path in rows if not on}
    assert str(other_vocab) in greyed and "SmolLM2" in " ".join(t for t, _ in greyed.values())
    text, tip = greyed[str(other_vocab)]
    assert "not for llama-server" in text
    assert TOKEN_BY_TOKEN in tip and "token text differs at id" in tip and "through text" in tip
    assert not picker.select_draft(MODEL, str(other_vocab))  # greyed: it cannot be chosen
    assert f"3 of {len(rows)} models here share the main model's vocabulary" in picker.draft_facts.text()
    assert picker.load_button.isEnabled() and picker.problem() is None
    assert picker.spec().draft_path == str(smaller)
    show_draft_box(picker)
    shot(window, "60-2-llama-server-draft-list")
    picker.draft_combo.showPopup()
    qtbot.wait(50)
    popup = picker.draft_combo.view().window()
    if popup.isVisible():
        shot(popup, "60-2-llama-server-draft-popup")
    picker.draft_combo.hidePopup()

    picker.engine.set_runs_on(HERE)  # the user's own choice returns with Specula's loop
    assert picker.draft_choice() == kept
    assert {path: on for _, on, _, path in shown_drafts(picker)}[str(other_vocab)] is True

    # Compare's fastest row on llama-server with that draft is refused with llama.cpp's reason.
    from app.compare.results import LLAMA_SERVER as SERVER_ROW

    why = picker.apply(str(main), SERVER_ROW, str(other_vocab), server_types="draft-simple")
    assert why.startswith(f"{other_vocab.name} cannot be llama-server's draft") and TOKEN_BY_TOKEN in why


def test_with_no_draft_llama_server_can_use_load_is_off_and_says_why(qtbot, data_dir, tiny_paths):
    window = open_window(qtbot)
    add_models(qtbot, window, [tiny_paths["llama-b"], tiny_paths["llama-f32"]])
    picker = window.picker
    assert picker.select_main(str(tiny_paths["llama-b"]))
    picker.engine.set_runs_on(LLAMA_SERVER)
    picker.engine.set_spec_type("draft-simple")
    assert not any(on for _, on, _, _ in shown_drafts(picker))
    assert picker.draft_choice()[0] != MODEL and picker.draft_combo.currentIndex() == -1
    assert not picker.load_button.isEnabled()
    window.controller.busyChanged.emit(True)  # a reply starts and ends: Load stays off
    window.controller.busyChanged.emit(False)
    assert not picker.load_button.isEnabled()
    said = picker.draft_facts.text()
    assert "No model in the library drafts token by token for" in said and "ngram-*" in said
    assert picker.problem().startswith("No model in the library drafts token by token")
    show_draft_box(picker)
    shot(window, "60-2-llama-server-no-draft")
    picker.engine.set_spec_type("ngram-mod")  # drafts without a draft model: Load is back
    assert picker.load_button.isEnabled()


def test_run_and_compare_refuse_another_vocabulary_on_llama_server_in_one_line(capsys, tiny_paths):
    main, draft = tiny_paths["llama-f32"], tiny_paths["llama-b"]
    code, out, err = _run(capsys, "run", "-m", str(main), "-md", str(draft), "--engine", "llama-server",
                          "-p", "hi", "-n", "4")
    assert code == 3 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert f"{draft.name} cannot draft for {main.name} on llama-server" in err and TOKEN_BY_TOKEN in err

    from app.compare.results import LLAMA_SERVER as SERVER_ROW
    from app.compare.runner import server_spec
    from app.engine.reply_engine import open_session

    request, config = _compare_row(main, draft, SERVER_ROW)
    with pytest.raises(IncompatibleDraftError) as caught:  # Compare's row, and serve's engine, open here
        open_session(server_spec(request, config))
    assert "\n" not in str(caught.value) and "token text differs at id" in str(caught.value)


def _compare_row(main: Path, draft: Path, kind: str):
    from app.compare.results import ConfigSpec
    from app.compare.results import CompareRequest

    config = ConfigSpec(name="llama-server draft-simple", drafter=kind, draft_path=str(draft),
                        server_types="draft-simple")
    return CompareRequest(main_path=str(main), drafts=(), prompts=()), config
