"""The Discover panel against the fake hub of tests/hf_server.py (real HTTP on 127.0.0.1, real GGUF
files, huggingface_hub's own client): search, quantization groups, header facts with fit and draft
compatibility, downloads with progress, cancel and resume, offline, gated repositories and tokens,
one-line errors, and a GUI thread that keeps turning while a download runs."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from huggingface_hub import constants, get_token
from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication

from app.engine.drafting.compat import check_compatibility, check_draft
from app.engine.gguf.format import format_bytes
from app.engine.gguf.info import read_gguf_info
from app.ui.discover.panel import KEY_ROLE, DiscoverPanel
from app.worker.hub_tasks import HubCalls
from tests.gui_support import shot
from tests.hf_server import (BIG_FILE, GOOD_TOKEN, REPO_BIG, REPO_BROKEN, REPO_FOREIGN, REPO_GATED, REPO_MID, REPO_SMALL,
                             SPLIT_FIRST, fake_hub, hub, hub_files)  # noqa: F401

WAIT_MS = 20_000
CHUNK = 256 * 1024  # app.hub.download.CHUNK_BYTES
TINY = [REPO_MID, REPO_BIG, REPO_SMALL, REPO_FOREIGN, REPO_GATED]  # by downloads


@pytest.fixture
def panel(qtbot, hub):
    widget = DiscoverPanel()
    qtbot.addWidget(widget)
    widget.resize(520, 760)
    widget.show()
    yield widget
    widget.shutdown(5000)


def repo_ids(panel) -> list[str]:
    return [panel.repos.topLevelItem(i).data(0, KEY_ROLE) for i in range(panel.repos.topLevelItemCount())]


def search(qtbot, panel, query: str) -> None:
    panel.query.setText(query)
    with qtbot.waitSignals([panel.calls.finished], timeout=WAIT_MS):
        panel.search_button.click()


def file_rows(panel) -> dict[str, list[tuple[str, str, str]]]:
    """Quantization heading -> (file, size, state) rows."""
    out = {}
    for g in range(panel.files.topLevelItemCount()):
        group = panel.files.topLevelItem(g)
        out[group.text(0)] = [tuple(group.child(r).text(c) for c in range(3)) for r in range(group.childCount())]
    return out


def pick_repo(qtbot, panel, repo_id: str) -> None:
    item = next(panel.repos.topLevelItem(i) for i in range(panel.repos.topLevelItemCount())
                if panel.repos.topLevelItem(i).data(0, KEY_ROLE) == repo_id)
    panel.repos.setCurrentItem(item)
    qtbot.waitUntil(lambda: panel._listing is not None and panel._listing.repo_id == repo_id, timeout=WAIT_MS)


def file_item(panel, filename: str):
    for g in range(panel.files.topLevelItemCount()):
        group = panel.files.topLevelItem(g)
        for r in range(group.childCount()):
            if group.child(r).data(0, KEY_ROLE) == filename:
                return group.child(r)
    raise AssertionError(f"{filename} not listed: {file_rows(panel)}")


def settled(panel) -> bool:
    """The shown file's header is read and its draft verdict priced."""
    return "reading header" not in panel.details.text() and "weighing this machine" not in panel.details.text()


def pick_file(qtbot, panel, filename: str, done=settled) -> str:
    panel.files.setCurrentItem(file_item(panel, filename))
    qtbot.waitUntil(lambda: done(panel), timeout=WAIT_MS)
    return panel.details.text()


def browse(qtbot, panel, repo_id: str, filename: str, query: str = "tiny-llama") -> str:
    search(qtbot, panel, query)
    pick_repo(qtbot, panel, repo_id)
    return pick_file(qtbot, panel, filename)


def test_search_shows_repos_sorted_as_asked(qtbot, panel):
    search(qtbot, panel, "tiny-llama")
    assert repo_ids(panel) == TINY  # the safetensors repo is not GGUF
    first = panel.repos.topLevelItem(0)
    assert [first.text(c) for c in (0, 1, 2)] == [REPO_MID, "900", "1"] and first.text(3)
    assert panel.repos.topLevelItem(4).text(0) == f"{REPO_GATED} (gated)"
    assert "5 repositories" in panel.status.text()
    with qtbot.waitSignal(panel.calls.finished, timeout=WAIT_MS):
        panel.sort.setCurrentIndex(panel.sort.findData("likes"))  # re-runs the search
    assert repo_ids(panel)[:2] == [REPO_SMALL, REPO_BIG]
    search(qtbot, panel, "no-such-model")
    assert repo_ids(panel) == [] and "No GGUF repository has all of “no-such-model”" in panel.status.text()
    search(qtbot, panel, "4L tiny")  # every word, in any order (issue 60 item 15)
    assert repo_ids(panel) == [REPO_BIG] and "1 repository for “4L tiny”" in panel.status.text()
    assert "each word must be in the repository's name" in panel.query.toolTip()


def test_repo_files_grouped_by_quantization_with_split_parts_as_one(qtbot, panel, hub_files):
    search(qtbot, panel, "tiny-llama")
    pick_repo(qtbot, panel, REPO_BIG)
    rows = file_rows(panel)
    split_size = format_bytes(hub_files["q8"].stat().st_size + 70_000)
    assert rows == {
        "Q8_0 · 1 file": [(f"{SPLIT_FIRST} (2 parts)", split_size, "")],
        "F32 · 1 file": [(BIG_FILE, format_bytes(hub_files["big"].stat().st_size), "")],
    }  # the mmproj projector and the README are not models
    details = pick_file(qtbot, panel, SPLIT_FIRST)
    assert "split into 2 files" in details and panel.download_button.isEnabled()


def test_file_shows_header_fit_and_draft_compatibility(qtbot, panel, hub, hub_files):
    main = read_gguf_info(hub_files["big"])
    panel.set_main_model(main)
    details = browse(qtbot, panel, REPO_SMALL, "Tiny-Llama-1L-F32.gguf")
    small = read_gguf_info(hub_files["small"])
    assert f"context {small.context_length:,} tokens" in details and f"vocabulary {small.vocab_size:,} (byte-level BPE tokenizer)" in details
    assert small.architecture in details and "✓ fits: needs ≈" in details
    assert "✓ drafts token by token (same vocabulary)" in details and "cannot draft" not in details
    assert hub.cdn_bytes() < hub_files["small"].stat().st_size  # range reads, not the file

    pick_repo(qtbot, panel, REPO_FOREIGN)  # another vocabulary: it drafts through text
    details = pick_file(qtbot, panel, "Tiny-Llama-Foreign-F16.gguf")
    assert not check_compatibility(main, read_gguf_info(hub_files["foreign"]))
    assert "✓ text-level draft" in details and "re-tokenized" in details and "cannot draft" not in details
    shot(panel, "discover-text-level")

    panel.set_main_model(None)  # no main model: the check is explained, not guessed
    assert "choose a main model first" in panel.details.text()
    panel.set_main_model(main)  # and a main model set later is checked on the shown header
    qtbot.waitUntil(lambda: "text-level" in panel.details.text(), timeout=WAIT_MS)

    pick_repo(qtbot, panel, REPO_BIG)  # the main model itself: it drafts, but no faster
    assert "will not pay: it is the same model" in pick_file(qtbot, panel, BIG_FILE)


def test_a_model_too_big_for_this_machine_says_so(qtbot, hub, monkeypatch):
    monkeypatch.setenv("SPECULA_MEMORY_LIMIT", "64K")  # read once, on the panel's first header
    panel = DiscoverPanel()
    qtbot.addWidget(panel)
    try:
        details = browse(qtbot, panel, REPO_BIG, BIG_FILE)
        assert "✗ too big: needs ≈" in details and "64.0 KiB of RAM available" in details
    finally:
        panel.shutdown(5000)


def test_results_for_a_selection_already_left_are_dropped(qtbot, panel):
    calls = HubCalls()
    seen = []
    calls.finished.connect(lambda channel, _id, result: seen.append((channel, result)))
    released = threading.Event()
    calls.submit("header", lambda: (released.wait(5), "old file")[1])
    calls.submit("header", lambda: "new file")
    calls.submit("search", lambda: "other channel")
    qtbot.waitUntil(lambda: len(seen) == 2, timeout=WAIT_MS)
    released.set()
    assert calls.shutdown(5000)
    QApplication.processEvents()
    assert sorted(seen) == [("header", "new file"), ("search", "other channel")]

    search(qtbot, panel, "tiny-llama")  # the panel: clicking on before a listing arrives
    panel.repos.setCurrentItem(panel.repos.topLevelItem(1))
    pick_repo(qtbot, panel, REPO_SMALL)
    qtbot.wait(300)
    assert panel._listing.repo_id == REPO_SMALL and list(file_rows(panel)) == ["F32 · 1 file"]


def test_download_completes_verified_and_emits_the_path(qtbot, panel, hub, hub_files):
    browse(qtbot, panel, REPO_MID, "Tiny-Llama-2L-Q8_0.gguf")
    assert panel.download_button.text() == "Download"
    with qtbot.waitSignal(panel.downloaded, timeout=WAIT_MS) as done:
        panel.download_button.click()
    path = Path(done.args[0])
    assert path.is_file() and path.is_relative_to(constants.HF_HUB_CACHE)
    assert path.read_bytes() == hub_files["q8"].read_bytes()
    assert read_gguf_info(path).vocab_size == read_gguf_info(hub_files["q8"]).vocab_size
    assert panel.strip.state == "done" and "verified" in panel.strip.detail.text()
    qtbot.waitUntil(lambda: file_item(panel, "Tiny-Llama-2L-Q8_0.gguf").text(2) == "downloaded", timeout=WAIT_MS)
    # Issue 52 item 4: one state, one message: the strip says it is verified and in the library;
    # no dead button beside it and no size "to download".
    assert panel.download_button.text() == "Downloaded" and not panel.download_button.isEnabled()
    assert panel.download_note.text() == ""
    assert "downloaded" in panel.details.text() and "to download" not in panel.details.text()
    shot(panel, "52-4-download-done")


def test_cancel_keeps_a_resumable_partial_and_the_window_keeps_turning(qtbot, panel, hub, hub_files):
    data = hub_files["big"].read_bytes()
    browse(qtbot, panel, REPO_BIG, BIG_FILE)
    hub.faults.throttle_bps = 1 << 20  # about 4 s for the file
    ticks = []
    timer = QTimer()
    timer.timeout.connect(lambda: ticks.append(time.monotonic()))
    timer.start(20)
    panel.download_button.click()
    assert not panel.download_button.isEnabled()  # one download at a time
    qtbot.waitUntil(lambda: panel.strip.last is not None and panel.strip.last.done >= 2 * CHUNK, timeout=WAIT_MS)
    shot(panel, "discover-download")
    panel.resize(450, 420)  # about the size of the window's Models tabs
    shot(panel, "discover-small")
    panel.resize(1000, 680)
    shot(panel, "discover-wide")
    assert "iB/s · " in panel.strip.detail.text() and " s left" in panel.strip.detail.text()
    panel.strip.button.click()  # Cancel
    qtbot.waitUntil(lambda: panel.strip.state == "stopped", timeout=WAIT_MS)
    timer.stop()
    gaps = [b - a for a, b in zip(ticks, ticks[1:])]
    assert len(ticks) > 10 and max(gaps) < 0.5, max(gaps)  # never frozen while downloading

    [partial] = Path(constants.HF_HUB_CACHE).glob("*/blobs/*.incomplete")
    kept = partial.stat().st_size
    assert CHUNK <= kept < len(data) and partial.read_bytes() == data[:kept]
    assert f"{format_bytes(kept)} kept" in panel.strip.detail.text() and panel.strip.button.text() == "Resume"
    qtbot.waitUntil(lambda: file_item(panel, BIG_FILE).text(2) == f"partial {format_bytes(kept)}", timeout=WAIT_MS)
    assert panel.download_button.text() == "Resume download"
    shot(panel, "discover-cancelled")

    hub.reset()
    with qtbot.waitSignal(panel.downloaded, timeout=WAIT_MS) as done:
        panel.download_button.click()  # the second click resumes
    assert Path(done.args[0]).read_bytes() == data
    [get] = hub.cdn_gets(data)
    assert get.range == f"bytes={kept}-"  # only the rest was fetched


def test_offline_and_unreachable_hub_are_one_line_in_the_panel(qtbot, panel, monkeypatch):
    messages = []
    panel.statusMessage.connect(messages.append)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with qtbot.waitSignal(panel.calls.failed, timeout=WAIT_MS):
        panel.search_button.click()
    assert "offline (HF_HUB_OFFLINE is set)" in panel.status.text() and repo_ids(panel) == []
    assert len(messages) == 1 and "\n" not in messages[0]

    import socket

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    with socket.socket() as s:  # a port that was free a moment ago: connection refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{port}")
    started = time.monotonic()
    with qtbot.waitSignal(panel.calls.failed, timeout=WAIT_MS):
        panel.search_button.click()
    assert "cannot reach" in panel.status.text() and time.monotonic() - started < 5


def test_gated_repo_asks_for_a_token_and_a_saved_one_opens_it(qtbot, panel):
    details = browse(qtbot, panel, REPO_GATED, "Tiny-Llama-Gated-Q8_0.gguf")
    assert "gated" in details and panel.token.isVisible()
    shot(panel, "discover-token")
    assert get_token() is None
    panel.token.field.setText("hf_not_a_real_token")
    panel.token.save_button.click()
    qtbot.waitUntil(lambda: "rejected" in panel.token.message.text(), timeout=WAIT_MS)
    assert panel.token.isVisible() and get_token() is None  # a rejected token is not stored
    panel.token.field.setText(GOOD_TOKEN)
    panel.token.save_button.click()
    qtbot.waitUntil(lambda: "fits" in panel.details.text(), timeout=WAIT_MS)  # read again, now allowed
    assert not panel.token.isVisible() and get_token() == GOOD_TOKEN
    assert "Token saved (checked with the hub)" in panel.status.text()


def test_download_errors_are_one_line_and_leave_nothing_usable(qtbot, panel, hub, monkeypatch):
    messages = []
    panel.statusMessage.connect(messages.append)
    browse(qtbot, panel, REPO_BIG, BIG_FILE)
    monkeypatch.setenv("SPECULA_FAKE_FREE_BYTES", "100000")
    panel.download_button.click()
    qtbot.waitUntil(lambda: panel.strip.state == "failed", timeout=WAIT_MS)
    assert "not enough disk space" in panel.strip.detail.text() and panel.strip.button.text() == "Retry"
    monkeypatch.delenv("SPECULA_FAKE_FREE_BYTES")
    hub.faults.corrupt.add(BIG_FILE)
    panel.strip.button.click()  # Retry
    qtbot.waitUntil(lambda: panel.strip.state == "failed" and "SHA-256" in panel.strip.detail.text(),
                    timeout=WAIT_MS)
    assert [m.split(":")[0] for m in messages] == [f"downloading {REPO_BIG}/{BIG_FILE}",
                                                   "not enough disk space for " + f"{REPO_BIG}/{BIG_FILE}",
                                                   f"downloading {REPO_BIG}/{BIG_FILE}", BIG_FILE]
    assert all("\n" not in m for m in messages)
    assert not list(Path(constants.HF_HUB_CACHE).glob("*/snapshots/*/*"))
    assert file_item(panel, BIG_FILE).text(2) == ""


def test_a_file_that_is_not_gguf_is_not_offered_for_download(qtbot, panel, hub):
    details = browse(qtbot, panel, REPO_BROKEN, "Broken-Q4_0.gguf", query="broken")
    assert "not a GGUF file" in details
    assert not panel.download_button.isEnabled() and "not a usable GGUF" in panel.download_note.text()
    assert not Path(constants.HF_HUB_CACHE).exists()  # nothing was downloaded


def test_shutdown_during_a_download_stops_it_and_keeps_what_arrived(qtbot, panel, hub, hub_files):
    browse(qtbot, panel, REPO_BIG, BIG_FILE)
    hub.faults.throttle_bps = 1 << 20
    finished = []
    panel.downloaded.connect(finished.append)
    panel.download_button.click()
    qtbot.waitUntil(lambda: panel.strip.last is not None and panel.strip.last.done >= CHUNK, timeout=WAIT_MS)
    started = time.monotonic()
    panel.shutdown(5000)  # what the window does when it closes
    assert time.monotonic() - started < 3
    [partial] = Path(constants.HF_HUB_CACHE).glob("*/blobs/*.incomplete")
    assert CHUNK <= partial.stat().st_size < len(hub_files["big"].read_bytes())
    qtbot.wait(100)
    assert finished == [] and not list(Path(constants.HF_HUB_CACHE).glob("*/snapshots/*/*"))


def test_progress_words():
    from app.hub.progress import DownloadProgress
    from app.ui.discover.text import eta_text, progress_line

    def p(**kw):
        base = dict(repo_id="r", filename="f.gguf", part=1, n_parts=1, done=3 << 20, total=10 << 20,
                    speed=float(1 << 20), eta=7.0, phase="downloading", resumed_from=0)
        return DownloadProgress(**{**base, **kw})

    assert progress_line(p()) == "3.0 MiB of 10.0 MiB · 1.0 MiB/s · 7 s left"
    assert progress_line(p(speed=0.0, eta=None)) == "3.0 MiB of 10.0 MiB · measuring speed…"
    assert progress_line(p(n_parts=2, part=2, resumed_from=1 << 20)) == \
        "3.0 MiB of 10.0 MiB · part 2 of 2 · 1.0 MiB/s · 7 s left · resumed at 1.0 MiB"
    assert progress_line(p(phase="verifying")) == "verifying SHA-256 (10.0 MiB)"
    assert progress_line(p(phase="checking")).startswith("checking the kept part")
    assert [eta_text(s) for s in (None, 59.4, 61, 3725)] == ["time left unknown", "59 s left",
                                                              "1 min 01 s left", "1 h 02 min left"]


def test_a_draft_that_cannot_draft_says_why(hub_files, tmp_path):
    """A vocabulary neither side can re-tokenize (WordPiece) is refused with the reason."""
    from app.ui.discover.text import draft_html
    from tests.header_gguf import make_tokens, write_gguf
    from tests.tiny_gguf import VOCAB_SIZE

    main = read_gguf_info(hub_files["big"])
    wordpiece = read_gguf_info(write_gguf(tmp_path / "wp.gguf", tokens=make_tokens(VOCAB_SIZE, "wp"), vocab_type="bert"))
    shown = draft_html(check_draft(main, wordpiece), wordpiece, main)
    assert "✗ cannot draft: vocabulary types differ" in shown and "cannot re-tokenize drafts" in shown
