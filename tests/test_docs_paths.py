"""Docs true to the code (issue 59 item 6): every file or folder a page of docs/ or the README
names in backticks exists, at that path from the repository's root or as the tail of one (the
pages name `backends/choose.py` inside `app/engine/`)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md", ROOT / "SECURITY.md"]
# A backticked path: a source or page file's name, or a path that starts in one of the
# repository's own folders; not a flag, a hub repository, a user's data file or llama.cpp's source.
_PATH = re.compile(r"`((?:[\w.-]+/)+[\w.-]*|[\w-]+\.(?:py|md|toml))`")
_ELSEWHERE = ("common/", "tools/", "build/", "vendor/")


def _tracked() -> list[str]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    files = out.splitlines()
    folders = {str(Path(f).parent) + "/" for f in files}
    return files + sorted(folders)


def _named(page: Path, folders: set[str]) -> set[str]:
    names = {m.group(1) for m in _PATH.finditer(page.read_text(encoding="utf-8"))}
    return {name for name in names if not name.startswith(_ELSEWHERE)
            and (name.endswith((".py", ".md", ".toml")) or name.split("/")[0] in folders)}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_path_a_page_names_exists(page):
    tracked = _tracked()
    folders = {part for path in tracked if path.endswith("/") for part in path.strip("/").split("/")}
    missing = sorted(name for name in _named(page, folders)
                     if not any(path == name or path.endswith("/" + name) for path in tracked))
    assert not missing, f"{page.name} names what is not in the repository: {missing}"
