"""Comparison exports (JSON, CSV, PNG) and the charts' PNG are written through a fresh private
staging file: a link planted at the old fixed `<out>.part` name is never followed, and the file
is the user's alone (0600) whatever the umask."""

from __future__ import annotations

import os
import stat
from dataclasses import replace
from pathlib import Path

import pytest

from app.compare.export import save_csv
from app.compare.prompts import Prompt
from app.compare.results import COMPARE_DEFAULTS, NONE, CompareRun, ConfigSpec, MainFacts, PromptResult, RunSettings, save_run
from app.engine.events import RunSummary, StopReason

PROMPTS = (Prompt("code", "def f(x):"),)


def small_run() -> CompareRun:
    summary = RunSummary("x", tuple(range(9)), StopReason.MAX_TOKENS, NONE, 5, 5, 0.01, 9, 0.5, 0.01, 8, 0, 0, (), ())
    result = PromptResult(NONE, 0, "code", summary, ())
    return CompareRun(MainFacts("tiny", "/m/tiny.gguf", "CPU"), RunSettings(replace(COMPARE_DEFAULTS, max_tokens=8)),
                      (ConfigSpec(NONE, NONE, label=NONE),), PROMPTS, (result,), status="complete")


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def _save_png(run: CompareRun, path: Path) -> Path:
    from app.ui.compare.png import save_png

    return save_png(run, path)


@pytest.mark.parametrize("writer", [save_run, save_csv, _save_png], ids=["json", "csv", "png"])
def test_exports_ignore_a_planted_part_link_and_are_private(tmp_path, writer, umask_022, qapp):
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"not yours")
    out = tmp_path / "out" / "run.export"
    out.parent.mkdir()
    out.with_name(out.name + ".part").symlink_to(victim)
    writer(small_run(), out)
    assert victim.read_bytes() == b"not yours"
    assert out.is_file() and not out.is_symlink() and out.stat().st_size > 0
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    assert sorted(p.name for p in out.parent.iterdir()) == ["run.export", "run.export.part"]  # no staging left


def test_charts_png_ignores_a_planted_part_link(tmp_path, umask_022, qtbot):
    from PySide6.QtWidgets import QLabel

    from app.ui.chat.charts import save_widget_png

    label = QLabel("speed")
    qtbot.addWidget(label)
    label.resize(120, 40)
    label.show()
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"not yours")
    out = tmp_path / "charts.png"
    out.with_name("charts.png.part").symlink_to(victim)
    save_widget_png(label, out)
    assert victim.read_bytes() == b"not yours" and out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
