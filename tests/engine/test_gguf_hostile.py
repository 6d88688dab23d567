"""Hostile GGUF headers: values that disagree with the tensors, wrongly typed metadata, headers
that would make the parser allocate without bound, and a seeded fuzz of the parser. Every one must
end in one of our one-line errors (ModelFileError), fast, never another exception."""

from __future__ import annotations

import json
import math
import random
import shutil
import struct
import time
import tracemalloc
from pathlib import Path

import gguf
import numpy as np
import pytest

from app.engine.errors import ModelFileError
from app.engine.gguf.checks import check_tensor_table
from app.engine.gguf.format import format_info
from app.engine.gguf.info import parse_gguf_header, read_gguf_info
from app.engine.loader import load_model
from tests.header_gguf import make_tokens, small_tensors, write_gguf
from tests.tiny_gguf import TinySpec, write_tiny_gguf

_TYPE_OF = {4: "<I", 5: "<i", 10: "<Q", 11: "<q"}


def set_scalar(path: Path, key: str, value: int) -> None:
    """Overwrite the integer value of `key` in the file's header, in place (same type, same size),
    as a hand-edited copy of a real model would be."""
    data = bytearray(path.read_bytes())
    needle = struct.pack("<Q", len(key)) + key.encode()
    at = data.index(needle) + len(needle)
    vtype = struct.unpack_from("<I", data, at)[0]
    struct.pack_into(_TYPE_OF[vtype], data, at + 4, value)
    path.write_bytes(bytes(data))


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("hostile") / "tiny.gguf", TinySpec(arch="llama", qtype="F32"))


DISAGREE = [
    ("llama.block_count", 1_000_000),
    ("llama.block_count", 1),
    ("llama.block_count", 0),
    ("llama.attention.head_count", 8),
    ("llama.attention.head_count_kv", 1),
    ("llama.attention.head_count_kv", 3),
    ("llama.embedding_length", 4096),
]


@pytest.mark.parametrize("key, value", DISAGREE)
def test_header_disagreeing_with_tensors_is_refused_before_building(tiny_model, tmp_path, key, value):
    bad = tmp_path / "edited.gguf"
    shutil.copyfile(tiny_model, bad)
    set_scalar(bad, key, value)
    started = time.monotonic()
    with pytest.raises(ModelFileError) as exc:
        load_model(bad, device="cpu", dtype="float32")
    assert time.monotonic() - started < 5
    message = str(exc.value)
    assert "\n" not in message and bad.name in message
    assert key in message or (key.endswith("head_count") and "head_count" in message), message


def test_vocabulary_size_against_embedding(tmp_path):
    ok = write_gguf(tmp_path / "ok.gguf", n_layers=1)
    check_tensor_table(read_gguf_info(ok))
    bad = write_gguf(tmp_path / "bad.gguf", n_layers=1, tokens=make_tokens(300), tensors=small_tensors(256, n_layers=1))
    with pytest.raises(ModelFileError, match="tokenizer.ggml.tokens has 300 tokens but token_embd.weight has 256 rows"):
        check_tensor_table(read_gguf_info(bad))


def test_real_and_tiny_models_pass_the_tensor_check(demo_path, tiny_paths):
    for path in [*tiny_paths.values(), demo_path("smollm2-135m"), demo_path("gemma3-270m")]:
        check_tensor_table(read_gguf_info(path))


@pytest.mark.demo
def test_smollm2_with_a_million_layers_is_refused(demo_path, tmp_path):
    bad = tmp_path / "smollm2-edited.gguf"
    shutil.copyfile(demo_path("smollm2-135m"), bad)
    set_scalar(bad, "llama.block_count", 1_000_000)
    started = time.monotonic()
    with pytest.raises(ModelFileError, match="llama.block_count = 1000000 disagrees with the tensors"):
        load_model(bad, device="cpu")
    assert time.monotonic() - started < 5


# --- wrongly typed metadata ---------------------------------------------------------------------

TYPED = {
    "name-array": ("general.name", dict(name=None, extra=lambda w: w.add_array("general.name", ["a", "b"]))),
    "model-array": ("tokenizer.ggml.model",
                    dict(vocab_type=None, extra=lambda w: w.add_array("tokenizer.ggml.model", ["gpt2"]))),
    "value-length-inf": ("llama.attention.value_length",
                         dict(extra=lambda w: w.add_float32("llama.attention.value_length", math.inf))),
    "value-length-nested": ("llama.attention.value_length",
                            dict(extra=lambda w: w.add_array("llama.attention.value_length", [[1], [2]]))),
    "template-array": ("tokenizer.chat_template",
                       dict(extra=lambda w: w.add_array("tokenizer.chat_template", ["x"]))),
    "tokens-numbers": ("tokenizer.ggml.tokens",
                       dict(tokens=[], extra=lambda w: w.add_array("tokenizer.ggml.tokens", [1, 2, 3]))),
    "bos-string": ("tokenizer.ggml.bos_token_id",
                   dict(bos=None, extra=lambda w: w.add_string("tokenizer.ggml.bos_token_id", "1"))),
    "context-negative": ("llama.context_length",  # an i64 instead of the u32 (gguf 0.17 refuses a key twice)
                         dict(context_length=None, extra=lambda w: w.add_int64("llama.context_length", -5))),
}


@pytest.fixture
def specula(capsys):
    from app.cli import main

    def call(*args: str) -> tuple[int, str, str]:
        capsys.readouterr()
        code = main(list(args))
        out, err = capsys.readouterr()
        return code, out, err

    return call


@pytest.mark.parametrize("case", TYPED)
def test_wrongly_typed_metadata_is_one_line_in_inspect_and_check_pair(tmp_path, specula, case):
    key, kwargs = TYPED[case]
    bad = write_gguf(tmp_path / f"{case}.gguf", **kwargs)
    good = write_gguf(tmp_path / "good.gguf")
    for args in (["inspect", str(bad)], ["inspect", "--json", str(bad)],
                 ["check-pair", str(good), str(bad)], ["check-pair", str(bad), str(good)]):
        code, out, err = specula(*args)
        assert code != 0 and out == "", (args, out)
        assert len(err.splitlines()) == 1 and "Traceback" not in err, err
        assert key in err and bad.name in err, err


# --- what parsing may allocate ------------------------------------------------------------------


def _raw_header(kvs: bytes, n_kv: int, n_tensors: int = 0) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", 3, n_tensors, n_kv) + kvs


def _key(name: str) -> bytes:
    return struct.pack("<Q", len(name)) + name.encode()


def test_a_million_empty_nested_arrays_are_refused_cheaply(tmp_path):
    count = 1_000_000
    empty = struct.pack("<IQ", 4, 0)  # an empty array of u32
    kv = _key("x.nested") + struct.pack("<IIQ", 9, 9, count) + empty * count
    bad = tmp_path / "nested.gguf"
    bad.write_bytes(_raw_header(kv, 1))
    assert bad.stat().st_size > 12_000_000
    tracemalloc.start()
    started = time.monotonic()
    try:
        with pytest.raises(ModelFileError, match="nested metadata arrays"):
            read_gguf_info(bad)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert time.monotonic() - started < 2
    assert peak < 16 * 2**20, peak


@pytest.mark.parametrize("what, header", [
    ("metadata entries", _raw_header(b"", 2**40)),
    ("tensors", _raw_header(b"", 0, 2**40)),
], ids=["kv", "tensors"])
def test_counts_beyond_the_file_are_refused_at_once(tmp_path, what, header):
    bad = tmp_path / "counts.gguf"
    bad.write_bytes(header + bytes(1000))
    with pytest.raises(ModelFileError, match=f"header claims {2**40} {what}, more than the file can hold"):
        read_gguf_info(bad)


# --- fuzz -----------------------------------------------------------------------------------------


class _Gen:
    """Seeded builder of GGUF headers from valid parts and hostile ones."""

    TYPES = (0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12)
    SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
    KEYS = ("general.architecture", "general.name", "general.alignment", "llama.block_count",
            "llama.embedding_length", "llama.attention.head_count", "llama.attention.head_count_kv",
            "llama.attention.key_length", "llama.attention.value_length", "llama.context_length",
            "tokenizer.ggml.model", "tokenizer.ggml.tokens", "tokenizer.ggml.merges",
            "tokenizer.ggml.bos_token_id", "tokenizer.chat_template", "tokenizer.ggml.token_type",
            "general.file_type", "x.other")

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def count(self) -> int:
        r = self.rng.random()
        if r < 0.1:
            return self.rng.choice([2**32 - 1, 2**63, 2**64 - 1, 2**40])
        return self.rng.randrange(0, 5)

    def string(self) -> bytes:
        if self.rng.random() < 0.08:
            return struct.pack("<Q", (self.count() + 10**9) % 2**64)  # a length past any file
        text = self.rng.choice(["llama", "", "gpt2", "ü\xff", "{{ x }}", "a" * 40]).encode("utf-8", "surrogateescape")
        if self.rng.random() < 0.05:
            text = b"\xff\xfe" + text  # not UTF-8
        return struct.pack("<Q", len(text)) + text

    def value(self, vtype: int, depth: int = 0) -> bytes:
        if vtype == 8:
            return self.string()
        if vtype == 9:
            etype = self.rng.choice(self.TYPES + (13, 99)) if depth < 6 else 4
            n = self.count()
            head = struct.pack("<IQ", etype, n)
            return head + b"".join(self.value(etype, depth + 1) for _ in range(min(n, 4)))
        if vtype not in self.SIZES:
            return b""
        if vtype in (6, 12) and self.rng.random() < 0.3:
            fmt = "<f" if vtype == 6 else "<d"
            return struct.pack(fmt, self.rng.choice([math.inf, -math.inf, math.nan, -1.0, 1e30]))
        return bytes(self.rng.randrange(256) for _ in range(self.SIZES[vtype]))

    def header(self) -> bytes:
        kvs = []
        for _ in range(self.rng.randrange(0, 8)):
            key = self.rng.choice(self.KEYS).encode()
            vtype = self.rng.choice(self.TYPES + (42,))
            kvs.append(struct.pack("<Q", len(key)) + key + struct.pack("<I", vtype) + self.value(vtype))
        tensors = []
        for i in range(self.rng.randrange(0, 4)):
            name = self.rng.choice([b"token_embd.weight", b"blk.0.attn_q.weight", b"output.weight",
                                    f"blk.{self.count()}.attn_k.weight".encode()])
            dims = [self.rng.choice([0, 1, 32, 64, 2**40]) for _ in range(self.rng.choice([0, 1, 2, 2, 9]))]
            tensors.append(struct.pack("<Q", len(name)) + name + struct.pack("<I", len(dims))
                           + b"".join(struct.pack("<Q", d) for d in dims)
                           + struct.pack("<IQ", self.rng.choice([0, 1, 8, 30, 1000]), self.rng.choice([0, 32, 2**60])))
        n_kv = len(kvs) if self.rng.random() < 0.8 else self.count()
        n_tensors = len(tensors) if self.rng.random() < 0.8 else self.count()
        version = self.rng.choice([3, 3, 3, 2, 1, 2**24])
        data = b"GGUF" + struct.pack("<IQQ", version, n_tensors, n_kv) + b"".join(kvs) + b"".join(tensors)
        return self.mutate(data)

    def mutate(self, data: bytes) -> bytes:
        r = self.rng.random()
        if r < 0.2 and data:
            return data[: self.rng.randrange(len(data))]
        if r < 0.4 and len(data) > 24:
            raw = bytearray(data)
            for _ in range(self.rng.randint(1, 3)):
                raw[self.rng.randrange(4, len(raw))] = self.rng.randrange(256)
            return bytes(raw) + bytes(self.rng.randrange(0, 256))
        return data + bytes(self.rng.randrange(0, 512))


def _exercise(info) -> None:
    """What the library, inspect and check-pair do with a header that parsed."""
    format_info(info)
    json.dumps(info.to_dict())
    info.memory_bytes()
    info.kv_bytes_per_token()
    list(info.tokens()[:4])
    check_tensor_table(info)


def test_fuzzed_headers_give_only_model_file_errors(tmp_path):
    real = write_gguf(tmp_path / "real.gguf", n_layers=1, merges=["t o"], chat_template="{{ x }}").read_bytes()
    gen = _Gen(seed=16)
    path = tmp_path / "fuzz.gguf"
    deadline = time.monotonic() + 4
    cases = 0
    while time.monotonic() < deadline:
        data = gen.header() if cases % 2 else gen.mutate(real)
        cases += 1
        for attempt in ("file", "buffer"):
            try:
                if attempt == "file":
                    path.write_bytes(data)
                    info = read_gguf_info(path)
                else:
                    info = parse_gguf_header(data, "repo/fuzz.gguf", file_size=len(data) + gen.rng.choice([0, 10**6]))
                _exercise(info)
            except ModelFileError as exc:
                assert "\n" not in str(exc)
    assert cases > 200


# --- header keys beyond the tensors, on every entry ----------------------------------------------

# Keys transformers' config believes (fastload.config_dict) that the tensors contradict: each sized
# calibrate's shaped model (2,000,000 tokens: 68 s to a 15 GB peak on SmolLM2) or raised inside it.
BEYOND = [("llama.vocab_size", 2_000_000), ("llama.vocab_size", 10**9),
          ("llama.feed_forward_length", 0), ("llama.feed_forward_length", 10**6),
          ("llama.rope.dimension_count", 0), ("llama.rope.dimension_count", 10**5),
          ("llama.rope.dimension_count", 6)]


def _edited(tiny_model: Path, folder: Path, key: str, value: int) -> Path:
    bad = folder / f"{key.split('.', 1)[1].replace('.', '-')}-{value}.gguf"
    shutil.copyfile(tiny_model, bad)
    set_scalar(bad, key, value)
    return bad


@pytest.mark.parametrize("key, value", BEYOND)
def test_keys_beyond_the_tensors_are_refused_by_the_header_reader(tiny_model, tmp_path, key, value):
    from app.engine.backends.torch import fastload
    from app.hub.library import list_local_models
    from app.hub.library_entries import scan_library

    bad = _edited(tiny_model, tmp_path, key, value)
    for read in (read_gguf_info, lambda p: fastload.config_dict(read_gguf_info(p))):
        with pytest.raises(ModelFileError) as exc:
            read(bad)
        assert str(exc.value).count("\n") == 0 and key in str(exc.value) and bad.name in str(exc.value)
    (listed,) = [m for m in list_local_models([tmp_path], include_builtin=False) if m.path == bad]
    assert not listed.usable and key in listed.error, listed.error
    (entry,) = [e for e in scan_library([str(bad)], [], builtins=False) if e.path == str(bad)]
    assert entry.info is None and key in entry.error, entry  # the window's library


@pytest.mark.parametrize("key, value", BEYOND)
def test_keys_beyond_the_tensors_are_one_line_in_every_command(tiny_model, tmp_path, specula, key, value):
    bad = _edited(tiny_model, tmp_path, key, value)
    good = str(tiny_model)
    for args in (["inspect", str(bad)], ["inspect", "--json", str(bad)], ["check-pair", good, str(bad)],
                 ["check-pair", str(bad), good], ["calibrate", str(bad)],
                 ["bench", "-m", str(bad), "-n", "4"], ["compare", "-m", str(bad), "--drafts", "none"],
                 ["serve", "-m", str(bad), "--port", "0"], ["run", "-m", str(bad), "-p", "hi", "-n", "2"]):
        started = time.monotonic()
        code, out, err = specula(*args)
        assert code != 0 and time.monotonic() - started < 10, (args, code, out, err)
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, (args, err)
        assert key in err and bad.name in err, (args, err)


def test_a_split_models_first_part_is_listed_but_not_built(tmp_path):
    """gguf-split's first part holds only some layers: the reader lists it (the library shows the
    model), the loader and calibrate's config refuse it."""
    from app.engine.backends.torch import fastload

    part = write_gguf(tmp_path / "m-00001-of-00002.gguf", n_layers=4, tensors=small_tensors(256, n_layers=2),
                      extra=lambda w: (w.add_uint16("split.no", 0), w.add_uint16("split.count", 2)))
    info = read_gguf_info(part)
    assert info.n_layers == 4
    with pytest.raises(ModelFileError, match="block_count = 4 disagrees"):
        fastload.config_dict(info)


# --- general.alignment (issue 51 item 5) ----------------------------------------------------------

ALIGNMENTS = {  # the key as a writer would store it -> what the one line must say
    "4MiB": (lambda w: w.add_uint32("general.alignment", 4 << 20), "general.alignment 4194304"),
    "128KiB": (lambda w: w.add_uint32("general.alignment", 128 << 10), "general.alignment 131072"),
    "three": (lambda w: w.add_uint32("general.alignment", 3), "general.alignment 3"),
    "zero": (lambda w: w.add_uint32("general.alignment", 0), "general.alignment 0"),
    "u64": (lambda w: w.add_uint64("general.alignment", 32), "must be a u32"),  # llama.cpp and gguf-py refuse it
}


@pytest.mark.parametrize("case", ALIGNMENTS)
def test_an_absurd_alignment_is_one_line_in_every_reader(tmp_path, specula, case):
    """Padding to general.alignment counts in every size read from a file: the reader accepts a
    u32 power of two up to 64 KiB (writers use 32), and refuses any other in one line naming the
    file and the value, wherever a header is read: inspect, check-pair, run (the loader), the
    library, the window's library and the header of a file on the hub."""
    from app.hub.library import list_local_models
    from app.hub.library_entries import scan_library

    extra, words = ALIGNMENTS[case]
    bad, good = write_gguf(tmp_path / f"{case}.gguf", extra=extra), write_gguf(tmp_path / "good.gguf")
    for read in (read_gguf_info, lambda p: parse_gguf_header(p.read_bytes(), p.name, p.stat().st_size)):
        with pytest.raises(ModelFileError) as exc:
            read(bad)
        assert "\n" not in str(exc.value) and words in str(exc.value) and bad.name in str(exc.value)
    (listed,) = [m for m in list_local_models([tmp_path], include_builtin=False) if m.path == bad]
    assert not listed.usable and words in listed.error, listed.error
    (entry,) = [e for e in scan_library([str(bad)], [], builtins=False) if e.path == str(bad)]
    assert entry.info is None and words in entry.error, entry
    for args in (["inspect", str(bad)], ["check-pair", str(good), str(bad)], ["run", "-m", str(bad), "-p", "hi", "-n", "2"]):
        code, out, err = specula(*args)
        assert code != 0 and out == "", (args, out)
        assert len(err.splitlines()) == 1 and "Traceback" not in err and words in err and bad.name in err, (args, err)


def test_alignments_up_to_64_kib_are_read(tmp_path):
    for alignment in (1, 32, 4096, 64 << 10):
        path = write_gguf(tmp_path / f"a{alignment}.gguf", extra=lambda w: w.add_custom_alignment(alignment))
        info = read_gguf_info(path)
        assert info.metadata["general.alignment"] == alignment and info.data_offset % alignment == 0
        assert info.data_offset == gguf.GGUFReader(str(path)).data_offset
