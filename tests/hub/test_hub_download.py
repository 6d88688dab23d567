"""Downloads from the fake hub: cache and folder layouts, resume after a dropped connection or a
cancel, SHA-256 rejection, the free-space check, gated repositories and tokens."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from huggingface_hub import constants, get_token, try_to_load_from_cache

from app.hub.download import discard_partial, download_gguf, pending_downloads
from app.hub.errors import ChecksumError, DiskFullError, DownloadCancelled, DownloadInterrupted, GatedRepoError, HubError
from app.hub.library import delete_local_model, list_local_models
from app.hub.token import save_token
from tests.hf_server import (BIG_FILE, DENIED_TOKEN, GOOD_TOKEN, REPO_BIG, REPO_GATED, SPLIT_FIRST,
                             fake_hub, hub, hub_files)  # noqa: F401

CHUNK = 256 * 1024  # app.hub.download.CHUNK_BYTES: http_get writes whole chunks


def cache_root() -> Path:
    return Path(constants.HF_HUB_CACHE)


def partials() -> list[Path]:
    return sorted(cache_root().glob("*/blobs/*.incomplete"))


def test_download_into_the_cache_shared_with_other_tools(hub, hub_files):
    data = hub_files["big"].read_bytes()
    events = []
    path = download_gguf(REPO_BIG, BIG_FILE, progress=events.append)
    assert path.read_bytes() == data and path.is_symlink()
    # huggingface_hub itself finds it, by branch name, without the network.
    assert try_to_load_from_cache(REPO_BIG, BIG_FILE, cache_dir=cache_root()) == str(path)
    assert hub.cdn_bytes() == len(data)
    done = [e.done for e in events]
    assert done == sorted(done) and events[-1].phase == "done" and events[-1].done == events[-1].total == len(data)
    assert {"downloading", "verifying", "done"} <= {e.phase for e in events}
    hub.reset()
    assert download_gguf(REPO_BIG, BIG_FILE) == path and hub.cdn_bytes() == 0  # already there
    [model] = list_local_models(include_builtin=False)
    assert (model.usable, model.source, model.repo_id, model.size_bytes) == (True, "hf-cache", REPO_BIG, len(data))
    assert model.name == f"{REPO_BIG} (F32)"  # repository and quantization, as the window names it
    assert not partials() and pending_downloads() == []


def test_download_into_a_folder(hub, hub_files, tmp_path):
    dest = tmp_path / "models"
    path = download_gguf(REPO_BIG, BIG_FILE, dest)
    assert path == dest / BIG_FILE and path.read_bytes() == hub_files["big"].read_bytes()
    assert not cache_root().exists() or not any(cache_root().iterdir())
    hub.reset()
    assert download_gguf(REPO_BIG, BIG_FILE, dest) == path and hub.cdn_bytes() == 0
    models = list_local_models([dest], include_builtin=False)
    assert [(m.source, m.name, m.usable) for m in models] == [("folder", BIG_FILE, True)]
    assert delete_local_model(models[0]) == len(hub_files["big"].read_bytes())
    assert not path.exists() and list_local_models([dest], include_builtin=False) == []


def test_split_model_downloads_every_part_and_lists_as_one(hub, hub_files):
    path = download_gguf(REPO_BIG, SPLIT_FIRST)
    assert path.name == SPLIT_FIRST and path.with_name(SPLIT_FIRST.replace("00001-of", "00002-of")).exists()
    [model] = list_local_models(include_builtin=False)
    assert len(model.parts) == 2 and model.size_bytes == hub_files["q8"].stat().st_size + 70_000
    assert model.info is not None and "split into 2 files" in model.error


def test_dropped_connection_resumes_and_verifies(hub, hub_files):
    data = hub_files["big"].read_bytes()
    hub.faults.drop_after, hub.faults.drop_times = 2 * CHUNK + 5000, 1
    path = download_gguf(REPO_BIG, BIG_FILE)
    assert path.read_bytes() == data
    first, second = hub.cdn_gets(data)
    assert first.body_bytes == 2 * CHUNK + 5000
    assert second.range == f"bytes={2 * CHUNK}-"  # resumed after the last whole chunk, not from 0
    assert hub.cdn_bytes(data) == len(data) + 5000


def test_cancel_keeps_a_partial_that_the_next_attempt_resumes(hub, hub_files):
    data = hub_files["big"].read_bytes()
    hub.faults.throttle_bps = 4 << 20
    seen = []
    with pytest.raises(DownloadCancelled, match="kept"):
        download_gguf(REPO_BIG, BIG_FILE, progress=seen.append, cancel=lambda: bool(seen) and seen[-1].done >= CHUNK)
    [partial] = partials()
    kept = partial.stat().st_size
    assert CHUNK <= kept < len(data) and partial.read_bytes() == data[:kept]
    assert list_local_models(include_builtin=False) == []  # never listed as a model
    [pending] = pending_downloads()
    assert (pending.repo_id, pending.filename, pending.done, pending.total) == (REPO_BIG, BIG_FILE, kept, len(data))
    hub.reset()
    path = download_gguf(REPO_BIG, BIG_FILE)
    assert path.read_bytes() == data
    [get] = hub.cdn_gets(data)
    assert get.range == f"bytes={kept}-" and get.body_bytes == len(data) - kept  # only the remainder
    assert not partials() and pending_downloads() == []


def test_resume_from_a_server_that_ignores_range(hub, hub_files):
    data = hub_files["big"].read_bytes()
    hub.faults.throttle_bps = 4 << 20
    with pytest.raises(DownloadCancelled):
        download_gguf(REPO_BIG, BIG_FILE, cancel=lambda: True)
    hub.reset()
    hub.faults.ignore_range = True  # 200 with the whole file: http_get starts the partial over
    assert download_gguf(REPO_BIG, BIG_FILE).read_bytes() == data


def test_hash_mismatch_is_rejected_and_leaves_nothing(hub):
    hub.faults.corrupt.add(BIG_FILE)
    with pytest.raises(ChecksumError, match="SHA-256 mismatch"):
        download_gguf(REPO_BIG, BIG_FILE)
    assert not partials() and pending_downloads() == []
    assert not list(cache_root().glob("*/blobs/*")) and not list(cache_root().glob("*/snapshots/*/*"))
    assert list_local_models(include_builtin=False) == []


def test_disk_too_small_is_refused_before_starting(hub, monkeypatch, tmp_path):
    monkeypatch.setenv("SPECULA_FAKE_FREE_BYTES", "100000")
    with pytest.raises(DiskFullError, match="not enough disk space"):
        download_gguf(REPO_BIG, BIG_FILE)
    with pytest.raises(DiskFullError):
        download_gguf(REPO_BIG, BIG_FILE, tmp_path / "dir")
    assert hub.cdn_gets() == [] and not partials() and not (tmp_path / "dir").exists()


def test_server_errors_fail_cleanly(hub):
    hub.faults.status["cdn"] = 500
    with pytest.raises(DownloadInterrupted, match="answered 500.*again to resume"):
        download_gguf(REPO_BIG, BIG_FILE)
    hub.faults.status = {"resolve": 500}
    with pytest.raises(HubError, match="answered 500"):
        download_gguf(REPO_BIG, BIG_FILE)
    assert list_local_models(include_builtin=False) == []


def test_gated_repo_needs_a_token_and_a_saved_one_works(hub, hub_files, monkeypatch):
    file = "Tiny-Llama-Gated-Q8_0.gguf"
    with pytest.raises(GatedRepoError, match="accept its terms.*HF_TOKEN"):
        download_gguf(REPO_GATED, file)
    monkeypatch.setenv("HF_TOKEN", DENIED_TOKEN)
    with pytest.raises(GatedRepoError, match="no access"):
        download_gguf(REPO_GATED, file)
    monkeypatch.delenv("HF_TOKEN")
    with pytest.raises(GatedRepoError, match="rejected"):
        save_token("hf_not_a_real_token")
    assert get_token() is None  # a rejected token is not stored
    assert save_token(GOOD_TOKEN) is True  # checked against the hub's whoami
    assert Path(constants.HF_TOKEN_PATH).read_text() == GOOD_TOKEN and get_token() == GOOD_TOKEN
    hub.reset()
    path = download_gguf(REPO_GATED, file)
    assert path.read_bytes() == hub_files["q8"].read_bytes()
    heads = [e for e in hub.log if e.server == "hub" and e.method == "HEAD"]
    assert heads and all(e.auth == f"Bearer {GOOD_TOKEN}" for e in heads)
    assert all(e.auth is None for e in hub.cdn_gets())  # the token never goes to the CDN


def test_token_is_saved_unverified_when_offline(hub, monkeypatch):
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    assert save_token("hf_saved_while_offline") is False
    assert get_token() == "hf_saved_while_offline"
    assert "hf_saved_while_offline" in Path(constants.HF_STORED_TOKENS_PATH).read_text()
    with pytest.raises(HubError, match="does not look like a token"):
        save_token("two words")


def test_delete_frees_the_blob_unless_another_snapshot_uses_it(hub, hub_files):
    path = download_gguf(REPO_BIG, BIG_FILE)
    blob = Path(os.path.realpath(path))
    # A second revision pointing at the same blob, as the cache holds after a commit that kept it.
    other = path.parent.parent / ("0" * 40) / BIG_FILE
    other.parent.mkdir()
    other.symlink_to(os.path.relpath(blob, other.parent))
    models = list_local_models(include_builtin=False)
    assert len(models) == 1  # one blob, one model
    assert delete_local_model(models[0]) == 0 and blob.exists()
    [again] = list_local_models(include_builtin=False)
    assert delete_local_model(again) == len(hub_files["big"].read_bytes()) and not blob.exists()
    assert list_local_models(include_builtin=False) == []
    hub.reset()
    download_gguf(REPO_BIG, BIG_FILE)  # and the cache is still healthy for a new download
    assert len(list_local_models(include_builtin=False)) == 1


def test_discarding_a_partial(hub):
    hub.faults.throttle_bps = 4 << 20
    with pytest.raises(DownloadCancelled):
        download_gguf(REPO_BIG, BIG_FILE, cancel=lambda: True)
    [item] = pending_downloads()
    assert discard_partial(item) == item.done > 0
    assert pending_downloads() == [] and not partials()


def test_progress_speed_and_eta_on_a_slow_link_and_one_download_at_a_time(hub, hub_files):
    import threading

    size = len(hub_files["big"].read_bytes())
    hub.faults.throttle_bps = 3 << 20
    events, errors = [], []
    worker = threading.Thread(target=lambda: download_gguf(REPO_BIG, BIG_FILE, progress=events.append))
    worker.start()
    while not events:
        time.sleep(0.01)
    try:
        download_gguf(REPO_BIG, BIG_FILE)
    except HubError as exc:
        errors.append(str(exc))
    worker.join(30)
    assert errors and "already being downloaded" in errors[0]
    timed = [e for e in events if e.phase == "downloading" and e.speed > 0]
    assert timed, events
    for e in timed:
        assert (1 << 20) < e.speed < (6 << 20)  # about the 3 MiB/s the server allows
        assert e.eta == pytest.approx((size - e.done) / e.speed)
    assert 1 < len(events) < 60  # at most ~10 a second


def test_a_folder_file_copied_in_by_hand_is_recognised_by_its_hash(hub, hub_files, tmp_path):
    dest = tmp_path / "models"
    dest.mkdir()
    (dest / BIG_FILE).write_bytes(hub_files["big"].read_bytes())
    assert download_gguf(REPO_BIG, BIG_FILE, dest) == dest / BIG_FILE
    assert hub.cdn_gets() == []


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


HOSTILE = {
    "etag-traversal": dict(etag='"../../../x"'),
    "etag-weak-traversal": dict(etag='W/"../../escaped"'),
    "etag-not-hex": dict(etag='"' + "g" * 64 + '"'),
    "etag-absolute": dict(etag='"{outside}"'),
    "commit-traversal": dict(commit="../../../x"),
    "commit-short": dict(commit="abc123"),
}


@pytest.mark.parametrize("case", HOSTILE)
def test_a_hub_answer_never_chooses_a_path(hub, tmp_path, case):
    from app.hub.remote import fetch_remote_header

    outside = tmp_path / "outside"
    for name, value in HOSTILE[case].items():
        setattr(hub.faults, name, value.format(outside=outside))
    before = _tree(tmp_path)
    folder = tmp_path / "models"
    folder.mkdir()
    for dest in (None, folder):
        with pytest.raises(HubError, match="(ETag|commit) that is not a (git|SHA-256|git or SHA-256) hash") as exc:
            download_gguf(REPO_BIG, BIG_FILE, dest)
        assert "\n" not in str(exc.value)
    with pytest.raises(HubError, match="refusing to use it"):
        fetch_remote_header(REPO_BIG, BIG_FILE)
    # Nothing written anywhere: not outside the cache, not in it, not in the folder.
    assert _tree(tmp_path) - before <= {"models"} and not list(folder.iterdir())
    assert not list(cache_root().glob("*/blobs/*")) and not outside.exists()
    assert hub.cdn_gets() == []


def test_quoted_and_weak_etags_are_accepted_as_huggingface_hub_reads_them(hub, hub_files):
    import hashlib

    data = hub_files["big"].read_bytes()
    hub.faults.etag = f'W/"{hashlib.sha256(data).hexdigest()}"'
    path = download_gguf(REPO_BIG, BIG_FILE)
    assert path.read_bytes() == data
    assert Path(os.path.realpath(path)).name == hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize("name", ["../../evil.gguf", "/etc/evil.gguf", "a/../../evil.gguf", "a\\..\\evil.gguf"])
def test_a_file_name_outside_the_repo_is_refused(hub, tmp_path, name):
    with pytest.raises(HubError, match="is not a file name inside the repository"):
        download_gguf(REPO_BIG, name, tmp_path / "dir")
    assert not (tmp_path / "dir").exists() and not (tmp_path / "evil.gguf").exists()


def test_writes_are_checked_against_their_folder(tmp_path):
    from app.hub.download import _check_within

    root = tmp_path / "root"
    (root / "blobs").mkdir(parents=True)
    _check_within(root, root / "blobs" / ("a" * 64), root / "snapshots" / ("b" * 40) / "m.gguf")
    (root / "blobs" / "out").symlink_to(tmp_path)  # a folder inside that leads outside
    for bad in (root / "blobs" / ".." / ".." / "x", root / "blobs" / "out" / "x", Path("/tmp/x")):
        with pytest.raises(HubError, match="outside"):
            _check_within(root, bad)


@pytest.mark.parametrize("how", ["absolute", "relative", "via-blobs-link"])
def test_delete_never_follows_a_snapshot_link_out_of_the_cache(hub, tmp_path, how):
    path = download_gguf(REPO_BIG, BIG_FILE)
    real_blob = Path(os.path.realpath(path))
    outside = tmp_path / "precious.gguf"
    outside.write_bytes(b"not the cache's")
    path.unlink()
    if how == "absolute":
        path.symlink_to(outside)
    elif how == "relative":
        path.symlink_to(os.path.relpath(outside, path.parent))
    else:  # a link inside blobs/ leading out: only the link itself may go
        link = real_blob.parent / ("f" * 64)
        link.symlink_to(outside)
        path.symlink_to(os.path.relpath(link, path.parent))
    [model] = list_local_models(include_builtin=False)
    delete_local_model(model)
    assert outside.read_bytes() == b"not the cache's"
    assert not path.is_symlink()
    if how == "via-blobs-link":
        assert not (real_blob.parent / ("f" * 64)).is_symlink()
