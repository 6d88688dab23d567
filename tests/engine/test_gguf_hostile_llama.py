"""The malformed-GGUF corpus through the llama.cpp backend (issue 42 item 14): for each hostile file,
`specula run -m FILE -p hi -n 2 --backend llama.cpp` exits non-zero with one line naming the file,
no traceback, no signal death, under a 4 GB address-space cap and a time limit. Files our header
checks pass but llama.cpp refuses also go through `--backend auto`.

One subprocess (tests/hostile_run_driver.py) imports the app once and forks a child per file, so a
llama.cpp crash ends only that child and the whole corpus costs seconds, not a minute of imports.

Found here: llama.cpp's GGML_ASSERTs abort the process (SIGABRT) on files that passed our checks,
a token text twice (llama-vocab.cpp: id_to_token/token_to_id sizes), a file without a vocabulary
(tokenizer.ggml.model none), a NaN or negative norm epsilon (ggml-cpu's norm); a negative rope
base made every logit NaN and run a traceback. The header reader now refuses each in one line.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from app.engine.errors import ModelFileError
from app.engine.gguf.info import parse_gguf_header, read_gguf_info
from tests.header_gguf import make_tokens, small_tensors, write_gguf
from tests.llama_support import require_llama_cpp
from tests.engine.test_gguf_hostile import BEYOND, DISAGREE, TYPED, _Gen, _edited, _key, _raw_header, set_scalar

ROOT = Path(__file__).resolve().parents[2]
CHILD_SECONDS = 60  # each file's child is killed (SIGALRM) past this


# --- in-place edits of the tiny model (same size: the rest of the file stays valid) ------------

def _value_at(data: bytearray, key: str) -> int:
    needle = struct.pack("<Q", len(key)) + key.encode()
    return data.index(needle) + len(needle) + 4  # past the u32 value type


def _tensor_at(data: bytearray, name: str) -> int:
    """Offset of the tensor info's n_dims field."""
    needle = struct.pack("<Q", len(name)) + name.encode()
    return data.index(needle, 24) + len(needle)


def _offset_at(data: bytearray, name: str) -> int:
    at = _tensor_at(data, name)
    return at + 4 + 8 * struct.unpack_from("<I", data, at)[0] + 4  # past n_dims, the dims, the type


def _offset(data: bytearray, name: str) -> int:
    return struct.unpack_from("<Q", data, _offset_at(data, name))[0]


def _set_offset(data: bytearray, name: str, offset: int) -> None:
    struct.pack_into("<Q", data, _offset_at(data, name), offset)


def _header(data: bytearray):
    return parse_gguf_header(bytes(data), "tiny.gguf")


def _replace_in_header(data: bytearray, old: bytes, new: bytes, count: int = -1) -> None:
    end = _header(data).data_offset
    assert len(old) == len(new) and old in data[:end]
    data[:end] = bytes(data[:end]).replace(old, new, count)


def _set_float(key: str, value: float):
    return lambda data: struct.pack_into("<f", data, _value_at(data, key), value)


def _duplicate_token(data: bytearray) -> None:
    """Give a merge token the text of the one before it (two of one length, from id 300 on)."""
    tokens = _header(data).metadata["tokenizer.ggml.tokens"]
    a = next(i for i in range(300, len(tokens)) if len(tokens.raw(i)) == len(tokens.raw(i + 1)))
    old = tokens.raw(a + 1)
    at = data.index(struct.pack("<Q", len(old)) + old, 24) + 8
    data[at:at + len(old)] = tokens.raw(a)


# name -> edit of the tiny model. What llama.cpp aborted on (SIGABRT from a GGML_ASSERT) or ran to
# NaN logits, each after our checks had passed the file; and layouts ggml's reader refuses that
# torch read as overlapping or shifted weights. The header reader refuses them all now.
ABORTED = {
    "token-twice": _duplicate_token,
    "vocab-none": lambda d: _replace_in_header(d, b"\x04\x00\x00\x00\x00\x00\x00\x00gpt2", b"\x04\x00\x00\x00\x00\x00\x00\x00none", 1),
    "eps-nan": _set_float("llama.attention.layer_norm_rms_epsilon", float("nan")),
    "eps-negative": _set_float("llama.attention.layer_norm_rms_epsilon", -1e-5),
    "rope-base-negative": _set_float("llama.rope.freq_base", -1.0),
    "rope-base-zero": _set_float("llama.rope.freq_base", 0.0),
    "tensor-twice": lambda d: _replace_in_header(d, b"blk.1.ffn_norm.weight", b"blk.0.ffn_norm.weight"),
    "offset-misaligned": lambda d: _set_offset(d, "blk.0.attn_q.weight", _offset(d, "blk.0.attn_q.weight") + 4),
    "offset-overlap": lambda d: _set_offset(d, "blk.1.attn_q.weight", _offset(d, "blk.0.attn_q.weight")),
}
ABORTED_KEYS = {"token-twice": "tokenizer.ggml.tokens", "vocab-none": "tokenizer.ggml.model",
                "eps-nan": "layer_norm_rms_epsilon", "eps-negative": "layer_norm_rms_epsilon",
                "rope-base-negative": "llama.rope.freq_base", "rope-base-zero": "llama.rope.freq_base",
                "tensor-twice": "blk.0.ffn_norm.weight", "offset-misaligned": "blk.0.attn_q.weight",
                "offset-overlap": "blk.1.attn_q.weight"}

# Files our checks pass and llama.cpp itself refuses: no architecture or tokenizer it knows, a
# tensor it needs missing.
LLAMA_REFUSES = {
    "arch-unknown": lambda d: _replace_in_header(d, b"llama", b"llamz"),
    "tokenizer-unknown": lambda d: _replace_in_header(d, b"\x04\x00\x00\x00\x00\x00\x00\x00gpt2", b"\x04\x00\x00\x00\x00\x00\x00\x00gpt3", 1),
    "tensor-missing": lambda d: _replace_in_header(d, b"blk.1.ffn_up.weight", b"blk.1.ffn_uq.weight"),
}


def _edit(tiny: Path, folder: Path, name: str, fn) -> Path:
    data = bytearray(tiny.read_bytes())
    fn(data)
    path = folder / f"{name}.gguf"
    path.write_bytes(bytes(data))
    return path


# --- the corpus ------------------------------------------------------------------------------------

N_FUZZ_MODEL, N_FUZZ_HEADER = 12, 4


def build_corpus(tiny: Path, folder: Path) -> dict[str, Path]:
    """name -> file: the hostile files of tests/engine/test_gguf_hostile.py and tests/cli/test_cli.py, the
    ones above, and fuzz (header bytes of the tiny model mutated; generated headers)."""
    files: dict[str, Path] = {}
    for key, value in DISAGREE:
        path = folder / f"disagree-{_key_name(key)}-{value}.gguf"
        shutil.copyfile(tiny, path)
        set_scalar(path, key, value)
        files[path.stem] = path
    for key, value in BEYOND:
        path = _edited(tiny, folder, key, value)
        files[f"beyond-{path.stem}"] = path
    for case, (_, kwargs) in TYPED.items():
        files[f"typed-{case}"] = write_gguf(folder / f"typed-{case}.gguf", **kwargs)
    count = 1_000_000
    nested = folder / "nested.gguf"
    nested.write_bytes(_raw_header(_key("x.nested") + struct.pack("<IIQ", 9, 9, count)
                                   + struct.pack("<IQ", 4, 0) * count, 1))
    files["nested"] = nested
    for what, header in (("kv", _raw_header(b"", 2**40)), ("tensors", _raw_header(b"", 0, 2**40))):
        files[f"counts-{what}"] = folder / f"counts-{what}.gguf"
        files[f"counts-{what}"].write_bytes(header + bytes(1000))
    files["split-part"] = write_gguf(folder / "m-00001-of-00002.gguf", n_layers=4, tensors=small_tensors(256, n_layers=2),
                                     extra=lambda w: (w.add_uint16("split.no", 0), w.add_uint16("split.count", 2)))
    data = tiny.read_bytes()
    info = read_gguf_info(tiny)
    for name, content in (("text", b"This is a text file, not a model.\n" * 10), ("empty", b""),
                          ("cut-half", data[: len(data) // 2]), ("cut-after-header", data[: info.data_offset + 1000])):
        files[name] = folder / f"{name}.gguf"
        files[name].write_bytes(content)
    files["offset-past-end"] = _edit(tiny, folder, "offset-past-end", lambda d: _set_offset(d, "output.weight", 10**9))
    for name, fn in {**ABORTED, **LLAMA_REFUSES}.items():
        files[name] = _edit(tiny, folder, name, fn)
    files.update(_fuzz(tiny, info.data_offset, folder))
    return files


def _key_name(key: str) -> str:
    return key.split(".", 1)[1].replace(".", "-")


def _fuzz(tiny: Path, header_end: int, folder: Path) -> dict[str, Path]:
    rng = random.Random(14)
    base = tiny.read_bytes()
    files = {}
    for i in range(N_FUZZ_MODEL):
        data = bytearray(base)
        for _ in range(rng.randint(1, 4)):
            at = rng.randrange(24, header_end)
            data[at] = rng.choice([0, 0xFF, 0x7F, 0x80, rng.randrange(256), data[at] ^ (1 << rng.randrange(8))])
        # One name, size and time for all: llama.cpp's step costs, measured once per model (seconds)
        # and cached by those, are measured once for the files llama.cpp runs.
        path = folder / f"fuzz-{i:02d}" / "fuzz.gguf"
        path.parent.mkdir()
        path.write_bytes(bytes(data))
        os.utime(path, (1e9, 1e9))
        files[f"fuzz-model-{i:02d}"] = path
    gen = _Gen(seed=14)
    for i in range(N_FUZZ_HEADER):
        files[f"fuzz-header-{i}"] = folder / f"fuzz-header-{i}.gguf"
        files[f"fuzz-header-{i}"].write_bytes(gen.header())
    return files


HOSTILE = ([f"disagree-{_key_name(k)}-{v}" for k, v in DISAGREE]
           + [f"beyond-{_key_name(k).replace('.', '-')}-{v}" for k, v in BEYOND]
           + [f"typed-{case}" for case in TYPED]
           + ["nested", "counts-kv", "counts-tensors", "split-part", "text", "empty", "cut-half",
              "cut-after-header", "offset-past-end", *ABORTED, *LLAMA_REFUSES])
FUZZ = [f"fuzz-model-{i:02d}" for i in range(N_FUZZ_MODEL)] + [f"fuzz-header-{i}" for i in range(N_FUZZ_HEADER)]
# Through --backend auto: what passes our checks but llama.cpp refuses, and tensor data cut short.
AUTO = ["cut-after-header", "offset-past-end", *ABORTED, *LLAMA_REFUSES]


@pytest.fixture(scope="module")
def corpus(tiny_paths, tmp_path_factory) -> dict[str, Path]:
    return build_corpus(tiny_paths["llama-f32"], tmp_path_factory.mktemp("hostile-llama"))


@pytest.fixture(scope="module")
def runs(corpus, tmp_path_factory) -> dict[tuple[str, str], dict]:
    """(backend, name) -> the child's {rc, stderr, seconds}, from one driver subprocess."""
    require_llama_cpp()
    jobs = [("llama.cpp", name) for name in HOSTILE + FUZZ] + [("auto", name) for name in AUTO]
    job_file = tmp_path_factory.mktemp("jobs") / "jobs.json"
    job_file.write_text(json.dumps([[backend, str(corpus[name])] for backend, name in jobs]))
    # GGML_NO_BACKTRACE: a GGML_ASSERT aborts at once, without running gdb for a backtrace (seconds).
    env = {**os.environ, "TRANSFORMERS_VERBOSITY": "error", "HF_HUB_OFFLINE": "1", "SPECULA_BACKEND": "",
           "GGML_NO_BACKTRACE": "1"}
    done = subprocess.run([sys.executable, "-m", "tests.hostile_run_driver", str(job_file), str(CHILD_SECONDS)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return dict(zip(jobs, json.loads(done.stdout.strip().splitlines()[-1])))


def _check_one_line(result: dict, path: Path) -> str:
    assert result["rc"] >= 0, f"killed by signal {-result['rc']} (14: the time limit): {result['stderr'][:600]}"
    assert result["rc"] != 0, result["stderr"][-400:]
    assert "Traceback" not in result["stderr"], result["stderr"][-1500:]
    lines = result["stderr"].strip().splitlines()
    assert len(lines) == 1, result["stderr"]
    assert path.name in lines[0], lines[0]
    assert result["seconds"] < 30, result
    return lines[0]


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_file_is_one_line_on_llama_cpp(runs, corpus, name):
    line = _check_one_line(runs["llama.cpp", name], corpus[name])
    assert line.startswith("specula: error: "), line


@pytest.mark.parametrize("name", FUZZ)
def test_fuzzed_file_runs_or_is_one_line_on_llama_cpp(runs, corpus, name):
    result = runs["llama.cpp", name]
    if result["rc"] != 0:  # a mutation of a token's text or the chat template may leave a valid model
        _check_one_line(result, corpus[name])


# auto's fallback: where llama.cpp refuses a file torch could run, torch tries it; if torch fails
# too, the one line names both causes.
AUTO_CASES = list(AUTO)


@pytest.mark.parametrize("name", AUTO_CASES)
def test_llama_cpp_refusals_are_one_line_on_auto(runs, corpus, name):
    """On auto, what our reader refuses never reaches either backend (one line); an architecture
    llama.cpp does not know is one line too (torch does not run it either, no fallback)."""
    _check_one_line(runs["auto", name], corpus[name])


@pytest.mark.parametrize("name", ABORTED)
def test_reader_refuses_what_aborted_llama_cpp(tiny_paths, tmp_path, name):
    path = _edit(tiny_paths["llama-f32"], tmp_path, name, ABORTED[name])
    with pytest.raises(ModelFileError) as exc:
        read_gguf_info(path)
    message = str(exc.value)
    assert "\n" not in message and path.name in message and ABORTED_KEYS[name] in message, message


def test_empty_token_named_as_llama_cpp_names_it_collides(tmp_path):
    """llama.cpp names an empty token `[EMPTY_<id>]`: beside a token of that very text, its map
    loses one and the same assert aborts."""
    tokens = make_tokens(256)
    tokens[10:12] = ["", "[EMPTY_10]"]
    path = write_gguf(tmp_path / "empty-token.gguf", tokens=tokens)
    with pytest.raises(ModelFileError, match=r"empty-token.gguf: metadata tokenizer.ggml.tokens has .*twice"):
        read_gguf_info(path)
