"""The Models area of the real window: library, pair picker (compatible drafts only), offload,
loading with progress and cancel, and bad files refused with a message, never a crash."""

from __future__ import annotations

import shutil
from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFileDialog

from app.engine.gguf.format import format_bytes
from app.hub.builtin import builtin_path
from app.worker.requests import LOOKUP, MODEL, NONE
from tests.gui_support import GREEDY_FIXED, add_models, load_pair, open_window, send, shot
from tests.worker.test_worker import foreign_vocab_path  # noqa: F401


def item_for(picker_items, title_start: str):
    found = [item for item in picker_items if item[0].startswith(title_start)]
    assert found, f"no draft choice starts with {title_start!r}: {[i[0] for i in picker_items]}"
    return found[0]


def wordpiece_vocab_path(folder: Path) -> Path:
    """A header-only GGUF with a WordPiece (bert) vocabulary: no tokenizer we can build, so it
    can draft for nothing, not even through text."""
    from tests.header_gguf import make_tokens, write_gguf
    from tests.tiny_gguf import VOCAB_SIZE

    return write_gguf(folder / "wordpiece-vocab.gguf", tokens=make_tokens(VOCAB_SIZE, "wp"), vocab_type="bert")


def test_draft_list_offers_same_and_text_level_drafts_and_greys_the_rest(qtbot, data_dir, tiny_paths,
                                                                          foreign_vocab_path, tmp_path):
    window = open_window(qtbot)
    wordpiece = wordpiece_vocab_path(tmp_path)
    add_models(qtbot, window, [tiny_paths["llama-f32"], tiny_paths["llama-q8"], tiny_paths["qwen2-f32"],
                               foreign_vocab_path, wordpiece])
    assert window.picker.select_main(str(tiny_paths["llama-f32"]))
    items = window.picker.draft_items()
    # (text, enabled, tooltip)
    assert items[0][:2] == ("None (plain decoding)", True)
    assert items[1][:2] == ("Prompt lookup (no draft model)", True)
    assert item_for(items, "llama-q8")[1] is True
    assert item_for(items, "qwen2-f32")[1] is True  # same vocabulary: compatible
    # Another vocabulary (one token's text differs; SmolLM2's is another altogether): offered,
    # marked text-level, the tooltip saying why and what it costs.
    foreign = item_for(items, "foreign-vocab")
    assert foreign[1] is True and foreign[0].endswith("text-level (other vocabulary)")
    assert "token text differs at id 300" in foreign[2] and "costs more" in foreign[2]
    smollm = item_for(items, "SmolLM2 135M Instruct")
    assert smollm[1] is True and "text-level" in smollm[0] and "vocabulary sizes differ" in smollm[2]
    bert = item_for(items, "wordpiece-vocab")  # the file's name, not its general.name
    assert bert[1] is False and "incompatible" in bert[0] and "cannot re-tokenize drafts" in bert[0]
    assert "Cannot draft for llama-f32" in bert[2]
    # The main model itself is not offered as its own draft; a greyed one cannot be selected.
    assert not any(text.startswith("llama-f32") for text, _, _ in items)
    assert not window.picker.select_draft(MODEL, str(wordpiece))
    assert window.picker.select_draft(MODEL, str(foreign_vocab_path))
    window.picker.draft_combo.showPopup()
    qtbot.wait(50)
    popup = window.picker.draft_combo.view().window()
    if popup.isVisible():
        shot(popup, "06-draft-list")
    window.picker.draft_combo.hidePopup()

    # Switching the main model re-checks every draft against it.
    assert window.picker.select_main(str(builtin_path("smollm2-135m")))
    items = window.picker.draft_items()
    q8 = item_for(items, "llama-q8")
    assert q8[1] is True and "text-level" in q8[0]


def test_bad_files_are_refused_with_a_message(qtbot, data_dir, tiny_paths, tmp_path):
    garbage = tmp_path / "garbage.gguf"
    garbage.write_bytes(bytes(range(256)) * 64)
    truncated = tmp_path / "truncated.gguf"
    whole = tiny_paths["llama-f32"].read_bytes()
    truncated.write_bytes(whole[: len(whole) // 2])
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")

    window = open_window(qtbot)
    add_models(qtbot, window, [garbage, truncated, empty])
    entries = {e.path: e for e in window.library.entries()}
    assert entries[str(garbage)].error.startswith("garbage.gguf: not a GGUF file")
    assert "truncated GGUF file" in entries[str(truncated)].error
    assert "empty file" in entries[str(empty)].error
    assert window.statusBar().currentMessage().startswith("refused 3 files (details in the Library tab)")
    # Listed greyed in the library and in the main list, and never selectable.
    for path in (garbage, truncated, empty):
        assert not window.picker.select_main(str(path))
    main_items = window.picker.main_combo.model()
    greyed = [main_items.item(r).text() for r in range(main_items.rowCount()) if not main_items.item(r).isEnabled()]
    assert sum(text.endswith("— unusable") for text in greyed) == 3
    window.models_tabs.setCurrentWidget(window.library)
    window.library.tree.setCurrentItem(window.library.tree.topLevelItem(window.library.tree.topLevelItemCount() - 3))
    assert "not a GGUF file" in window.library.details.text()
    shot(window, "07-library-bad-files")


def test_a_file_broken_after_the_scan_fails_to_load_with_a_message(qtbot, data_dir, tiny_paths, tmp_path):
    model = tmp_path / "soon-broken.gguf"
    shutil.copy(tiny_paths["llama-f32"], model)
    window = open_window(qtbot)
    add_models(qtbot, window, [model])
    model.write_bytes(b"GGUF" + b"\0" * 64)  # replaced on disk after the library read it
    assert window.picker.select_main(str(model))
    qtbot.mouseClick(window.picker.load_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: window.picker.load_button.isEnabled(), timeout=60_000)
    assert window.loaded_facts is None
    assert "Not loaded: soon-broken.gguf" in window.picker.state_label.text()
    assert window.statusBar().currentMessage().startswith("soon-broken.gguf")
    shot(window, "08-load-failed")


def test_loading_shows_progress_and_can_be_cancelled(qtbot, data_dir, tiny_paths):
    window = open_window(qtbot)
    add_models(qtbot, window, [tiny_paths["qwen2-f32"]])
    picker = window.picker
    assert picker.select_main(str(tiny_paths["qwen2-f32"])) and picker.select_draft(NONE)
    stages: list[str] = []
    window.host.loadProgress.connect(picker.set_progress)  # (also wired by the window)
    picker.progress.valueChanged.connect(lambda _v: stages.append(picker.progress.toolTip()))  # the stage, whole
    qtbot.mouseClick(picker.load_button, Qt.MouseButton.LeftButton)
    assert picker.cancel_button.isEnabled() and not picker.load_button.isEnabled()
    qtbot.mouseClick(picker.cancel_button, Qt.MouseButton.LeftButton)  # before the load even starts
    qtbot.waitUntil(lambda: picker.load_button.isEnabled(), timeout=60_000)
    assert window.loaded_facts is None and "loading cancelled" in picker.state_label.text()

    qtbot.mouseClick(picker.load_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: window.loaded_facts is not None, timeout=60_000)
    assert any("reading weights" in stage for stage in stages)
    assert picker.progress.value() == picker.progress.maximum()


def test_offload_is_disabled_with_the_reason_without_a_gpu(qtbot, data_dir, tiny_paths):
    window = open_window(qtbot)
    offload = window.picker.main_offload
    qtbot.waitUntil(lambda: offload._devices is not None, timeout=60_000)
    assert window.picker.select_main(str(builtin_path("smollm2-135m")))
    if offload.has_gpu():
        assert offload.slider.isEnabled() and offload.value_label.text().startswith("all")
        assert "GPU:" in offload.detail.text() and "on the GPU" in offload.detail.text()
    else:
        assert not offload.slider.isEnabled() and offload.gpu_layers() == 0
        assert offload.value_label.text() == "CPU only"
        assert "no GPU" in offload.detail.text() and "Disabled: no GPU" in offload.slider.toolTip()
    assert "weights" in offload.detail.text() and "KV for 4,096 tokens" in offload.detail.text()
    # The draft's offload control appears only with a draft model.
    window.picker.select_draft(LOOKUP)
    assert not window.picker.draft_offload.isVisibleTo(window)


def test_library_remembers_added_files_and_double_click_picks_the_main(qtbot, data_dir, tiny_paths):
    window = open_window(qtbot)
    add_models(qtbot, window, [tiny_paths["qwen2-q8"]])
    window.close()
    again = open_window(qtbot)
    paths = [e.path for e in again.library.entries()]
    assert str(tiny_paths["qwen2-q8"]) in paths
    row = paths.index(str(tiny_paths["qwen2-q8"]))
    item = again.library.tree.topLevelItem(row)
    again.models_tabs.setCurrentWidget(again.library)
    again.library.tree.itemDoubleClicked.emit(item, 0)
    assert again.picker.main_path() == str(tiny_paths["qwen2-q8"])
    assert again.models_tabs.currentIndex() == 0


def test_save_chart_writes_a_png(qtbot, data_dir, tiny_paths, tmp_path, monkeypatch):
    window = open_window(qtbot)
    add_models(qtbot, window, [tiny_paths["llama-f32"]])
    load_pair(qtbot, window, tiny_paths["llama-f32"], LOOKUP)
    send(qtbot, window, "Hello")
    target = tmp_path / "chart.png"
    # The file dialog is the platform's; the test answers it.
    monkeypatch.setattr(QFileDialog, "getSaveFileName", lambda *a, **k: (str(target), "PNG images (*.png)"))
    window.save_chart_button.click()
    assert target.read_bytes().startswith(b"\x89PNG") and "chart saved" in window.statusBar().currentMessage()
    monkeypatch.setattr(QFileDialog, "getSaveFileName", lambda *a, **k: (str(tmp_path / "no" / "such" / "x.png"), ""))
    window.save_chart_button.click()
    assert "cannot save the charts" in window.statusBar().currentMessage()


def test_a_model_too_large_for_memory_is_refused(qtbot, data_dir, tiny_paths, monkeypatch):
    monkeypatch.setenv("SPECULA_MEMORY_LIMIT", "64K")  # the loader's memory budget, lowered
    window = open_window(qtbot)
    add_models(qtbot, window, [tiny_paths["llama-f32"]])
    assert window.picker.select_main(str(tiny_paths["llama-f32"]))
    qtbot.mouseClick(window.picker.load_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: window.picker.load_button.isEnabled(), timeout=60_000)
    assert window.loaded_facts is None
    assert "only 64.0 KiB available" in window.picker.state_label.text()


def test_closing_during_a_load_stops_it(qtbot, data_dir, tiny_paths):
    window = open_window(qtbot)
    add_models(qtbot, window, [tiny_paths["qwen2-q8"]])
    assert window.picker.select_main(str(tiny_paths["qwen2-q8"]))
    qtbot.mouseClick(window.picker.load_button, Qt.MouseButton.LeftButton)
    window.close()
    assert not window.host_thread.is_running() and not window.thread_stuck


def test_models_in_the_hugging_face_cache_are_in_the_library(qtbot, data_dir, tiny_paths, tmp_path):
    from huggingface_hub import constants

    # The cache's own layout: a blob, a snapshot pointing at it, and a ref naming the snapshot.
    repo = Path(constants.HF_HUB_CACHE) / "models--someone--tiny-GGUF"
    commit = "0123456789abcdef0123456789abcdef01234567"
    (repo / "blobs").mkdir(parents=True)
    (repo / "snapshots" / commit).mkdir(parents=True)
    (repo / "refs").mkdir()
    shutil.copy(tiny_paths["llama-q8"], repo / "blobs" / "abc123")
    (repo / "snapshots" / commit / "tiny-Q8_0.gguf").symlink_to(Path("../../blobs/abc123"))
    (repo / "refs" / "main").write_text(commit)

    window = open_window(qtbot)
    cached = [e for e in window.library.entries() if e.source == "hf-cache"]
    assert [(e.title, e.usable) for e in cached] == [("someone/tiny-GGUF (Q8_0)", True)]  # repo and quantization
    assert window.picker.select_main(cached[0].path)
    row = [e.path for e in window.library.entries()].index(cached[0].path)
    assert window.library.tree.topLevelItem(row).text(1) == "HF cache"


def test_the_backend_choice_reaches_the_estimate_and_a_load_replaces_it(qtbot, data_dir, tiny_paths):
    """One estimate per model: before a load, of the backend chosen (llama.cpp keeps the file's
    types; torch dequantizes to float32 on the CPU); once loaded, the engine's own count, until
    the backend chosen differs from the load's."""
    window = open_window(qtbot)
    picker, offload = window.picker, window.picker.main_offload
    qtbot.waitUntil(lambda: offload._devices is not None, timeout=60_000)
    assert picker.select_main(str(builtin_path("smollm2-135m"))) and picker.select_draft(LOOKUP)
    info = picker.main_entry().info
    if (offload._devices or {}).get("cpu_dtype") == "gguf":  # llama.cpp runs here
        assert "weights (the file's own types)" in offload.detail.text()
    picker.set_backend("torch")
    assert picker.spec().backend == "torch"
    assert f"{format_bytes(info.memory_bytes('float32'))} weights (float32)" in offload.detail.text()
    shot(window, "estimate-torch")
    qtbot.mouseClick(picker.load_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: window.loaded_facts is not None, timeout=120_000)
    weights = window.loaded_facts.main_weights
    assert weights.dtype == "float32" and weights.bytes == info.memory_bytes("float32")
    assert f"{format_bytes(weights.bytes)} weights (float32, as loaded)" in offload.detail.text()
    shot(window, "estimate-torch-loaded")
    picker.set_backend("auto")
    assert "as loaded" not in offload.detail.text()
    picker.set_backend("torch")
    assert "as loaded" in offload.detail.text()


def test_a_draft_with_another_vocabulary_drafts_through_text_in_the_chat(qtbot, data_dir, tiny_paths, monkeypatch, tmp_path):
    # The tiny main model's gibberish reply re-tokenizes to itself (which text-level drafting
    # needs) in torch's float32.
    window = open_window(qtbot)
    window.picker.set_backend("torch")
    add_models(qtbot, window, [tiny_paths["llama-f32"], tiny_paths["llama-b"]])
    facts = load_pair(qtbot, window, tiny_paths["llama-f32"], MODEL, tiny_paths["llama-b"])
    assert facts.draft_text_level and "(text-level)" in window.pair_label.text()
    summary = send(qtbot, window, "The quick brown fox", GREEDY_FIXED)
    assert summary["n_drafted"] > 0
    shot(window, "text-level-chat")


def test_a_file_with_an_absurd_alignment_is_refused_in_one_line(qtbot, data_dir, tmp_path):
    """Issue 51 item 5: a 4 MiB general.alignment, its padding sparse holes, is listed greyed with
    the reader's one line (the file and the value), never selectable, never a crash."""
    from tests.engine.test_layer_draft import fake_gemma3

    aligned = fake_gemma3(tmp_path / "aligned-4mib.gguf", alignment=4 << 20)
    window = open_window(qtbot)
    add_models(qtbot, window, [aligned])
    (entry,) = [e for e in window.library.entries() if e.path == str(aligned)]
    assert entry.info is None and entry.error.startswith("aligned-4mib.gguf: invalid general.alignment 4194304")
    assert "\n" not in entry.error and not window.picker.select_main(str(aligned))
    window.models_tabs.setCurrentWidget(window.library)
    tree = window.library.tree
    tree.setCurrentItem(tree.topLevelItem(tree.topLevelItemCount() - 1))
    assert "invalid general.alignment 4194304" in window.library.details.text()
    shot(window, "51-5-library-absurd-alignment")
