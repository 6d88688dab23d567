"""Layer drafts (app.engine.gguf.layer_draft, `specula make-draft`, `specula bench-pair`) on tiny real
GGUF files written by tests/tiny_gguf.py: what is written, that llama.cpp runs it as a draft
whose greedy speculation equals plain decoding, and the one-line errors that leave nothing."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

from app.engine.errors import ModelFileError, SpeculaError, UnsupportedModelError
from app.engine.gguf.layer_draft import (default_layers, format_layers, full_attention_layers, parse_layers,
                                    spread_layers, write_layer_draft)
from tests.llama_support import require_llama_cpp
from tests.tiny_gguf import TinySpec, write_tiny_gguf

KEEP = (0, 1, 3, 5)


@pytest.fixture(scope="module")
def main_file(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("layer-draft")
    return write_tiny_gguf(folder / "main.gguf", TinySpec(arch="llama", qtype="Q8_0", seed=4, n_layers=6))


@pytest.fixture(scope="module")
def draft_file(main_file, tmp_path_factory) -> Path:
    return write_layer_draft(main_file, KEEP, tmp_path_factory.mktemp("drafts") / "draft.gguf").path


def _raw(field) -> bytes:
    return b"".join(bytes(part) for part in field.parts)


def test_layer_lists_parse_and_print_back():
    assert parse_layers("0-2, 5,7-8,8", 10) == (0, 1, 2, 5, 7, 8)
    assert format_layers((0, 1, 2, 5, 7, 8)) == "0-2,5,7-8"
    kept = default_layers(30)
    assert kept[:3] == (0, 1, 2) and kept[-1] == 29 and 0 < len(kept) < 30
    assert parse_layers(format_layers(kept), 30) == kept
    assert spread_layers(18, 6, always=(5, 11, 17)) == (0, 1, 2, 5, 11, 17)
    assert len(spread_layers(30, 10)) == 10


@pytest.mark.parametrize("spec, words", [
    ("", "empty"), ("0-3,x", "'x'"), ("5-2", "backwards"), ("0-6", "layer 6"), ("0-5", "all 6 layers"),
    ("1;2", "'1;2'"),
])
def test_a_bad_layer_list_is_one_line(spec, words):
    with pytest.raises(SpeculaError) as caught:
        parse_layers(spec, 6)
    assert words in str(caught.value) and "\n" not in str(caught.value)


def test_the_draft_keeps_the_metadata_tokenizer_and_tensors_byte_for_byte(main_file, draft_file):
    main, draft = gguf.GGUFReader(str(main_file)), gguf.GGUFReader(str(draft_file))
    changed = {name for name, field in main.fields.items() if _raw(field) != _raw(draft.fields[name])}
    assert changed == {"GGUF.tensor_count", "GGUF.kv_count", "llama.block_count"}  # kv: our two keys
    assert draft.fields["llama.block_count"].contents() == len(KEEP)
    assert draft.fields["specula.layer_draft.kept_layers"].contents() == list(KEEP)
    source = {t.name: t for t in main.tensors}
    expected = [t.name for t in main.tensors if not t.name.startswith("blk.")] + [
        f"blk.{new}.{t.name.split('.', 2)[2]}" for new, old in enumerate(KEEP) for t in main.tensors
        if t.name.startswith(f"blk.{old}.")]
    assert sorted(t.name for t in draft.tensors) == sorted(expected)
    for tensor in draft.tensors:
        parts = tensor.name.split(".", 2)
        origin = source[f"blk.{KEEP[int(parts[1])]}.{parts[2]}" if parts[0] == "blk" else tensor.name]
        assert tensor.tensor_type == origin.tensor_type
        assert np.array_equal(np.asarray(tensor.data).view(np.uint8), np.asarray(origin.data).view(np.uint8))


def test_it_loads_on_llama_cpp_as_a_draft_whose_greedy_output_is_plain_decodings(main_file, draft_file):
    require_llama_cpp()
    from app.engine.backends.llamacpp.kv import LlamaSettings
    from app.engine.drafting.drafters import ModelDrafter
    from app.engine.drafting.factory import make_drafter
    from app.engine.pair_loader import PairSpec, load_draft_for
    from app.engine.loader import load_model
    from app.engine.events import DoneEvent
    from app.engine.loop.sampling import SamplingParams
    from app.engine.loop.speculative import DecodeSettings, generate

    # One thread: the answer does not depend on it, and two threads on a busy 2-core machine
    # wait on each other for whole time slices (100 ms a token measured here under load).
    one = LlamaSettings(threads=1)
    main = load_model(main_file, backend="llama.cpp", llama=one)
    draft, _ = load_draft_for(main, PairSpec(main_file, draft_file, backend="llama.cpp", llama=one))
    assert draft.model.n_layers == len(KEEP) == draft.info.n_layers
    assert draft.model.n_vocab == main.model.n_vocab
    assert list(draft.info.tokens()) == list(main.info.tokens())
    drafter = make_drafter(main, draft=draft)
    assert isinstance(drafter, ModelDrafter)
    ids = main.tokenizer.encode("def add(a, b):\n    return a + b\n\nThe quick brown fox")

    def reply(drafter=None, **settings):
        settings = DecodeSettings(max_new_tokens=40, sampling=SamplingParams(temperature=0.0), stop_token_ids=(),
                                  **settings)
        return next(e.summary for e in generate(main.kv_model(256), main.tokenizer, ids, drafter, settings)
                    if isinstance(e, DoneEvent))

    plain = reply()
    for settings in ({"draft_max": 4, "draft_p_min": 0.0, "adaptive_draft": False}, {}):
        speculative = reply(drafter, **settings)
        assert speculative.tokens == plain.tokens
    assert speculative.n_predicted == 40
    fixed = reply(drafter, draft_max=4, draft_p_min=0.0, adaptive_draft=False)
    assert fixed.n_drafted > 0 and fixed.tokens == plain.tokens


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_bad_layers_and_bad_files_are_one_line_and_leave_no_file(main_file, tmp_path):
    out = tmp_path / "draft.gguf"
    for keep in [(), (0, 6), tuple(range(6))]:
        with pytest.raises(SpeculaError) as caught:
            write_layer_draft(main_file, keep, out)
        assert "\n" not in str(caught.value)
    not_gguf = tmp_path / "notes.gguf"
    not_gguf.write_bytes(b"this is not a model\n" * 10)
    with pytest.raises(ModelFileError) as caught:
        write_layer_draft(not_gguf, (0,), out)
    assert "notes.gguf" in str(caught.value) and "\n" not in str(caught.value)
    with pytest.raises(SpeculaError, match="overwrite the main model"):
        write_layer_draft(main_file, (0, 1), main_file)
    assert _leftovers(tmp_path) == ["notes.gguf"]


def test_a_failed_write_leaves_nothing_behind(main_file, tmp_path, monkeypatch):
    def full_disk(self, *args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(gguf.GGUFWriter, "write_tensor_data", full_disk)
    with pytest.raises(SpeculaError, match="the disk is full"):
        write_layer_draft(main_file, KEEP, tmp_path / "draft.gguf")
    assert _leftovers(tmp_path) == []


def fake_gemma3(path: Path, n_layers: int = 8, alignment: int | None = None) -> Path:
    """A header-true gemma3 file (norms only: enough for our reader, not for llama.cpp). With
    `alignment`, general.alignment says so (any u32, as a hostile file may hold) and its padding
    is left as holes: a sparse file, small on disk whatever its apparent size."""
    writer = gguf.GGUFWriter(str(path), "gemma3")
    writer.add_block_count(n_layers)
    writer.add_embedding_length(8)
    writer.add_context_length(64)
    writer.add_head_count(1)
    writer.add_head_count_kv(1)
    writer.add_feed_forward_length(16)
    writer.add_uint32("gemma3.attention.sliding_window", 16)
    writer.add_tokenizer_model("llama")
    writer.add_token_list([f"t{i}" for i in range(32)])
    if alignment is not None:
        writer.add_uint32(gguf.Keys.General.ALIGNMENT, alignment)
        writer.data_alignment = alignment or 1
    tensors = {"token_embd.weight": np.zeros((32, 8), dtype=np.float32),
               **{f"blk.{i}.attn_norm.weight": np.full(8, i, dtype=np.float32) for i in range(n_layers)}}
    for name, array in tensors.items():
        writer.add_tensor_info(name, array.shape, array.dtype, array.nbytes)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    out = writer.fout[0]
    for array in tensors.values():
        out.seek(writer.ggml_pad(out.tell(), writer.data_alignment))
        out.write(array.tobytes())
    out.truncate(writer.ggml_pad(out.tell(), writer.data_alignment))
    writer.close()
    return path


def test_gemma_layers_keep_their_sliding_window_or_global_attention(tmp_path):
    """llama.cpp makes every 6th Gemma 3 layer global by index: renumbered, layer 11 would become
    sliding. The draft says which of its layers slide, as the original layers did."""
    from app.engine.gguf.info import read_gguf_info

    kept = (0, 4, 5, 6, 7)
    src = fake_gemma3(tmp_path / "gemma.gguf")
    assert full_attention_layers(read_gguf_info(src)) == (5,)  # every 6th: 5, 11, ...
    draft = write_layer_draft(src, kept, tmp_path / "draft.gguf")
    reader = gguf.GGUFReader(str(draft.path))
    pattern = reader.fields["gemma3.attention.sliding_window_pattern"]
    assert pattern.types == [gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.BOOL]
    assert [bool(v) for v in pattern.contents()] == [True, True, False, True, True]
    norms = {t.name: float(np.asarray(t.data)[0]) for t in reader.tensors if t.name.startswith("blk.")}
    assert [norms[f"blk.{i}.attn_norm.weight"] for i in range(len(kept))] == [float(k) for k in kept]
    assert full_attention_layers(read_gguf_info(draft.path)) == (2,)  # read back from the array


def test_an_architecture_with_irregular_layers_is_refused(tmp_path):
    src = fake_gemma3(tmp_path / "gemma.gguf")
    data = src.read_bytes().replace(b"gemma3", b"gemm3n")  # the same length: the header stays whole
    other = tmp_path / "other.gguf"
    other.write_bytes(data)
    with pytest.raises(UnsupportedModelError, match="'gemm3n'"):
        write_layer_draft(other, (0, 1), tmp_path / "draft.gguf")
    assert not (tmp_path / "draft.gguf").exists()


def test_bench_pair_is_registered_by_build_parser_not_by_make_draft():
    """Each command's module registers its own command only; build_parser lists them all, so a
    newcomer finds `bench-pair` where every other command is (issue 49 item 7)."""
    import argparse

    from app.cli import build_parser, make_draft

    alone = argparse.ArgumentParser().add_subparsers()
    make_draft.register(alone)
    assert list(alone.choices) == ["make-draft"]
    commands = next(action for action in build_parser()._actions if isinstance(action, argparse._SubParsersAction))
    assert {"make-draft", "bench-pair"} <= set(commands.choices)


def test_make_draft_and_bench_pair_run_end_to_end(main_file, tmp_path, capsys):
    from app.cli import main as cli

    out = tmp_path / "cli-draft.gguf"
    assert cli(["make-draft", str(main_file), "--keep", "0-1,4-5", "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"wrote {out}: 4 of 6 layers (0-1,4-5)" in printed
    assert gguf.GGUFReader(str(out)).fields["llama.block_count"].contents() == 4

    assert cli(["make-draft", str(main_file)]) == 0  # the default layers, into Specula's cache
    written = Path(capsys.readouterr().out.split(": ", 1)[0].removeprefix("wrote "))
    assert written.exists() and written.parent.name == "drafts"

    assert cli(["make-draft", str(main_file), "--keep", "0-9", "-o", str(tmp_path / "bad.gguf")]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("specula: error: bad layer list") and "\n" not in err
    assert not (tmp_path / "bad.gguf").exists()

    require_llama_cpp()
    pytest.importorskip("llama_cpp")
    assert cli(["bench-pair", "-m", str(main_file), "-md", str(out), "-n", "12", "-r", "1", "--prompts", "chat",
                "-t", "1"]) == 0
    table = capsys.readouterr().out
    for row in ("(a) llama.cpp generate", "(b) ours, no draft", "(c) ours + draft, adaptive",
                "(c) ours + draft, fixed 4", "(d) llama.cpp + draft, 4", "not exposed by the binding"):
        assert row in table
    assert "4 of 6 layers" in table


@pytest.mark.parametrize("alignment", [4 << 20, 2**31, 3, 0])
def test_an_absurd_alignment_is_one_line_and_writes_nothing(tmp_path, capsys, alignment):
    """Issue 51 item 5: a 4 MiB alignment with holes punched in the padding (1.17 GB apparent,
    94 MB on disk) made make-draft write 940 MB; 3 and 0 are no alignment at all."""
    from app.cli import main as cli

    src = fake_gemma3(tmp_path / "aligned.gguf", alignment=alignment)
    out = tmp_path / "draft.gguf"
    with pytest.raises(ModelFileError) as caught:
        write_layer_draft(src, (0, 4, 5, 6, 7), out)
    message = str(caught.value)
    assert "\n" not in message and "aligned.gguf" in message and f"general.alignment {alignment}" in message
    assert cli(["make-draft", str(src), "--keep", "0-5", "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and f"general.alignment {alignment}" in err
    assert _leftovers(tmp_path) == ["aligned.gguf"]


def test_the_draft_has_the_default_alignment_and_the_size_its_disk_check_planned(main_file, tmp_path):
    """A 64 KiB alignment (the most the reader accepts) is not copied: the draft is 32-aligned,
    and the disk check counted its padding, so it planned the file's exact size."""
    src = fake_gemma3(tmp_path / "aligned.gguf", alignment=64 << 10)
    drafts = [write_layer_draft(source, (0, 1, 3), tmp_path / f"{source.stem}-draft.gguf") for source in (src, main_file)]
    for draft in drafts:
        reader = gguf.GGUFReader(str(draft.path))
        assert reader.alignment == 32 and "general.alignment" not in reader.fields
        assert all(t.data_offset % 32 == 0 for t in reader.tensors)
        assert draft.planned_size == draft.size == draft.path.stat().st_size
    assert drafts[0].size < 4096 and src.stat().st_size == 10 * (64 << 10)  # the header and 9 tensors, padded
