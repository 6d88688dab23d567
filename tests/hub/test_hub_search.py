"""Searching the hub, listing GGUF files, header facts by range reads, fit and draft suggestions,
against the fake hub of tests/hf_server.py (real HTTP, real GGUF files)."""

from __future__ import annotations

import hashlib
import time

import pytest
from huggingface_hub import constants

from app.engine.drafting.compat import check_compatibility
from app.engine.errors import ModelFileError
from app.engine.gguf.info import read_gguf_info
from app.hub.errors import GatedRepoError, HubError, NotFoundError, OfflineError
from app.hub.fit import GpuMemory, MachineMemory, fits_this_machine, parse_nvidia_smi, ram_available
from app.hub.library import list_local_models
from app.hub.names import params_from_name, quant_label, split_name
from app.hub.search import (check_remote_pair, fetch_remote_header, fetch_remote_info, group_by_quant,
                            list_gguf_files, search_gguf, suggest_drafts)
from app.hub.drafts import family_query
from tests.hf_server import (BIG_FILE, DENIED_TOKEN, REPO_BIG, REPO_BROKEN, REPO_FOREIGN, REPO_GATED,
                             REPO_MID, REPO_SMALL, REPO_VOCAB, SPLIT_FIRST, fake_hub, hub, hub_files)  # noqa: F401

TINY = [REPO_MID, REPO_BIG, REPO_SMALL, REPO_FOREIGN, REPO_GATED]  # by downloads


def test_search_filters_gguf_and_sorts(hub):
    by_downloads = search_gguf("tiny-llama")
    assert [r.repo_id for r in by_downloads] == TINY  # the safetensors repo is not GGUF
    assert [r.repo_id for r in search_gguf("Tiny-Llama", sort="likes")][:2] == [REPO_SMALL, REPO_BIG]
    assert search_gguf("tiny-llama", sort="recent")[0].repo_id == REPO_SMALL
    assert len(search_gguf("tiny-llama", limit=2)) == 2
    gated = {r.repo_id: r.gated for r in by_downloads}
    assert gated[REPO_GATED] and not gated[REPO_MID]
    assert by_downloads[0].downloads == 900 and by_downloads[0].last_modified is not None
    with pytest.raises(HubError, match="unknown sort"):
        search_gguf("x", sort="best")


def test_files_grouped_by_quant_with_split_parts_as_one(hub, hub_files):
    files = list_gguf_files(REPO_BIG)
    by_name = {f.filename: f for f in files}
    assert set(by_name) == {BIG_FILE, SPLIT_FIRST}  # no mmproj projector, no README
    split = by_name[SPLIT_FIRST]
    assert split.is_split and split.complete and split.quant == "Q8_0"
    assert split.size_bytes == hub_files["q8"].stat().st_size + 70_000
    big = by_name[BIG_FILE]
    assert big.quant == "F32" and big.size_bytes == hub_files["big"].stat().st_size
    assert big.sha256 == hashlib.sha256(hub_files["big"].read_bytes()).hexdigest()
    assert list(group_by_quant(files)) == ["Q8_0", "F32"]


def test_a_search_of_several_words_finds_repos_with_all_of_them(hub, fake_hub, hub_files):
    """Issue 60 item 15: "qwen coder" found nothing where "coder" found both Qwen2.5-Coder repos
    (the hub matches one substring of the id)."""
    coders = ["FAKEORG/qwen2.5-coder-1.5b-instruct-q4_k_m-GGUF", "FAKEORG/qwen2.5-coder-0.5b-instruct-q4_k_m-GGUF"]
    for downloads, repo_id in enumerate(reversed(coders)):
        fake_hub.add_repo(repo_id, {"model-Q8_0.gguf": hub_files["q8"]}, downloads=downloads)
    fake_hub.add_repo("FAKEORG/deepseek-coder-1.3b-GGUF", {"model-Q8_0.gguf": hub_files["q8"]})
    try:
        assert [r.repo_id for r in search_gguf("qwen coder")] == coders
        assert [r.repo_id for r in search_gguf("Coder  QWEN 1.5b")] == coders[:1]  # any order, any case
        assert len(search_gguf("coder")) == 3 and search_gguf("qwen coder", limit=1)[0].repo_id == coders[0]
        assert [r.repo_id for r in search_gguf("4l tiny")] == [REPO_BIG]
        assert search_gguf("qwen llama") == []
        asked = [e.path for e in fake_hub.log if e.path.startswith("/api/models?")]
        assert all("search=coder" in p or "search=tiny" in p or "search=llama" in p for p in asked)
    finally:
        for repo_id in [*coders, "FAKEORG/deepseek-coder-1.3b-GGUF"]:
            del fake_hub.repos[repo_id]


@pytest.mark.parametrize("name, quant", [
    ("Meta-Llama-3.1-8B-Instruct-Q4_K_M.gguf", "Q4_K_M"),
    ("SmolLM2-135M-Instruct.Q4_1.gguf", "Q4_1"),
    ("qwen2.5-7b-instruct-q8_0-00001-of-00002.gguf", "Q8_0"),
    ("Qwen3-30B-A3B-UD-Q4_K_XL.gguf", "UD-Q4_K_XL"),
    ("gemma-3-270m-it-IQ4_XS.gguf", "IQ4_XS"),
    ("Q4_K_M/Llama-4-Scout-00001-of-00002.gguf", "Q4_K_M"),
    ("model-bf16.gguf", "BF16"),
    ("model.gguf", None),
])
def test_quant_label_from_real_world_names(name, quant):
    assert quant_label(name) == quant


def test_split_and_size_names():
    split = split_name("dir/Model-Q8_0-00002-of-00003.gguf")
    assert split is not None and split.index == 2 and split.count == 3
    assert split.parts() == [f"dir/Model-Q8_0-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    assert split_name("Model-Q8_0.gguf") is None
    assert params_from_name("bartowski/Llama-3.2-1B-Instruct-GGUF") == 1_000_000_000
    assert params_from_name("Qwen2.5-0.5B-Instruct") == 500_000_000
    assert params_from_name("HuggingFaceTB/SmolLM2-135M-Instruct") == 135_000_000
    assert params_from_name("Phi-3-mini-4k-instruct") is None
    assert params_from_name("Qwen3-30B-A3B") == 30_000_000_000


def test_remote_header_matches_local_and_reads_far_less(hub, hub_files):
    header = fetch_remote_header(REPO_BIG, BIG_FILE)
    local = read_gguf_info(hub_files["big"])
    remote = header.info
    assert (remote.architecture, remote.n_params, remote.vocab_size, remote.context_length,
            remote.n_layers, len(remote.tensors)) == (local.architecture, local.n_params, local.vocab_size,
                                                      local.context_length, local.n_layers, len(local.tensors))
    assert check_compatibility(local, remote).compatible
    size = hub_files["big"].stat().st_size
    assert header.file.size == size and remote.file_size == size
    served = hub.cdn_bytes()
    assert served == header.bytes_transferred < size / 20  # bytes counted on the server side
    assert all(e.range for e in hub.cdn_gets())  # never an unranged GET


def test_remote_header_grows_the_range_until_it_parses(hub, hub_files):
    header = fetch_remote_header(REPO_VOCAB, "Big-Vocab-F16.gguf")
    local = read_gguf_info(hub_files["vocab"])
    assert header.info.vocab_size == local.vocab_size == 40_000
    assert header.requests > 1
    gets = hub.cdn_gets()
    assert [e.range.split("=")[1].split("-")[0] for e in gets][0] == "0"
    starts = [int(e.range.split("=")[1].split("-")[0]) for e in gets]
    assert starts == sorted(set(starts))  # each request fetches only bytes not yet fetched
    assert local.data_offset < hub.cdn_bytes() <= 2 * local.data_offset + 128 * 1024
    assert hub.cdn_bytes() < hub_files["vocab"].stat().st_size / 4


def test_remote_file_that_is_not_gguf(hub):
    with pytest.raises(ModelFileError, match="not a GGUF file"):
        fetch_remote_info(REPO_BROKEN, "Broken-Q4_0.gguf")


def test_hub_errors_are_one_line(hub, monkeypatch):
    with pytest.raises(NotFoundError, match="no repository nobody/nothing"):
        list_gguf_files("nobody/nothing")
    with pytest.raises(NotFoundError, match="has no file missing.gguf"):
        fetch_remote_info(REPO_BIG, "missing.gguf")
    with pytest.raises(GatedRepoError, match="accept its terms.*HF_TOKEN"):
        fetch_remote_info(REPO_GATED, "Tiny-Llama-Gated-Q8_0.gguf")
    monkeypatch.setenv("HF_TOKEN", DENIED_TOKEN)
    with pytest.raises(GatedRepoError, match="no access"):
        fetch_remote_info(REPO_GATED, "Tiny-Llama-Gated-Q8_0.gguf")
    hub.faults.status["model_info"] = 500
    with pytest.raises(HubError, match="answered 500") as err:
        list_gguf_files(REPO_BIG)
    hub.faults.status["resolve"] = 500
    with pytest.raises(HubError, match="answered 500"):
        fetch_remote_info(REPO_BIG, BIG_FILE)
    assert "\n" not in str(err.value)


def test_offline_search_says_so_and_the_library_still_works(hub, hub_files, tmp_path, monkeypatch):
    folder = tmp_path / "models"
    folder.mkdir()
    (folder / "mine.gguf").write_bytes(hub_files["mid"].read_bytes())
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(OfflineError, match="offline"):
        search_gguf("tiny")
    with pytest.raises(OfflineError, match="offline"):
        list_gguf_files(REPO_BIG)
    assert not hub.log  # nothing was even attempted
    assert [m.name for m in list_local_models([folder], include_builtin=False) if m.usable] == ["mine.gguf"]


def test_unreachable_hub_is_offline_quickly(hub, monkeypatch):
    import socket

    with socket.socket() as s:  # a port that was free a moment ago: connection refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{port}")
    started = time.monotonic()
    with pytest.raises(OfflineError, match="offline"):
        search_gguf("tiny")
    assert time.monotonic() - started < 5  # not huggingface_hub's 25 s of retries


def test_fit_uses_the_engines_estimate(hub_files, monkeypatch):
    info = read_gguf_info(hub_files["big"])
    n_ctx = 256
    kv = info.kv_bytes_per_token("float32") * n_ctx
    largest = max(t.n_elements for t in info.tensors) * 4
    need = info.n_params * 4 + kv + largest
    roomy = fits_this_machine(info, n_ctx=n_ctx, dtype="float32", machine=MachineMemory(1 << 34, 1 << 34, None))
    assert roomy.fits and roomy.where == "cpu" and roomy.need_bytes == need and roomy.gpu_layers is None
    tight = fits_this_machine(info, n_ctx=n_ctx, dtype="float32", machine=MachineMemory(need - 1, 1 << 34, None))
    assert not tight.fits and tight.reason.startswith("too big")
    # torch caches keys and values in the weights' dtype.
    bf16 = fits_this_machine(info, n_ctx=n_ctx, dtype="bfloat16", machine=MachineMemory(1 << 34, 1 << 34, None))
    assert bf16.kv_bytes == kv // 2
    gpu = MachineMemory(1 << 34, 1 << 34, GpuMemory("Test GPU", 1 << 34, 1 << 34))
    assert fits_this_machine(info, n_ctx=n_ctx, dtype="float32", machine=gpu).where == "gpu"
    per_layer = (info.n_params * 4 + kv) / info.n_layers
    small_gpu = MachineMemory(1 << 34, 1 << 34, GpuMemory("Test GPU", 1 << 30, int(2.5 * per_layer / 0.95)))
    partial = fits_this_machine(info, n_ctx=n_ctx, dtype="float32", machine=small_gpu)
    assert (partial.where, partial.gpu_layers) == ("gpu+cpu", 2) and "-ngl 2" in partial.reason
    assert fits_this_machine(info).n_ctx == min(info.context_length, 4096)  # this machine, defaults


def test_machine_facts_match_the_engine(monkeypatch):
    from app.common.machine import memory_limit_bytes

    monkeypatch.setenv("SPECULA_MEMORY_LIMIT", "3G")
    assert ram_available() == memory_limit_bytes() == 3 << 30
    monkeypatch.delenv("SPECULA_MEMORY_LIMIT")
    assert abs(ram_available() - memory_limit_bytes()) < 0.05 * memory_limit_bytes()
    sample = "NVIDIA H200, 143771, 142000\n"  # nvidia-smi --format=csv,noheader,nounits
    assert parse_nvidia_smi(sample) == GpuMemory("NVIDIA H200", 143771 << 20, 142000 << 20)
    assert parse_nvidia_smi("") is None


def test_drafts_same_vocabulary_smaller_best_first(hub, hub_files):
    main = read_gguf_info(hub_files["big"])
    assert family_query(main) == "tiny-llama"
    found = suggest_drafts(main, local=[], main_repo=REPO_BIG)
    # The 2-layer model (13% of the main) is nearer the ~10% sweet spot than the 1-layer one (4%);
    # the foreign vocabulary drafts through text, so it ranks after both whatever its size; the
    # gated repo is skipped, the main is too big.
    assert [s.repo_id for s in found] == [REPO_MID, REPO_SMALL, REPO_FOREIGN]
    assert [s.level for s in found] == ["token", "token", "text"]
    assert all(s.source == "hub" and check_compatibility(main, s.info) for s in found[:2])
    assert found[0].filename == "Tiny-Llama-2L-Q8_0.gguf"  # 8-bit preferred for drafts
    foreign = check_remote_pair(main, REPO_FOREIGN, "Tiny-Llama-Foreign-F16.gguf")
    assert foreign.text_level and not foreign.token.compatible


def test_drafts_from_the_library_rank_before_the_same_on_the_hub(hub, hub_files, tmp_path):
    folder = tmp_path / "lib"
    folder.mkdir()
    (folder / "draft.gguf").write_bytes(hub_files["small"].read_bytes())
    (folder / "main.gguf").write_bytes(hub_files["big"].read_bytes())
    main = read_gguf_info(folder / "main.gguf")
    local = list_local_models([folder], include_builtin=False)
    found = suggest_drafts(main, local=local, query="Tiny-Llama-1L")
    assert [(s.source, s.name) for s in found] == [("local", "draft.gguf"),
                                                   ("hub", f"{REPO_SMALL}/Tiny-Llama-1L-F32.gguf")]
    assert found[0].path == folder / "draft.gguf"
    assert suggest_drafts(main, local=local, search_hub=False)[0].source == "local"
