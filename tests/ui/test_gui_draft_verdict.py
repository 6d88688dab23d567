"""Discover's draft verdict is one colour per verdict (works and pays / works but will not pay /
does not work), says text-level where it is, is judged against the main model the user chose
(named as the library names it) and priced by the steps measured here; "Find a draft for it" on a
model's page lists the hub models that can draft for it; downloaded models are named by repository
and quantization; a file identical to a built-in model shows that it is already here.

The fake hub of tests/hf_server.py (real HTTP, real GGUF files) and the real built-in SmolLM2;
offscreen Qt. SPECULA_SHOTS saves screenshots.
"""

from __future__ import annotations

import html
import os

import pytest

from app.engine.drafting.compat import check_draft
from app.engine.gguf.info import read_gguf_info
from app.hub.builtin import builtin_path, is_installed
from app.hub.library import list_local_models
from app.ui.discover.text import BAD, GOOD, WARN, draft_html
from tests.hf_server import (BIG_FILE, REPO_BIG, REPO_FOREIGN, REPO_GATED, REPO_MID, REPO_SMALL, fake_hub, hub,  # noqa: F401
                             hub_files)
from tests.gui_support import shot
from tests.ui.test_gui_discover import WAIT_MS, browse, panel, pick_file, pick_repo  # noqa: F401 (panel: a fixture)

MAIN_TITLE = "specula-test/Tiny-Llama-4L-GGUF (F32)"  # what the library calls the main model
SMOL = "SmolLM2 135M Instruct (Q4_1)"
REPO_SMOL = "specula-test/SmolLM2-135M-Instruct-GGUF"


def verdict_line(details: str) -> str:
    return next(line for line in details.split("<br>") if line.startswith("As a draft"))


def test_each_draft_verdict_has_its_own_colour(qtbot, panel, hub_files, tmp_path):
    main = read_gguf_info(hub_files["big"])
    panel.set_main_model(main, MAIN_TITLE)
    pays = verdict_line(browse(qtbot, panel, REPO_SMALL, "Tiny-Llama-1L-F32.gguf"))
    assert panel.chooser.combo.currentText() == MAIN_TITLE and main.name not in pays  # as the library names it
    assert pays.startswith("As a draft: ") and f"color:{GOOD}'>✓ drafts token by token (same vocabulary)" in pays

    pick_repo(qtbot, panel, REPO_FOREIGN)
    text_level = verdict_line(pick_file(qtbot, panel, "Tiny-Llama-Foreign-F16.gguf"))
    assert f"color:{GOOD}'>✓ text-level draft" in text_level and "re-tokenized" in text_level
    shot(panel, "draft-verdict-text-level")

    pick_repo(qtbot, panel, REPO_BIG)  # the main model itself
    itself = verdict_line(pick_file(qtbot, panel, BIG_FILE))
    assert f"color:{WARN}'>! works, but will not pay: it is the same model" in itself
    shot(panel, "draft-verdict-itself")

    panel.set_main_model(read_gguf_info(hub_files["small"]), "specula-test/Tiny-Llama-1L-GGUF (F32)")
    pick_repo(qtbot, panel, REPO_MID)  # bigger than this main model: it drafts, but cannot pay
    too_big = verdict_line(pick_file(qtbot, panel, "Tiny-Llama-2L-F32.gguf"))
    assert f"color:{WARN}'>! works (same vocabulary), but will not pay: " in too_big and "% of its size" in too_big
    shot(panel, "draft-verdict-too-big")

    from tests.header_gguf import make_tokens, write_gguf
    from tests.tiny_gguf import VOCAB_SIZE

    wordpiece = read_gguf_info(write_gguf(tmp_path / "wp.gguf", tokens=make_tokens(VOCAB_SIZE, "wp"), vocab_type="bert"))
    fails = draft_html(check_draft(main, wordpiece), wordpiece, main)
    assert f"color:{BAD}'>✗ cannot draft: vocabulary types differ" in fails


def library(hub_files, *names: str) -> list:
    """Library entries for the fake hub's files, titled as the library would title them."""
    from app.hub.library_entries import FILE, entry_for_file

    return [entry_for_file(hub_files[name], FILE, f"{name} (F32)") for name in names]


def settle(qtbot, panel, words: str) -> str:
    qtbot.waitUntil(lambda: words in panel.details.text() and "weighing" not in panel.details.text(), timeout=WAIT_MS)
    return verdict_line(panel.details.text())


def test_drafts_are_judged_against_the_main_model_the_user_chose(qtbot, panel, hub_files):
    """Issue 60 item 4: fetching a 0.5B for a 1.5B, the verdict was against the demo model the chat
    happened to show. The main model is the user's choice; without one, the largest they have."""
    panel.set_library(library(hub_files, "small", "mid", "big"))
    assert panel.chooser.combo.currentText() == "big (F32)"  # nothing loaded in the chat: the largest
    details = browse(qtbot, panel, REPO_MID, "Tiny-Llama-2L-F32.gguf")
    assert "✓ drafts token by token (same vocabulary), 13% of its size" in verdict_line(details)

    small = read_gguf_info(hub_files["small"])
    panel.set_main_model(small, "small (F32)")  # the chat loads another main model: judged against it
    assert panel.chooser.combo.currentText() == "small (F32)"
    assert "it is the bigger model: rather find a draft for it" in settle(qtbot, panel, "323% of its size")

    panel.chooser.combo.setCurrentIndex(panel.chooser.combo.findText("big (F32)"))  # the user picks
    assert "✓ drafts token by token" in settle(qtbot, panel, "13% of its size")
    panel.set_main_model(small, "small (F32)")  # the chat's model again, unchanged: the pick stands
    assert panel.chooser.combo.currentText() == "big (F32)"
    panel.set_main_model(read_gguf_info(hub_files["mid"]), "mid (F32)")  # the chat moves on: followed
    assert "it is the same model" in settle(qtbot, panel, "will not pay")
    shot(panel, "60-4-judged-against-the-chat-main")


def test_a_draft_verdict_says_what_the_steps_measured_here_predict(qtbot, panel, hub_files):
    from tests.hub.test_hub_draft_price import measure_here
    from app.hub.draft_price import price_draft
    from app.hub.draft_verdict import draft_verdict

    measure_here(hub_files["big"])  # as loading it in the chat once does
    main = read_gguf_info(hub_files["big"])
    panel.set_library(library(hub_files, "big"))
    verdict = verdict_line(browse(qtbot, panel, REPO_SMALL, "Tiny-Llama-1L-F32.gguf"))
    draft = panel._facts.info  # the header as read over HTTP
    expected = draft_verdict(check_draft(main, draft), draft, main, local=False,
                             price=price_draft(main, hub_files["big"], draft))
    assert html.escape(expected.text) in verdict
    assert "a drafted token costs about" in verdict and "x a main-model token here (by its size" in verdict
    shot(panel, "60-4-priced-by-measured-steps")


def test_find_a_draft_for_a_model_on_its_page(qtbot, panel, hub_files):
    """Issue 60 item 4: "a draft for this model" on a main model's page lists only hub models that
    can draft for it, as LM Studio's draft list does, and judges drafts against that model."""
    from tests.ui.test_gui_discover import repo_ids

    browse(qtbot, panel, REPO_BIG, BIG_FILE)
    with qtbot.waitSignal(panel.calls.finished, timeout=WAIT_MS, check_params_cb=lambda c, *_: c == "drafts"):
        panel.draft_button.click()
    assert panel.chooser.combo.currentText() == f"{MAIN_TITLE} (on the hub)"
    found = repo_ids(panel)
    assert found[:2] == [REPO_MID, REPO_SMALL] and REPO_BIG not in found and REPO_GATED not in found
    assert f"Drafts for {MAIN_TITLE}: " in panel.status.text() and "“tiny-llama”" in panel.status.text()
    assert "can draft for" in panel.repos.topLevelItem(0).toolTip(0)
    shot(panel, "60-4-drafts-for-this-model")
    pick_repo(qtbot, panel, REPO_SMALL)
    assert "✓ drafts token by token (same vocabulary), 4% of its size" in verdict_line(
        pick_file(qtbot, panel, "Tiny-Llama-1L-F32.gguf"))


def test_a_download_is_named_by_its_repository_and_quantization(hub):
    from app.hub.download import download_gguf
    from app.hub.library_entries import scan_library

    download_gguf(REPO_MID, "Tiny-Llama-2L-Q8_0.gguf")
    download_gguf(REPO_MID, "Tiny-Llama-2L-F32.gguf")
    names = sorted(m.name for m in list_local_models(include_builtin=False))
    assert names == [f"{REPO_MID} (F32)", f"{REPO_MID} (Q8_0)"]
    titles = sorted(e.title for e in scan_library([], [], builtins=False))
    assert titles == names  # the library, the chat's lists and Compare show these


@pytest.fixture
def smol_copy(tmp_path):
    """The built-in SmolLM2 again, as another file (a hard link: the same bytes, another path)."""
    if not is_installed("smollm2-135m"):
        pytest.skip("the built-in SmolLM2 is not installed (the demo extra)")
    folder = tmp_path / "downloads"
    folder.mkdir()
    copy = folder / "SmolLM2-135M-Instruct-Q4_1.gguf"
    os.link(builtin_path("smollm2-135m"), copy)
    return copy


def test_a_copy_of_a_builtin_model_says_it_is_already_here(qtbot, panel, hub, fake_hub, smol_copy):
    from app.hub.library_entries import scan_library
    from app.ui.models.library_panel import row_texts

    # Issue 52 item 5: the same file is one entry, the built-in's, which names the copy.
    [listed] = [m for m in list_local_models([smol_copy.parent]) if smol_copy in [c.path for c in m.copies]]
    assert (listed.name, listed.source) == (SMOL, "builtin")
    [entry] = [e for e in scan_library([], [str(smol_copy.parent)]) if str(smol_copy) in e.copies]
    assert entry.title == SMOL and row_texts(entry)[1] == "built-in"

    fake_hub.add_repo(REPO_SMOL, {smol_copy.name: smol_copy})
    try:
        details = browse(qtbot, panel, REPO_SMOL, smol_copy.name, query="SmolLM2")
        assert f"✓ already here: the built-in {SMOL} is this model" in details
        assert panel._file_item(smol_copy.name).text(2) == "built-in"
        # Issue 52 item 5: nothing to download, so no Download (a second copy was a second entry).
        assert panel.download_note.text() == "no need to download it"  # the facts above say why
        assert panel.download_button.text() == "Already here" and not panel.download_button.isEnabled()
        shot(panel, "discover-already-here")
    finally:
        del fake_hub.repos[REPO_SMOL]


def test_a_file_is_named_by_its_file_name_never_its_general_name(tiny_paths):
    from app.compare.choices import resolve_draft
    from app.hub.library_entries import FILE, entry_for_file

    entry = entry_for_file(tiny_paths["llama-other"], FILE)
    assert entry.title == "llama-other" and entry.info.name == "tiny-llama-F32-seed1"
    assert resolve_draft(str(tiny_paths["llama-other"])).label == "llama-other"  # `specula compare` alike
