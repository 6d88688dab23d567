"""What Specula keeps about a user (chats, what the n-gram cache learned from them, comparison
runs) is theirs alone whatever the umask: folders 0700 and files 0600, as a browser profile is.
Folders an earlier version made 0755 are tightened; a folder the user named is left alone."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from app.common.atomic import private_dir
from app.engine.drafting.ngram_cache import NgramCache
from app.ui.chat.history import HistoryStore

pytestmark = pytest.mark.skipif(os.name != "posix", reason="POSIX permission bits")


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture(autouse=True)
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def test_history_and_its_wal_files_are_private(tmp_path):
    path = tmp_path / "data" / "history.sqlite3"
    with HistoryStore(path) as store:
        store.add_message(store.new_chat("secret"), "user", "my private question")
        wal, shm = (path.with_name(path.name + s) for s in ("-wal", "-shm"))
        assert wal.exists() and shm.exists()
        assert (mode(path.parent), mode(path), mode(wal), mode(shm)) == (0o700, 0o600, 0o600, 0o600)


def test_an_earlier_versions_readable_history_is_tightened(tmp_path):
    path = tmp_path / "history.sqlite3"
    with HistoryStore(path) as store:
        store.new_chat("secret")
    for p in (path, path.with_name(path.name + "-wal")):
        p.touch()
        p.chmod(0o644)
    with HistoryStore(path) as store:
        assert store.chats()[0].title == "secret"
        assert mode(path) == 0o600 and mode(path.with_name(path.name + "-wal")) == 0o600


def test_a_saved_ngram_cache_and_its_folder_are_private(tmp_path):
    cache = NgramCache("k")
    cache.learn([1, 2, 3, 4, 1, 2, 3, 5])
    path = tmp_path / "data" / "ngram-cache" / "k.ngc"
    cache.save(path)
    assert (mode(path.parent.parent), mode(path.parent), mode(path)) == (0o700, 0o700, 0o600)
    assert len(NgramCache.load(path, "k")) == len(cache) > 0  # and it reads back


def test_the_windows_data_and_comparison_folders_are_private(tmp_path, monkeypatch):
    from app.ui.compare import view as compare_view
    from app.ui.common import paths

    monkeypatch.setenv(paths.DATA_DIR_ENV, str(tmp_path / "new" / "specula"))
    assert mode(paths.data_dir()) == 0o700 and mode(tmp_path / "new") == 0o700
    assert mode(compare_view.runs_dir()) == 0o700
    old = tmp_path / "old"
    (old / "comparisons").mkdir(parents=True, mode=0o755)
    old.chmod(0o755)
    monkeypatch.setenv(paths.DATA_DIR_ENV, str(old))
    assert mode(paths.data_dir()) == 0o700 and mode(compare_view.runs_dir()) == 0o700


def test_a_folder_the_user_named_is_not_tightened(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o755)
    private_dir(mine / "sub")
    assert mode(mine) == 0o755 and mode(mine / "sub") == 0o700
