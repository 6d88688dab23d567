"""The fast GGUF loader builds exactly the model and tokenizer transformers' own GGUF path builds."""

from __future__ import annotations

import base64
import json
import logging
import os
import pickle
import stat
import subprocess
import sys

import numpy as np
import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from app.engine.backends.torch import fastload
from app.engine.errors import LoadCancelled, ModelFileError
from app.engine.gguf.info import read_gguf_info
from app.engine.loader import load_model
from tests.tiny_gguf import TinySpec, build_hf_model, write_tiny_gguf

SAMPLES = ["Hello, world!", "def f(a, b):\n    return a + b\n", "  spaces\tand\ttabs  ", "ünïcödé ✓ 漢字"]


def _transformers_model(path, dtype=torch.float32):
    return AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=dtype,
                                                local_files_only=True)


def assert_same_model(fast: torch.nn.Module, reference: torch.nn.Module) -> None:
    fast_state, ref_state = fast.state_dict(), reference.state_dict()
    assert set(fast_state) == set(ref_state)
    for name, tensor in ref_state.items():
        assert fast_state[name].dtype == tensor.dtype, name
        assert torch.equal(fast_state[name], tensor), f"{name} differs"
    fast_cfg, ref_cfg = fast.config.to_dict(), reference.config.to_dict()
    for key in ("_name_or_path", "quantization_config"):  # where it came from, not what it is
        fast_cfg.pop(key, None), ref_cfg.pop(key, None)
    assert fast_cfg == ref_cfg


@pytest.mark.parametrize("name", ["llama-f32", "llama-q8", "qwen2-f32", "qwen2-q8", "llama3-rope"])
def test_fast_model_equals_transformers_load(tiny_paths, name):
    path = tiny_paths[name]
    fast = fastload.build_model(read_gguf_info(path), torch.float32)
    assert_same_model(fast, _transformers_model(path))


def test_fast_model_in_bfloat16_equals_transformers_load(tiny_paths):
    path = tiny_paths["llama-q8"]
    fast = fastload.build_model(read_gguf_info(path), torch.bfloat16)
    assert_same_model(fast, _transformers_model(path, torch.bfloat16))


def test_config_matches_transformers(tiny_paths):
    for name in ("llama-f32", "qwen2-f32", "llama3-rope"):
        path = tiny_paths[name]
        ours = fastload.build_config(read_gguf_info(path)).to_dict()
        theirs = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name).to_dict()
        ours.pop("_name_or_path"), theirs.pop("_name_or_path")
        assert ours == theirs, name


def test_tokenizer_is_cached_and_identical(tiny_paths, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    info = read_gguf_info(tiny_paths["llama-f32"])
    reference = AutoTokenizer.from_pretrained(str(info.path.parent), gguf_file=info.path.name)
    first = fastload.load_tokenizer(info)
    entry = fastload.tokenizer_cache_file(info)
    assert entry.is_file()
    assert type(first) is type(reference)
    second = fastload.load_tokenizer(info)  # from the cache
    messages = [{"role": "user", "content": "Hi there"}]
    for tok in (first, second):
        for text in SAMPLES:
            assert tok.encode(text) == reference.encode(text)
            ids = reference.encode(text)
            assert tok.decode(ids) == reference.decode(ids)
        assert tok.chat_template == reference.chat_template
        assert tok.apply_chat_template(messages, tokenize=False) == reference.apply_chat_template(messages, tokenize=False)
        assert (tok.bos_token_id, tok.eos_token_id) == (reference.bos_token_id, reference.eos_token_id)
    assert not [p for p in entry.parent.iterdir() if p.name.startswith(".tmp-")]


def test_damaged_tokenizer_cache_is_rebuilt(tiny_paths, tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    info = read_gguf_info(tiny_paths["qwen2-f32"])
    fastload.load_tokenizer(info)
    entry = fastload.tokenizer_cache_file(info)
    entry.write_bytes(b"not a pickle")
    with caplog.at_level(logging.WARNING):
        tokenizer = fastload.load_tokenizer(info)
    assert "rebuilding" in caplog.text
    assert tokenizer.encode(SAMPLES[1]) == AutoTokenizer.from_pretrained(
        str(info.path.parent), gguf_file=info.path.name).encode(SAMPLES[1])


class _Payload:
    """Unpickling this runs code: it creates the file named in `marker`."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _same_tokenizer(tok, reference) -> None:
    for text in SAMPLES + ["<|im_start|>system\nhi<|im_end|>"]:
        assert tok.encode(text) == reference.encode(text)
        ids = reference.encode(text)
        assert tok.decode(ids) == reference.decode(ids)
    assert tok.chat_template == reference.chat_template
    assert (tok.bos_token_id, tok.eos_token_id) == (reference.bos_token_id, reference.eos_token_id)


def test_planted_pickle_is_never_loaded(tiny_paths, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    info = read_gguf_info(tiny_paths["llama-f32"])
    marker = tmp_path / "code-ran"
    payload = pickle.dumps(_Payload(str(marker)))
    folder = fastload.tokenizer_cache_dir()
    folder.mkdir(parents=True)
    key = fastload.header_key(info)
    (folder / f"{key}.pickle").write_bytes(payload)  # where the old cache kept it
    tokenizer = fastload.load_tokenizer(info)
    assert not marker.exists()
    entry = fastload.tokenizer_cache_file(info)  # and in place of both files of the new entry
    entry.write_bytes(payload)
    fastload.tokenizer_json_file(entry).write_bytes(payload)
    fastload.load_tokenizer(info)
    again = fastload.load_tokenizer(info)  # from the rebuilt entry
    assert not marker.exists()
    _same_tokenizer(again, tokenizer)
    assert json.loads(entry.read_text())["key"] == key


def test_an_entry_of_another_format_is_rebuilt_without_a_warning(tiny_paths, tmp_path, monkeypatch, caplog):
    """An entry written by another version of the cache (format 1 kept merges as a JSON list) is
    rebuilt in this format, quietly: an upgrade is not damage."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    info = read_gguf_info(tiny_paths["qwen2-f32"])
    fresh = fastload.build_tokenizer(info)
    fastload.load_tokenizer(info)
    entry = fastload.tokenizer_cache_file(info)
    entry.write_text(json.dumps(dict(json.loads(entry.read_text()), format=1)))
    fastload._warned.clear()
    with caplog.at_level(logging.INFO, logger=fastload.__name__):
        tokenizer = fastload.load_tokenizer(info)
    assert "another version's format" in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    _same_tokenizer(tokenizer, fresh)
    assert json.loads(entry.read_text())["format"] == fastload._CACHE_FORMAT


def _entry_edits():
    def wrong_key(meta, tok_json):
        meta["key"] = "0" * 32

    def path_argument(meta, tok_json):
        meta["kwargs"]["gguf_file"] = "/etc/passwd"

    def nested_value(meta, tok_json):
        meta["kwargs"]["bos_token"] = {"__class__": {"x": 1}}

    def other_class(meta, tok_json):
        meta["class"] = "Qwen2Tokenizer"

    def edited_tokenizer_json(meta, tok_json):
        tok_json.write_text(tok_json.read_text().replace('"<|im_end|>"', '"<|im_END|>"'))

    def missing_tokenizer_json(meta, tok_json):
        tok_json.unlink()

    def not_a_dict(meta, tok_json):
        meta.clear()

    return [wrong_key, path_argument, nested_value, other_class, edited_tokenizer_json,
            missing_tokenizer_json, not_a_dict]


@pytest.mark.parametrize("edit", _entry_edits(), ids=lambda f: f.__name__)
def test_wrong_or_mismatching_entry_is_a_cache_miss(tiny_paths, tmp_path, monkeypatch, caplog, edit):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    info = read_gguf_info(tiny_paths["llama-f32"])
    fresh = fastload.build_tokenizer(info)
    fastload.load_tokenizer(info)
    entry = fastload.tokenizer_cache_file(info)
    meta = json.loads(entry.read_text())
    edit(meta, fastload.tokenizer_json_file(entry))
    entry.write_text(json.dumps(meta))
    fastload._warned.clear()
    with caplog.at_level(logging.WARNING):
        tokenizer = fastload.load_tokenizer(info)
    assert caplog.text.count("rebuilding") == 1
    _same_tokenizer(tokenizer, fresh)
    assert json.loads(entry.read_text())["kwargs"].get("gguf_file") is None  # rewritten


def test_a_bpe_entry_is_split_and_reads_back_the_same(tiny_paths, tmp_path, monkeypatch, caplog):
    """A BPE tokenizer is cached as a skeleton tokenizer.json and its vocabulary and merges
    (app.engine.backends.torch.bpe_form): it reads back to the very tokenizer.json of a fresh build. A damaged
    model file is a rebuild; a split that would not read back the same is cached whole."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    info = read_gguf_info(tiny_paths["qwen2-f32"])
    fresh = fastload.build_tokenizer(info)
    fastload.load_tokenizer(info)
    entry = fastload.tokenizer_cache_file(info)
    skeleton, model = fastload.tokenizer_json_file(entry), fastload.bpe_model_file(entry)
    assert model.is_file() and json.loads(skeleton.read_text())["model"]["merges"] == []
    assert len(json.loads(skeleton.read_text())["model"]["vocab"]) < len(fresh)  # cut to the added tokens
    cached = fastload.load_tokenizer(info)
    assert cached.backend_tokenizer.to_str() == fresh.backend_tokenizer.to_str()
    _same_tokenizer(cached, fresh)

    model.write_text(model.read_text().replace("[", "[1, ", 1))  # another vocabulary, same shape
    fastload._warned.clear()
    with caplog.at_level(logging.WARNING):
        rebuilt = fastload.load_tokenizer(info)
    assert "rebuilding" in caplog.text
    assert rebuilt.backend_tokenizer.to_str() == fresh.backend_tokenizer.to_str()

    for path in (entry, skeleton, model):
        path.unlink()
    monkeypatch.setattr(fastload.bpe_form, "join", lambda backend, model: None)  # reads back otherwise
    fastload.load_tokenizer(info)
    assert not model.exists() and json.loads(entry.read_text())["bpe_sha256"] is None
    whole = fastload.load_tokenizer(info)
    assert whole.backend_tokenizer.to_str() == fresh.backend_tokenizer.to_str()


def test_a_split_model_naming_tokens_it_lacks_is_refused(tiny_paths, tmp_path, monkeypatch):
    """join checks the packed merges against the vocabulary (the entry's checksum comes first;
    this is the form's own check): an id past the vocabulary or half a pair is a ValueError."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    info = read_gguf_info(tiny_paths["qwen2-f32"])
    fastload.load_tokenizer(info)
    entry = fastload.tokenizer_cache_file(info)
    model = json.loads(fastload.bpe_model_file(entry).read_text())
    backend = fastload.load_tokenizer(info).backend_tokenizer
    for ids in ([len(model["vocab"]), 0], [0, 1, 2]):
        bad = dict(model, merges_u32le=base64.b64encode(np.array(ids, dtype="<u4").tobytes()).decode())
        with pytest.raises(ValueError):
            fastload.bpe_form.join(backend, json.dumps(bad))


@pytest.mark.skipif(os.name != "posix", reason="POSIX modes")
def test_cache_folder_and_files_are_private(tiny_paths, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    folder = fastload.tokenizer_cache_dir()
    folder.mkdir(parents=True, mode=0o755)
    os.chmod(folder, 0o755)  # as an older version left it
    info = read_gguf_info(tiny_paths["qwen2-f32"])
    fastload.load_tokenizer(info)
    entry = fastload.tokenizer_cache_file(info)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    files = [entry, fastload.tokenizer_json_file(entry), fastload.bpe_model_file(entry)]  # a split BPE entry
    for path in files:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert sorted(p.name for p in folder.iterdir()) == sorted(path.name for path in files)


def test_cache_folder_that_is_a_link_is_not_used(tiny_paths, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    fastload.tokenizer_cache_dir().parent.mkdir(parents=True)
    fastload.tokenizer_cache_dir().symlink_to(elsewhere)
    info = read_gguf_info(tiny_paths["qwen2-f32"])
    _same_tokenizer(fastload.load_tokenizer(info), fastload.build_tokenizer(info))
    assert list(elsewhere.iterdir()) == []


@pytest.mark.demo
def test_smollm2_cached_tokenizer_equals_fresh(demo_path, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    info = read_gguf_info(demo_path("smollm2-135m"))
    fresh = fastload.build_tokenizer(info)
    fastload.load_tokenizer(info)
    cached = fastload.load_tokenizer(info)
    assert type(cached) is type(fresh)
    _same_tokenizer(cached, fresh)
    messages = [{"role": "user", "content": "Hi there"}]
    assert cached.apply_chat_template(messages, tokenize=False) == fresh.apply_chat_template(messages, tokenize=False)
    assert cached.backend_tokenizer.to_str() == fresh.backend_tokenizer.to_str()
    assert fastload.bpe_model_file(fastload.tokenizer_cache_file(info)).is_file()  # read split


def test_missing_tensor_is_named(tmp_path):
    spec = TinySpec(arch="llama", qtype="F32", seed=5)
    state = build_hf_model(spec).state_dict()
    del state["model.layers.1.mlp.down_proj.weight"]

    class StateOnly:  # the writer's input: a model's tensors, one left out
        def state_dict(self):
            return state

    path = write_tiny_gguf(tmp_path / "holey.gguf", spec, StateOnly())
    with pytest.raises(ModelFileError, match="down_proj"):
        load_model(path, device="cpu", dtype="float32")


def test_cancel_stops_reading_weights(tiny_paths):
    seen = []
    with pytest.raises(LoadCancelled):
        load_model(tiny_paths["llama-f32"], device="cpu", dtype="float32",
                   progress=lambda stage, fraction: seen.append(stage),
                   cancel=lambda: "reading weights" in seen)
    assert "reading weights" in seen


def test_slow_path_is_still_available(tiny_paths, monkeypatch):
    monkeypatch.setenv("SPECULA_SLOW_LOAD", "1")
    slow = load_model(tiny_paths["llama-q8"], device="cpu", dtype="float32")
    monkeypatch.delenv("SPECULA_SLOW_LOAD")
    fast = load_model(tiny_paths["llama-q8"], device="cpu", dtype="float32")
    assert_same_model(fast.model, slow.model)


@pytest.mark.demo
@pytest.mark.parametrize("key", ["smollm2-135m", "gemma3-270m"])
def test_demo_models_fast_equals_transformers(demo_path, key):
    path = demo_path(key)
    info = read_gguf_info(path)
    assert fastload.can_fast_load(info)
    assert_same_model(fastload.build_model(info, torch.float32), _transformers_model(path))
    ours = fastload.build_tokenizer(info)
    reference = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    assert type(ours) is type(reference)
    for text in SAMPLES:
        assert ours.encode(text) == reference.encode(text)
    assert ours.chat_template == reference.chat_template


_PEAK_SCRIPT = """
import gc, sys
from app.engine.loader import load_model
def status(key):  # VmHWM, not ru_maxrss: the latter keeps the parent's peak across exec
    line = next(l for l in open('/proc/self/status') if l.startswith(key + ':'))
    return int(line.split()[1]) * 1024
gc.collect()
base = status('VmRSS')
loaded = load_model(sys.argv[1], device='cpu', dtype='bfloat16')
print(loaded.backend.name, base, status('VmRSS'), status('VmHWM'))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("key", ["smollm2-135m", "gemma3-270m"])
def test_loading_peaks_at_most_one_and_a_half_times_the_loaded_model(demo_path, key):
    """The torch backend's load (every weight dequantized, here to bf16) reads a tensor at a time:
    its peak stays near what the loaded model holds."""
    # A fresh process, so that the peak is this load's; the tokenizer cache is made warm first
    # (the second load is what the target is about).
    fastload.load_tokenizer(read_gguf_info(demo_path(key)))
    out = subprocess.run([sys.executable, "-c", _PEAK_SCRIPT, str(demo_path(key))],
                         capture_output=True, text=True, timeout=300, check=True).stdout.split()
    backend, base, after, peak = out[0], *map(int, out[1:])
    assert backend == "torch"
    assert peak - base <= 1.5 * (after - base), (base, after, peak)
