"""The local library on real files: what is listed, what is unusable and why, what is left out."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.hub.errors import HubError
from app.hub.library import LocalModel, delete_local_model, list_local_models


@pytest.fixture
def folder(tiny_paths, tmp_path) -> Path:
    root = tmp_path / "my models"
    (root / "sub").mkdir(parents=True)
    good = tiny_paths["llama-q8"].read_bytes()
    (root / "good-Q8_0.gguf").write_bytes(good)
    (root / "sub" / "nested.gguf").write_bytes(tiny_paths["qwen2-f32"].read_bytes())
    (root / "cut.gguf").write_bytes(good[: len(good) // 2])
    (root / "notes.gguf").write_text("not a model\n" * 50)
    (root / "mmproj-vision-F16.gguf").write_bytes(good)  # a vision projector, not a language model
    (root / "big.gguf.incomplete").write_bytes(good[:1000])  # a partial download
    (root / ".cache" / "huggingface" / "download").mkdir(parents=True)
    (root / ".cache" / "huggingface" / "download" / "x.gguf").write_bytes(good)
    (root / "Split-Q8_0-00001-of-00003.gguf").write_bytes(good)
    (root / "Split-Q8_0-00002-of-00003.gguf").write_bytes(b"\0" * 100)
    return root


def test_folder_models_with_their_facts_or_the_reason(folder, tiny_paths):
    models = {m.name: m for m in list_local_models([folder], include_builtin=False)}
    assert set(models) == {"good-Q8_0.gguf", "sub/nested.gguf", "cut.gguf", "notes.gguf",
                           "Split-Q8_0-00001-of-00003.gguf"}
    good = models["good-Q8_0.gguf"]
    assert good.usable and good.source == "folder" and good.repo_id is None
    assert (good.info.architecture, good.info.file_type) == ("llama", "Q8_0")
    assert good.size_bytes == tiny_paths["llama-q8"].stat().st_size
    assert models["sub/nested.gguf"].info.architecture == "qwen2"
    assert "truncated" in models["cut.gguf"].error and not models["cut.gguf"].usable
    assert "not a GGUF file" in models["notes.gguf"].error
    split = models["Split-Q8_0-00001-of-00003.gguf"]
    assert "1 of 3 parts missing" in split.error and len(split.parts) == 2
    assert all("\n" not in (m.error or "") for m in models.values())


def test_a_folder_listed_twice_or_missing(folder, tmp_path):
    once = list_local_models([folder], include_builtin=False)
    assert len(list_local_models([folder, folder / "sub"], include_builtin=False)) == len(once)
    assert list_local_models([tmp_path / "nowhere"], include_builtin=False) == []


def test_delete_from_a_folder_frees_the_space(folder):
    [cut] = [m for m in list_local_models([folder], include_builtin=False) if m.name == "cut.gguf"]
    size = (folder / "cut.gguf").stat().st_size
    assert delete_local_model(cut) == size and not (folder / "cut.gguf").exists()
    [split] = [m for m in list_local_models([folder], include_builtin=False) if "Split" in m.name]
    delete_local_model(split)
    assert not list(folder.glob("Split-*"))


def test_built_in_models_cannot_be_deleted(tmp_path):
    fake = LocalModel(tmp_path / "x.gguf", "builtin", "SmolLM2 135M Instruct (Q4_1)", None, 0, None, None)
    with pytest.raises(HubError, match="built-in model"):
        delete_local_model(fake)


@pytest.mark.demo
def test_built_in_models_are_listed_first_with_their_headers():
    models = list_local_models()
    builtin = [m for m in models if m.source == "builtin"]
    # The real pair (1.6 GB) is listed once it has been joined (tests/test_builtin_pair.py may have).
    pair = ["Qwen2.5-Coder 1.5B Instruct (Q4_K_M)", "Qwen2.5-Coder 0.5B Instruct (Q4_K_M)"]
    assert [m.name for m in builtin if m.name not in pair] == ["SmolLM2 135M Instruct (Q4_1)", "Gemma 3 270M base (Q4_K_M)"]
    assert models[: len(builtin)] == builtin
    assert all(m.usable for m in builtin)
    assert builtin[0].info.vocab_size == 49152 and builtin[1].info.vocab_size == 262144
    with pytest.raises(HubError):
        delete_local_model(builtin[0])
    assert builtin[0].path.exists()


@pytest.mark.parametrize("linked", ["commit", "snapshots"])
def test_delete_through_a_linked_cache_folder_touches_nothing_outside(tmp_path, linked):
    """snapshots/<commit> (or snapshots/ itself) linked to a folder outside the cache: deleting
    the model refuses in one line and the outside file stays (hub's deletion stays in the repo)."""
    outside = tmp_path / "outside"
    (outside / "c0ffee").mkdir(parents=True)
    for folder in (outside, outside / "c0ffee"):
        (folder / "m.gguf").write_bytes(b"precious")
    repo = tmp_path / "hub" / "models--someone--model"
    repo.mkdir(parents=True)
    if linked == "snapshots":
        (repo / "snapshots").symlink_to(outside)
    else:
        (repo / "snapshots").mkdir()
        (repo / "snapshots" / "c0ffee").symlink_to(outside)
    model = LocalModel(path=repo / "snapshots" / "c0ffee" / "m.gguf", source="hf-cache", name="someone/model/m.gguf", repo_id="someone/model",
                       size_bytes=8, info=None, error=None)
    with pytest.raises(HubError, match="outside the cache folder") as exc:
        delete_local_model(model)
    assert "\n" not in str(exc.value)
    assert (outside / "m.gguf").read_bytes() == b"precious"
    assert (outside / "c0ffee" / "m.gguf").read_bytes() == b"precious"


def test_the_same_file_twice_is_one_entry_and_another_header_is_not(tiny_paths, tmp_path):
    """One entry per file (issue 52 item 5): the same bytes in two folders are listed once, the
    first folder's keeping the entry and naming the other as its copy; a file with the same
    weights but another header (a newer chat template) is another file."""
    from tests.tiny_gguf import TinySpec, write_tiny_gguf

    first, second = tmp_path / "a", tmp_path / "b"
    for folder in (first, second):
        folder.mkdir()
        (folder / "tiny-Q8_0.gguf").write_bytes(tiny_paths["llama-q8"].read_bytes())
    write_tiny_gguf(second / "no-template.gguf", TinySpec(arch="llama", qtype="F32", seed=0, chat_template=None))
    (second / "with-template.gguf").write_bytes(tiny_paths["llama-f32"].read_bytes())

    models = list_local_models([first, second], include_builtin=False)
    assert sorted(m.name for m in models) == ["no-template.gguf", "tiny-Q8_0.gguf", "with-template.gguf"]
    [tiny] = [m for m in models if m.name == "tiny-Q8_0.gguf"]
    assert tiny.path == first / "tiny-Q8_0.gguf"
    assert [c.path for c in tiny.copies] == [second / "tiny-Q8_0.gguf"]
    assert tiny.to_dict()["copies"] == [str(second / "tiny-Q8_0.gguf")]
    assert delete_local_model(tiny) == 2 * tiny.size_bytes  # the model and its copy: the space comes back
    assert not (first / "tiny-Q8_0.gguf").exists() and not (second / "tiny-Q8_0.gguf").exists()


@pytest.mark.demo
def test_a_download_of_a_built_in_model_is_the_built_in_entry_and_deleting_spares_it(demo_path, tmp_path):
    """A downloaded copy of the built-in SmolLM2 is not a second model: the built-in entry keeps
    it (its file belongs to its package, and `-m smollm2-135m` loads it), and deleting the entry
    deletes the copy only."""
    import shutil

    builtin_file = demo_path("smollm2-135m")
    folder = tmp_path / "downloads"
    folder.mkdir()
    copy = Path(shutil.copy(builtin_file, folder / "SmolLM2-135M-Instruct-Q4_1.gguf"))
    models = list_local_models([folder])
    smollm = [m for m in models if m.info is not None and m.info.vocab_size == 49152]
    assert [(m.name, m.source) for m in smollm] == [("SmolLM2 135M Instruct (Q4_1)", "builtin")]
    assert [c.path for c in smollm[0].copies] == [copy]
    size = builtin_file.stat().st_size
    assert delete_local_model(smollm[0]) == size
    assert not copy.exists() and builtin_file.stat().st_size == size
    with pytest.raises(HubError, match="built-in model"):
        delete_local_model(list_local_models([folder])[0])


def test_one_file_of_a_repository_in_two_revisions_is_one_entry(tiny_paths, tmp_path, monkeypatch):
    """The same repo and file downloaded at two commits (the repo updated its file): one entry,
    the newest revision's, with the older as its copy; not two rows of one name."""
    import os

    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf"))
    repo = tmp_path / "hf" / "models--someone--tiny-GGUF"
    (repo / "blobs").mkdir(parents=True)
    (repo / "refs").mkdir()
    commits = {"old": ("1" * 40, "llama-q8"), "new": ("2" * 40, "llama-f32")}
    for when, (commit, source) in enumerate(commits.values()):
        blob = repo / "blobs" / f"blob{when}"
        blob.write_bytes(tiny_paths[source].read_bytes())
        os.utime(blob, (1_000_000 * (when + 1),) * 2)
        (repo / "snapshots" / commit).mkdir(parents=True)
        (repo / "snapshots" / commit / "tiny.gguf").symlink_to(Path(f"../../blobs/blob{when}"))
    (repo / "refs" / "main").write_text(commits["new"][0])

    [model] = list_local_models(include_builtin=False)
    assert model.repo_id == "someone/tiny-GGUF" and model.info.file_type == "F32"  # the newest
    assert [c.info.file_type for c in model.copies] == ["Q8_0"]
