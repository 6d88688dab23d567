"""Self-speculative drafts: the main model with some of its decoder layers left out (layer skipping,
as in Zhang et al. 2023, "Draft & Verify"), written as a GGUF file of its own.

Such a draft has the main model's vocabulary, tokenizer, embeddings and output head by
construction (the same bytes), so it always pairs token by token; it needs no training and no
second download. `write_layer_draft` copies every metadata key (but general.alignment: a draft
has the default, 32) and non-layer tensor as it is (the same quantization types, the same bytes), keeps the chosen `blk.N` tensors renumbered
0..n-1, and updates what depends on the layer count: `<arch>.block_count`, any per-layer
metadata array, and, for architectures where llama.cpp derives sliding-window layers from the
layer index (Gemma 2/3), an explicit per-layer pattern so that every kept layer attends as it did.

The file is written under a hidden temporary name in the target's folder, checked by our own
header reader, and renamed: a half-written file never looks complete.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from app.engine.errors import ModelFileError, SpeculaError, UnsupportedModelError
from app.engine.gguf.format import format_bytes
from app.engine.gguf.info import GGUFInfo, read_gguf_info

log = logging.getLogger(__name__)

# Architectures whose decoder layers are alike, so that any subset of them is a model llama.cpp
# runs as the original's layers ran (read in llama.cpp's models/*.cpp of the binding's release).
# Others (hybrid recurrent models, MoE models with leading dense layers, multi-token-prediction
# layers, per-layer embeddings, rope or no-rope every n-th layer) are refused by name.
SUPPORTED_ARCHS = frozenset({
    "llama", "qwen2", "qwen3", "qwen2moe", "qwen3moe", "phi3", "gemma", "gemma2", "gemma3",
    "starcoder2", "stablelm", "olmo", "internlm2",
})
# Where llama.cpp marks sliding-window layers by index (load_swa_pattern(ml, period): every
# period-th layer global, the others sliding) unless the file holds a per-layer array.
SWA_PERIOD = {"gemma2": 2, "gemma3": 6}
# The share of layers a draft keeps by default, chosen by measuring teacher-forced top-1 agreement
# with the main model on its own greedy replies to the five bench prompts (96 tokens each), which
# is the per-token acceptance of greedy drafting. SmolLM2-135M (30 layers): 0.65 at 25 layers,
# 0.28 at 20, 0.01 at 15, 0.00 at 6; Gemma 3 270M (18): 0.92 at 17, 0.70 at 15 (its global layers
# kept), under 0.1 at 12 and 0.00 at 9 and 6. Models this small have few layers to spare.
DEFAULT_FRACTION = 5 / 6
DRAFT_KEYS = ("specula.layer_draft.kept_layers", "specula.layer_draft.source_block_count")

_LAYER_TENSOR = re.compile(r"blk\.(\d+)\.(.+)")
_SPEC_PART = re.compile(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?")


@dataclass(frozen=True)
class LayerDraft:
    """What write_layer_draft wrote."""

    path: Path
    kept: tuple[int, ...]  # the main model's layer indices, in order
    n_layers: int  # the main model's layer count
    size: int  # bytes
    planned_size: int  # the bytes the disk check asked for: the whole file, padding included

    def describe(self) -> str:
        return (f"{len(self.kept)} of {self.n_layers} layers ({format_layers(self.kept)}), "
                f"{format_bytes(self.size)}")


def parse_layers(spec: str, n_layers: int) -> tuple[int, ...]:
    """"0-5,10,28-29" -> (0, 1, 2, 3, 4, 5, 10, 28, 29): layer numbers and inclusive ranges,
    sorted, duplicates merged. One-line SpeculaError for anything else, for a layer the model
    does not have, and for a spec that keeps no layer or every layer."""
    text = spec.strip()
    if not text:
        raise SpeculaError("the layer list is empty: name the layers to keep, e.g. 0-5,10,28-29")
    kept: set[int] = set()
    for part in text.split(","):
        match = _SPEC_PART.fullmatch(part)
        if match is None:
            raise SpeculaError(f"bad layer list {spec!r}: {part.strip()!r} is neither a layer number "
                               "nor a range such as 3-7")
        first = int(match[1])
        last = int(match[2]) if match[2] is not None else first
        if last < first:
            raise SpeculaError(f"bad layer list {spec!r}: the range {first}-{last} runs backwards")
        if last >= n_layers:
            raise SpeculaError(f"bad layer list {spec!r}: layer {last} is past the model's last "
                               f"(it has {n_layers} layers, 0-{n_layers - 1})")
        kept.update(range(first, last + 1))
    return check_layers(kept, n_layers)


def check_layers(layers: Sequence[int] | set[int], n_layers: int) -> tuple[int, ...]:
    """The layers sorted and checked: at least one, none out of range, not every one."""
    kept = tuple(sorted(set(int(i) for i in layers)))
    if not kept:
        raise SpeculaError("the layer list keeps no layer")
    if kept[0] < 0 or kept[-1] >= n_layers:
        bad = kept[0] if kept[0] < 0 else kept[-1]
        raise SpeculaError(f"layer {bad} does not exist (the model has {n_layers} layers, 0-{n_layers - 1})")
    if len(kept) == n_layers:
        raise SpeculaError(f"the layer list keeps all {n_layers} layers: that is the main model itself, "
                           "which costs as much as it saves")
    return kept


def format_layers(layers: Sequence[int]) -> str:
    """(0, 1, 2, 5, 7, 8) -> "0-2,5,7-8": the shortest spec parse_layers reads back."""
    parts: list[str] = []
    run: list[int] = []
    for i in sorted(set(layers)):
        if run and i == run[-1] + 1:
            run.append(i)
            continue
        if run:
            parts.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
        run = [i]
    if run:
        parts.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
    return ",".join(parts)


def spread_layers(n_layers: int, n_keep: int, head: int = 3, tail: int = 1,
                  always: Sequence[int] = ()) -> tuple[int, ...]:
    """n_keep layers: the first `head` (they turn token embeddings into the residual stream: a
    SmolLM2 draft without layer 0 agreed with the model on 2% of tokens, without layer 1 on 24%),
    the last `tail`, the layers in `always`, and the rest spread evenly over the layers between."""
    if not 0 < n_keep < n_layers:
        raise SpeculaError(f"a draft keeps between 1 and {n_layers - 1} of the model's {n_layers} layers (asked {n_keep})")
    head, tail = min(head, n_keep), min(tail, max(0, n_keep - head))
    fixed = {*range(head), *range(n_layers - tail, n_layers), *(i for i in always if 0 <= i < n_layers)}
    middle = [i for i in range(n_layers) if i not in fixed]
    n_middle = max(0, min(len(middle), n_keep - len(fixed)))
    picked = [middle[round((i + 0.5) * len(middle) / n_middle - 0.5)] for i in range(n_middle)] if n_middle else []
    return check_layers([*fixed, *picked], n_layers)


def default_layers(n_layers: int, always: Sequence[int] = ()) -> tuple[int, ...]:
    """The layers a draft keeps unless told: DEFAULT_FRACTION of them, spread by spread_layers
    (the first three, the last, `always` -- a sliding-window model's global layers, see
    full_attention_layers -- and evenly between)."""
    if n_layers < 4:
        raise SpeculaError(f"the model has {n_layers} layers: too few to leave any out usefully")
    return spread_layers(n_layers, min(n_layers - 1, max(4, round(DEFAULT_FRACTION * n_layers))), always=always)


def full_attention_layers(info: GGUFInfo) -> tuple[int, ...]:
    """The layers that attend to the whole context in a model whose others use a sliding window
    (Gemma 2/3), as llama.cpp decides it; () for other models. A draft keeps them: without its
    first global layer (5) Gemma 3 270M agreed with itself on 4% of tokens, without layer 4 on 92%."""
    period = SWA_PERIOD.get(info.architecture)
    if period is None:
        return ()
    value = info.metadata.get(f"{info.architecture}.attention.sliding_window_pattern")
    if value is not None and hasattr(value, "__len__"):  # a per-layer array
        return tuple(i for i, sliding in enumerate(value) if not sliding)
    period = int(value) if value is not None else period
    return tuple(i for i in range(info.n_layers) if period != 0 and i % period == period - 1)


def default_output(main_path: str | os.PathLike[str], kept: Sequence[int], folder: str | os.PathLike[str]) -> Path:
    """`<folder>/<main file's stem>.layers-<spec>.gguf` (commas as underscores)."""
    spec = format_layers(kept).replace(",", "_")
    return Path(folder) / f"{Path(main_path).stem}.layers-{spec}.gguf"


def write_layer_draft(main_path: str | os.PathLike[str], keep_layers: Sequence[int],
                      out_path: str | os.PathLike[str]) -> LayerDraft:
    """Write the main model with only `keep_layers` (its layer indices) to out_path (replacing
    it). Raises one-line SpeculaErrors: a file that is not a readable GGUF model, an architecture
    whose layers cannot be left out, a bad layer list, a full disk; nothing is left behind then."""
    import gguf  # the hub's and the engine's dependency already; imported when used

    main_path, out_path = Path(main_path), Path(out_path)
    info = read_gguf_info(main_path)  # our header checks first: a whole, self-consistent GGUF
    arch = info.architecture
    if arch not in SUPPORTED_ARCHS:
        raise UnsupportedModelError(f"{main_path.name}: cannot leave layers out of a {arch!r} model "
                                    f"(layer drafts support {', '.join(sorted(SUPPORTED_ARCHS))})")
    n_layers = info.n_layers
    kept = check_layers(keep_layers, n_layers)
    if _as_int(info.metadata.get(f"{arch}.nextn_predict_layers")):
        raise UnsupportedModelError(f"{main_path.name}: its last layers predict further tokens (MTP); "
                                    "leaving layers out would mix them up")
    if out_path.exists() and out_path.resolve() == main_path.resolve():
        raise SpeculaError(f"{out_path.name}: the draft would overwrite the main model; choose another -o")

    try:
        reader = gguf.GGUFReader(str(main_path))
    except (ValueError, OSError) as exc:
        raise ModelFileError(f"{main_path.name}: gguf could not read it ({exc})") from None
    if reader.endianess != gguf.GGUFEndian.LITTLE:
        raise UnsupportedModelError(f"{main_path.name}: a big-endian GGUF file; layer drafts are written little-endian only")

    renamed = _renamed_tensors(reader, kept, main_path.name)
    folder = out_path.parent if str(out_path.parent) else Path(".")
    if not folder.is_dir():
        raise SpeculaError(f"{folder}: no such folder for the draft")

    handle, staging_name = tempfile.mkstemp(prefix=f".{out_path.name[:60]}.", suffix=".tmp", dir=folder)
    os.close(handle)
    staging = Path(staging_name)
    try:
        # The default alignment, not the input's: a larger one only adds padding (see MAX_ALIGNMENT).
        writer = gguf.GGUFWriter(staging, arch)
        _copy_metadata(reader, writer, arch, kept, n_layers)
        for tensor, name in renamed:
            writer.add_tensor_info(name, tensor.data.shape, tensor.data.dtype, tensor.data.nbytes, tensor.tensor_type)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()  # flushed: the staging file holds the whole header now
        written = staging.stat().st_size
        planned = gguf.GGUFWriter.ggml_pad(written, writer.data_alignment) + _data_size(renamed, writer.data_alignment)
        _check_space(folder, planned - written)
        for tensor, _ in renamed:
            writer.write_tensor_data(tensor.data, tensor_endianess=reader.endianess)
        writer.close()
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(staging, 0o666 & ~umask)  # a model file like any other, not mkstemp's 0600
        read_gguf_info(staging)  # what we wrote passes the checks every load makes
        os.replace(staging, out_path)
    except OSError as exc:
        staging.unlink(missing_ok=True)
        cause = "the disk is full" if getattr(exc, "errno", None) == 28 else (exc.strerror or str(exc))
        raise SpeculaError(f"could not write {out_path.name}: {cause}") from None
    except BaseException:
        staging.unlink(missing_ok=True)
        raise
    size = out_path.stat().st_size
    log.info("wrote %s: %d of %d layers of %s", out_path, len(kept), n_layers, main_path.name)
    return LayerDraft(out_path, kept, n_layers, size, planned)


def _data_size(renamed: list[tuple[Any, str]], alignment: int) -> int:
    """The bytes of the draft's tensor data: each tensor padded to the alignment, as GGUFWriter writes it."""
    import gguf

    return sum(gguf.GGUFWriter.ggml_pad(int(tensor.data.nbytes), alignment) for tensor, _ in renamed)


def _check_space(folder: Path, need: int) -> None:
    """One line when the folder's disk has less than `need` bytes free, and a margin."""
    free = shutil.disk_usage(folder).free
    if free < need + (16 << 20):
        raise SpeculaError(f"not enough disk space in {folder} for the draft: it needs about "
                           f"{format_bytes(need)}, {format_bytes(free)} is free")


def _renamed_tensors(reader: Any, kept: tuple[int, ...], name: str) -> list[tuple[Any, str]]:
    """(tensor, its name in the draft) for every tensor the draft keeps, in the file's order."""
    new_index = {old: new for new, old in enumerate(kept)}
    out = []
    for tensor in reader.tensors:
        match = _LAYER_TENSOR.fullmatch(tensor.name)
        if match is None:
            out.append((tensor, tensor.name))
            continue
        layer = int(match[1])
        if layer in new_index:
            out.append((tensor, f"blk.{new_index[layer]}.{match[2]}"))
    layers_seen = {int(m[1]) for t in reader.tensors if (m := _LAYER_TENSOR.fullmatch(t.name))}
    if not layers_seen >= set(kept):
        missing = sorted(set(kept) - layers_seen)
        raise ModelFileError(f"{name}: has no tensors for layer {missing[0]}")
    return out


def _copy_metadata(reader: Any, writer: Any, arch: str, kept: tuple[int, ...], n_layers: int) -> None:
    """Every key as it is (strings as their raw bytes), but the layer count and the per-layer
    arrays, plus the sliding-window pattern where llama.cpp would derive it from layer indices."""
    import gguf

    vt = gguf.GGUFValueType
    swa_key = f"{arch}.attention.sliding_window_pattern"
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == gguf.Keys.General.ARCHITECTURE:
            continue  # the header's own counts, and the key GGUFWriter writes itself
        if field.name == gguf.Keys.General.ALIGNMENT:
            continue  # the draft has the default alignment, which goes unsaid
        if field.name in DRAFT_KEYS or (field.name == swa_key and arch in SWA_PERIOD):
            continue  # written below
        kind = field.types[0]
        sub = field.types[-1] if kind == vt.ARRAY else None
        if len(field.types) > 2:
            raise UnsupportedModelError(f"{field.name}: nested metadata arrays are not copied")
        if field.name == f"{arch}.block_count":
            writer.add_key_value(field.name, len(kept), kind)
        elif kind == vt.ARRAY and sub == vt.STRING:
            writer.add_key_value(field.name, [bytes(field.parts[i]) for i in field.data], kind, sub_type=sub)
        elif kind == vt.ARRAY:
            values = [field.parts[i].tolist()[0] for i in field.data]
            if field.name.startswith(f"{arch}.") and len(values) == n_layers:
                values = [values[i] for i in kept]  # one value per layer: the kept layers'
            writer.add_key_value(field.name, values, kind, sub_type=sub)
        elif kind == vt.STRING:
            writer.add_key_value(field.name, bytes(field.parts[field.data[0]]), kind)
        else:
            writer.add_key_value(field.name, field.parts[field.data[0]].tolist()[0], kind)
    if arch in SWA_PERIOD:
        pattern = _swa_pattern(reader, swa_key, SWA_PERIOD[arch], n_layers)
        writer.add_key_value(swa_key, [pattern[i] for i in kept], vt.ARRAY, sub_type=vt.BOOL)
    writer.add_key_value(DRAFT_KEYS[0], list(kept), vt.ARRAY, sub_type=vt.UINT32)
    writer.add_key_value(DRAFT_KEYS[1], n_layers, vt.UINT32)


def _swa_pattern(reader: Any, key: str, period: int, n_layers: int) -> list[bool]:
    """Which of the main model's layers use the sliding window, as llama.cpp decides it: the
    file's per-layer array, else every period-th layer global (the file's period, else the
    architecture's)."""
    import gguf

    field = reader.fields.get(key)
    if field is not None and field.types[0] == gguf.GGUFValueType.ARRAY:
        values = [bool(field.parts[i].tolist()[0]) for i in field.data]
        if len(values) != n_layers:
            raise ModelFileError(f"{key} has {len(values)} entries for {n_layers} layers")
        return values
    if field is not None:
        period = int(field.parts[field.data[0]].tolist()[0])
    return [period == 0 or (i % period) < period - 1 for i in range(n_layers)]


def _as_int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0
