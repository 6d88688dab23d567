"""Read a GGUF file's header fast, without touching the weights.

The library, the pair picker, the compatibility check and `specula inspect` all need a model's facts
(architecture, sizes, quantization, vocabulary, chat template) long before anything is loaded.
`gguf.GGUFReader` and transformers' metadata parser decode every token string one Python object at a
time (seconds for a 262k vocabulary), so this module walks the GGUF v2/v3 layout itself over an mmap:
string arrays are kept as one bytes blob plus offsets and decoded only when asked for.

Layout (little-endian): magic b"GGUF", u32 version, u64 tensor count, u64 KV count, the KV pairs
(key string, u32 value type, value), the tensor infos (name, u32 n_dims, u64 dims, u32 ggml type,
u64 offset), padding to `general.alignment`, then the tensor data.
"""

from __future__ import annotations

import logging
import mmap
import os
import struct
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, LlamaFileType

from app.engine.errors import ModelFileError
from app.engine.gguf.checks import check_tensor_table
from app.engine.gguf.params import count_params
from app.engine.gguf.values import DEFAULT_ALIGNMENT, StringArray, as_int, is_count, kind_of

log = logging.getLogger(__name__)

GGUF_MAGIC = b"GGUF"
# llama.cpp and gguf-py read general.alignment as a u32, a non-zero power of two, 32 when absent,
# and nothing bounds it. We do: alignment only adds padding, which counts in every size read from
# a file (a sparse 94 MB file aligned to 4 MiB had 1.17 GB of them, and make-draft wrote 940 MB).
# Every writer we know leaves it at 32; 64 KiB is the largest page size llama.cpp runs on (arm64
# and ppc64le kernels with 64 KiB pages), the one reason to align tensor data any further.
MAX_ALIGNMENT = 64 << 10
_SUPPORTED_VERSIONS = (2, 3)

# GGUF value type id -> (struct format, numpy dtype) for the fixed-size scalar types.
_SCALARS: dict[int, tuple[struct.Struct, str]] = {
    0: (struct.Struct("<B"), "<u1"),
    1: (struct.Struct("<b"), "<i1"),
    2: (struct.Struct("<H"), "<u2"),
    3: (struct.Struct("<h"), "<i2"),
    4: (struct.Struct("<I"), "<u4"),
    5: (struct.Struct("<i"), "<i4"),
    6: (struct.Struct("<f"), "<f4"),
    7: (struct.Struct("<?"), "?"),
    10: (struct.Struct("<Q"), "<u8"),
    11: (struct.Struct("<q"), "<i8"),
    12: (struct.Struct("<d"), "<f8"),
}
_T_U32, _T_STRING, _T_ARRAY = 4, 8, 9
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")

_DTYPE_SIZES = {"float32": 4, "float16": 2, "bfloat16": 2}
_DTYPE_ALIASES = {"f32": "float32", "fp32": "float32", "f16": "float16", "fp16": "float16",
                  "half": "float16", "bf16": "bfloat16"}


def dtype_name(dtype: str) -> str:
    """A dtype as the sizes know it ("f16" -> "float16")."""
    return _DTYPE_ALIASES.get(dtype, dtype)


# Bounds are checked before every read; these are a last line of defence against a corrupt header
# reaching the user as a traceback.
_LOW_LEVEL = (struct.error, IndexError, OverflowError, ValueError, TypeError, MemoryError)


class HeaderIncomplete(ModelFileError):
    """The buffer ends before the GGUF header does; `needed` is a lower bound on the bytes required.

    The hub layer parses the first bytes fetched by an HTTP range request and fetches more on this.
    """

    def __init__(self, message: str, needed: int | None) -> None:
        super().__init__(message)
        self.needed = needed


class _NeedMore(Exception):
    """Internal: the parser ran past the end of the buffer; needed = bytes required (lower bound)."""

    def __init__(self, needed: int) -> None:
        super().__init__(needed)
        self.needed = needed


class _Corrupt(Exception):
    """Internal: the header is readable but its content is invalid (one-line cause)."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # numpy/torch order (outermost first); GGUF stores the dims reversed
    ggml_type: str  # e.g. "Q4_K"
    n_elements: int
    n_bytes: int
    offset: int  # relative to the start of the data section


def _dtype_size(dtype: str) -> int:
    name = dtype_name(dtype)
    if name not in _DTYPE_SIZES:
        raise ValueError(f"unknown dtype {dtype!r} (expected one of {', '.join(_DTYPE_SIZES)})")
    return _DTYPE_SIZES[name]


# eq=False: metadata holds numpy arrays, so field-wise equality would be ambiguous and meaningless.
@dataclass(frozen=True, eq=False)
class GGUFInfo:
    path: Path
    file_size: int  # 0 when unknown (a header parsed from a partial buffer)
    version: int
    metadata: dict[str, Any]  # numeric arrays as numpy arrays, string arrays as StringArray
    tensors: tuple[TensorInfo, ...]
    architecture: str
    name: str | None
    size_label: str | None
    n_params: int  # every weight once: a tied output layer stored again is left out (gguf/params.py)
    file_type: str | None
    tensor_types: dict[str, int]
    context_length: int
    n_layers: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    vocab_type: str | None
    vocab_size: int
    bos_token_id: int | None
    eos_token_id: int | None
    add_bos_token: bool | None
    add_eos_token: bool | None
    has_chat_template: bool
    data_offset: int = 0  # absolute offset of the tensor data section
    tied_output: int = 0  # elements of an output.weight that repeats the token embeddings, not in n_params
    _kv_heads_total: int = field(default=0, repr=False)  # sum of KV heads over layers

    def tokens(self) -> Sequence[str]:
        """Token texts in id order (decoded lazily)."""
        toks = self.metadata.get("tokenizer.ggml.tokens")
        return toks if isinstance(toks, Sequence) and not isinstance(toks, str) else ()

    def memory_bytes(self, dtype: str = "bfloat16") -> int:
        """Weights once loaded: dequantized at `dtype`, as the torch backend holds them, or for
        "gguf" as stored, as llama.cpp maps them. Every tensor the file holds is counted, a tied
        output stored again included: a loader may well keep both copies."""
        if dtype == "gguf":
            return sum(t.n_bytes for t in self.tensors)
        return (self.n_params + self.tied_output) * _dtype_size(dtype)

    def kv_bytes_per_token(self, dtype: str = "bfloat16") -> int:
        """KV cache bytes per token of context: keys + values over every layer's KV heads ("gguf":
        llama.cpp's float16 cache)."""
        md, arch = self.metadata, self.architecture
        k_len = as_int(md.get(f"{arch}.attention.key_length")) or self.head_dim
        v_len = as_int(md.get(f"{arch}.attention.value_length")) or k_len
        size = _dtype_size("float16" if dtype == "gguf" else dtype)  # llama.cpp's default KV type
        return self._kv_heads_total * (k_len + v_len) * size

    def to_dict(self, dtype: str = "bfloat16") -> dict[str, Any]:
        """JSON-ready summary (no token list) for `specula inspect --json`."""
        return {
            "path": str(self.path), "file_size": self.file_size, "version": self.version,
            "architecture": self.architecture, "name": self.name, "size_label": self.size_label,
            "n_params": self.n_params, "tied_output": self.tied_output, "file_type": self.file_type,
            "tensor_types": dict(self.tensor_types), "n_tensors": len(self.tensors),
            "context_length": self.context_length, "n_layers": self.n_layers,
            "n_embd": self.n_embd, "n_head": self.n_head, "n_head_kv": self.n_head_kv,
            "head_dim": self.head_dim, "vocab_type": self.vocab_type, "vocab_size": self.vocab_size,
            "bos_token_id": self.bos_token_id, "eos_token_id": self.eos_token_id,
            "add_bos_token": self.add_bos_token, "add_eos_token": self.add_eos_token,
            "has_chat_template": self.has_chat_template, "dtype": dtype_name(dtype),
            "memory_bytes": self.memory_bytes(dtype),
            "kv_bytes_per_token": self.kv_bytes_per_token(dtype),
            "metadata": {k: _jsonable(v) for k, v in self.metadata.items()},
        }


def _jsonable(value: Any) -> Any:
    # Big arrays (tokens, scores, merges) become a short description: the JSON is for people and scripts.
    if isinstance(value, (StringArray, np.ndarray, list)):
        if isinstance(value, np.ndarray) and value.size <= 64:
            return value.tolist()
        if isinstance(value, list) and len(value) <= 64:
            return [_jsonable(v) for v in value]
        kind = "str" if isinstance(value, StringArray) else str(getattr(value, "dtype", "array"))
        return {"array": kind, "length": len(value)}
    return value


# What parsing one header may allocate. Counts are checked against the bytes each item needs at
# least (so they are bounded by the file's size), and arrays of arrays, which no model uses
# (llama.cpp's reader refuses them), are capped outright: each costs about ten times its 12 bytes
# on disk as Python objects, so 1M empty ones in a 12 MB file took 212 MB.
_MAX_NESTED_ARRAYS = 4096
_MAX_DEPTH = 4
_MIN_KV_BYTES = 8 + 4 + 1  # key length, value type, smallest value
_MIN_TENSOR_BYTES = 8 + 4 + 4 + 8  # name length, n_dims, type, offset
_MIN_NESTED_BYTES = 4 + 8  # element type, count


class _Parser:
    """A cursor over the header bytes; every read checks the bounds and raises _NeedMore."""

    def __init__(self, buf: Any, end: int) -> None:
        self.buf, self.end, self.pos = buf, end, 0
        self.nested_arrays = 0

    def count(self, n: int, min_item_bytes: int, what: str, limit: int | None) -> int:
        """A count read from the file, refused when its items cannot fit in what is left of it."""
        if limit is not None and n * min_item_bytes > limit - self.pos:
            raise _Corrupt(f"truncated or corrupt GGUF file: header claims {n} {what}, "
                           f"more than the file can hold")
        return n

    def need(self, n: int) -> None:
        if n < 0 or self.pos + n > self.end:
            raise _NeedMore(self.pos + max(n, 0))

    def u32(self) -> int:
        self.need(4)
        v = _U32.unpack_from(self.buf, self.pos)[0]
        self.pos += 4
        return v

    def u64(self) -> int:
        self.need(8)
        v = _U64.unpack_from(self.buf, self.pos)[0]
        self.pos += 8
        return v

    def string(self) -> str:
        n = self.u64()
        self.need(n)
        s = bytes(self.buf[self.pos:self.pos + n]).decode("utf-8", errors="replace")
        self.pos += n
        return s

    def value(self, vtype: int, depth: int = 0) -> Any:
        if vtype == _T_STRING:
            return self.string()
        if vtype == _T_ARRAY:
            if depth >= _MAX_DEPTH:  # nested arrays exist in the spec, but this deep means a corrupt file
                raise _Corrupt("arrays nested too deeply")
            return self.array(self.u32(), self.u64(), depth + 1)
        if vtype not in _SCALARS:
            raise _Corrupt(f"unknown metadata value type {vtype} at byte {self.pos - 4}")
        st = _SCALARS[vtype][0]
        self.need(st.size)
        v = st.unpack_from(self.buf, self.pos)[0]
        self.pos += st.size
        return v

    def array(self, etype: int, count: int, depth: int) -> Any:
        if etype in _SCALARS:
            dt = np.dtype(_SCALARS[etype][1])
            self.need(count * dt.itemsize)
            # .copy(): the result must not keep the mmap exported (it is closed after parsing).
            arr = np.frombuffer(self.buf, dt, count, self.pos).copy()
            self.pos += count * dt.itemsize
            return arr
        if etype == _T_STRING:
            return self.string_array(count)
        if etype == _T_ARRAY:
            self.need(count * _MIN_NESTED_BYTES)
            self.nested_arrays += count
            if self.nested_arrays > _MAX_NESTED_ARRAYS:
                raise _Corrupt(f"more than {_MAX_NESTED_ARRAYS} nested metadata arrays")
            return [self.value(_T_ARRAY, depth) for _ in range(count)]
        raise _Corrupt(f"unknown array element type {etype} at byte {self.pos}")

    def string_array(self, count: int) -> StringArray:
        # Each item takes at least its 8-byte length: reject absurd counts before looping.
        self.need(count * 8)
        buf, pos, unpack = self.buf, self.pos, _U64.unpack_from
        base = pos
        starts = [0] * count
        try:
            # The hot loop of the whole module (262k iterations for Gemma 3): keep it minimal.
            for i in range(count):
                n = unpack(buf, pos)[0]
                pos += 8
                starts[i] = pos
                pos += n
        except (struct.error, OverflowError):
            raise _NeedMore(pos + 8) from None
        if pos > self.end:
            raise _NeedMore(pos)
        self.pos = pos
        st = np.array(starts, dtype=np.int64) - base
        ends = np.empty_like(st)
        if count:
            ends[:-1] = st[1:] - 8
            ends[-1] = pos - base
        return StringArray(bytes(buf[base:pos]), st, ends)


def _file_type_name(value: Any) -> str | None:
    if value is None:
        return None
    try:
        name = LlamaFileType(int(value)).name
    except (ValueError, TypeError):
        return f"unknown ({value})"
    return "F32" if name == "ALL_F32" else name.removeprefix("MOSTLY_")


def _parse(buf: Any, end: int, path: Path, file_size: int | None) -> GGUFInfo:
    """Parse the header in buf[:end]; raises _NeedMore / _Corrupt."""
    p = _Parser(buf, end)
    p.need(4)
    magic = bytes(buf[0:4])
    if magic != GGUF_MAGIC:
        raise _Corrupt(f"not a GGUF file (starts with {magic!r}, expected {GGUF_MAGIC!r})")
    p.pos = 4
    version = p.u32()
    if version not in _SUPPORTED_VERSIONS:
        if version & 0xFFFF == 0 and int.from_bytes(version.to_bytes(4, "little"), "big") <= 3:
            raise _Corrupt("big-endian GGUF files are not supported")
        raise _Corrupt(f"unsupported GGUF version {version} (supported: 2, 3)")
    limit = file_size if file_size is not None else None
    n_tensors, n_kv = p.u64(), p.u64()
    p.count(n_kv, _MIN_KV_BYTES, "metadata entries", limit)
    p.count(n_tensors, _MIN_TENSOR_BYTES, "tensors", limit)

    metadata: dict[str, Any] = {}
    alignment_type = _T_U32
    for _ in range(n_kv):
        key = p.string()
        vtype = p.u32()
        metadata[key] = p.value(vtype)
        if key == "general.alignment":
            alignment_type = vtype
    alignment = _alignment(metadata.get("general.alignment", DEFAULT_ALIGNMENT), alignment_type)

    tensors = []
    for _ in range(n_tensors):
        name = p.string()
        n_dims = p.u32()
        if n_dims > 8:
            raise _Corrupt(f"tensor {name!r} has {n_dims} dimensions")
        dims = [p.u64() for _ in range(n_dims)]
        type_id, offset = p.u32(), p.u64()
        try:
            qtype = GGMLQuantizationType(type_id)
            block, type_size = GGML_QUANT_SIZES[qtype]
        except (ValueError, KeyError):
            raise _Corrupt(f"tensor {name!r} has unknown ggml type {type_id}") from None
        n_el = int(np.prod(dims, dtype=object)) if dims else 1
        if dims and dims[0] % block:
            raise _Corrupt(f"tensor {name!r}: row of {dims[0]} is not a whole number of "
                           f"{qtype.name} blocks of {block}")
        tensors.append(TensorInfo(name, tuple(reversed(dims)), qtype.name, n_el,
                                  n_el // block * type_size, offset))

    data_offset = (p.pos + alignment - 1) // alignment * alignment
    if file_size is not None and tensors:
        needed = data_offset + max(t.offset + t.n_bytes for t in tensors)
        if needed > file_size:
            raise _Corrupt(f"truncated GGUF file (tensor data needs {needed} bytes, "
                           f"file has {file_size})")
    return _build(path, file_size or 0, version, metadata, tuple(tensors), data_offset)


def _alignment(value: Any, vtype: int) -> int:
    """general.alignment, checked: a u32 (llama.cpp and gguf-py refuse any other type),
    a power of two, at most MAX_ALIGNMENT."""
    if vtype != _T_U32:
        raise _Corrupt(f"invalid general.alignment: must be a u32, not {kind_of(value)} (GGUF value type {vtype})")
    if value <= 0 or value & (value - 1) or value > MAX_ALIGNMENT:
        raise _Corrupt(f"invalid general.alignment {value}: must be a power of two from 1 to "
                       f"{MAX_ALIGNMENT} (GGUF writers use {DEFAULT_ALIGNMENT})")
    return int(value)


# The keys this program reads, with the type each must have. A header is hostile input: a name
# given as an array or a length as inf must be one clear refusal, not a traceback later on.
_STRING_KEYS = ("general.architecture", "general.name", "general.size_label", "tokenizer.ggml.model",
                "tokenizer.ggml.pre", "tokenizer.chat_template")
_INT_KEYS = ("general.alignment", "general.file_type", "tokenizer.ggml.bos_token_id",
             "tokenizer.ggml.eos_token_id", "tokenizer.ggml.padding_token_id")
_ARCH_INT_KEYS = ("block_count", "embedding_length", "context_length", "vocab_size",
                  "attention.key_length", "attention.value_length")
_ARCH_PER_LAYER_KEYS = ("attention.head_count", "attention.head_count_kv", "feed_forward_length")
_STRING_ARRAY_KEYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.merges")
_NUMBER_ARRAY_KEYS = ("tokenizer.ggml.token_type", "tokenizer.ggml.scores")


def _check_types(md: dict[str, Any]) -> None:
    """Refuse (naming the key) metadata whose type differs from what GGUF writers store."""
    arch = md.get("general.architecture", "unknown")
    for key in _STRING_KEYS:
        if key in md and not isinstance(md[key], str):
            raise _Corrupt(f"metadata {key} must be a string, not {kind_of(md[key])}")
    for key in (*_INT_KEYS, *(f"{arch}.{k}" for k in _ARCH_INT_KEYS)):
        if key in md and not is_count(md[key]):
            raise _Corrupt(f"metadata {key} must be a non-negative integer, not {kind_of(md[key])}")
    for key in (f"{arch}.{k}" for k in _ARCH_PER_LAYER_KEYS):
        value = md.get(key)
        if value is None or is_count(value):
            continue
        if not (isinstance(value, np.ndarray) and value.dtype.kind in "iu" and (value >= 0).all()):
            raise _Corrupt(f"metadata {key} must be a non-negative integer or one per layer, not {kind_of(value)}")
    for key in _STRING_ARRAY_KEYS:
        if key in md and not isinstance(md[key], StringArray):
            raise _Corrupt(f"metadata {key} must be an array of strings")
    for key in _NUMBER_ARRAY_KEYS:
        if key in md and not (isinstance(md[key], np.ndarray) and md[key].dtype.kind in "iuf"):
            raise _Corrupt(f"metadata {key} must be an array of numbers")


def _build(path: Path, file_size: int, version: int, md: dict[str, Any],
           tensors: tuple[TensorInfo, ...], data_offset: int) -> GGUFInfo:
    _check_types(md)
    arch = str(md.get("general.architecture", "unknown"))
    n_layers = as_int(md.get(f"{arch}.block_count"))
    n_embd = as_int(md.get(f"{arch}.embedding_length"))
    n_head = as_int(md.get(f"{arch}.attention.head_count"))
    kv_raw = md.get(f"{arch}.attention.head_count_kv", md.get(f"{arch}.attention.head_count"))
    n_head_kv = as_int(kv_raw, n_head)
    # Per-layer KV head counts (hybrid models give some layers none) make the KV estimate exact.
    if isinstance(kv_raw, (np.ndarray, list)) and len(kv_raw):
        kv_total = int(sum(int(x) for x in kv_raw))
    else:
        kv_total = n_layers * n_head_kv
    head_dim = as_int(md.get(f"{arch}.attention.key_length")) or (n_embd // n_head if n_head else 0)

    toks = md.get("tokenizer.ggml.tokens")
    by_name = {t.name: t for t in tensors}
    if toks is not None:
        vocab_size = len(toks)
    elif f"{arch}.vocab_size" in md:
        vocab_size = as_int(md[f"{arch}.vocab_size"])
    elif "token_embd.weight" in by_name:
        vocab_size = by_name["token_embd.weight"].shape[0]
    else:
        vocab_size = 0

    def opt_int(key: str) -> int | None:
        v = md.get(key)
        return None if v is None else as_int(v)

    def opt_bool(key: str) -> bool | None:
        v = md.get(key)
        return None if v is None else bool(v)

    template = md.get("tokenizer.chat_template")
    counts = Counter(t.ggml_type for t in tensors)
    params = count_params(tensors, md.get("general.size_label"))
    return GGUFInfo(
        path=path, file_size=file_size, version=version, metadata=md, tensors=tensors,
        architecture=arch, name=md.get("general.name"), size_label=md.get("general.size_label"),
        n_params=params.n_params,
        file_type=_file_type_name(md.get("general.file_type")),
        tensor_types=dict(counts.most_common()),
        context_length=as_int(md.get(f"{arch}.context_length")),
        n_layers=n_layers, n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv, head_dim=head_dim,
        vocab_type=md.get("tokenizer.ggml.model"), vocab_size=vocab_size,
        bos_token_id=opt_int("tokenizer.ggml.bos_token_id"),
        eos_token_id=opt_int("tokenizer.ggml.eos_token_id"),
        add_bos_token=opt_bool("tokenizer.ggml.add_bos_token"),
        add_eos_token=opt_bool("tokenizer.ggml.add_eos_token"),
        has_chat_template=isinstance(template, str) and bool(template.strip()),
        data_offset=data_offset, tied_output=params.tied_output, _kv_heads_total=kv_total,
    )


def _parse_or_raise(buf: Any, path: Path, file_size: int | None, name: str) -> GGUFInfo:
    """Run the parser and turn its internal exceptions into the one-line errors users see."""
    have = len(buf)
    try:
        return _parse(buf, have, path, file_size)
    except _Corrupt as e:
        raise ModelFileError(f"{name}: {e}") from None
    except _NeedMore as e:
        # Nothing more to fetch when the buffer is the whole file (or the file is too short anyway).
        if file_size is not None and (have >= file_size or e.needed > file_size):
            raise ModelFileError(f"{name}: truncated GGUF file (header needs at least "
                                 f"{e.needed} bytes, file has {file_size})") from None
        raise HeaderIncomplete(f"{name}: GGUF header continues past the first {have} bytes "
                               f"(needs at least {e.needed})", e.needed) from None
    except _LOW_LEVEL as e:
        raise ModelFileError(f"{name}: corrupt GGUF header ({type(e).__name__}: {e})") from None


def parse_gguf_header(buf: bytes | bytearray | memoryview, source: str,
                      file_size: int | None = None) -> GGUFInfo:
    """Parse a GGUF header from the first bytes of a file (e.g. an HTTP range request).

    Raises HeaderIncomplete (with `needed`) when the buffer ends before the header and the file is
    longer than the buffer (or its size is unknown); ModelFileError when the file itself is bad.
    The tensor-data-past-EOF check runs only when `file_size` is given.
    """
    return _parse_or_raise(buf, Path(source), file_size, Path(source).name or source)


def read_gguf_info(path: str | os.PathLike[str]) -> GGUFInfo:
    """Read a GGUF file's header (over an mmap), check that its tensor data is all there and
    that the header agrees with its own tensors (check_tensor_table): every entry (inspect,
    check-pair, calibrate, bench, compare, serve, the library) reads models through here, so a
    header whose sizes would be believed over the tensors is refused once, in one line naming
    the key. The first part of a split model (`split.count` > 1) holds only some tensors; it is
    listed as read, and refused by the loader, which checks again."""
    path = Path(path)
    name = path.name or str(path)
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size == 0:  # mmap refuses empty files
                raise ModelFileError(f"{name}: empty file, not a GGUF model")
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
                info = _parse_or_raise(mm, path, size, name)
    except FileNotFoundError:
        raise ModelFileError(f"{name}: file not found ({path})") from None
    except IsADirectoryError:
        raise ModelFileError(f"{name}: is a directory, not a GGUF file") from None
    except (OSError, ValueError, BufferError) as e:  # permissions, mmap failures
        raise ModelFileError(f"{name}: cannot read file ({e})") from None
    if not is_split_part(info):
        check_tensor_table(info)
    log.debug("read GGUF header of %s: %s, %d tensors", path, info.architecture, len(info.tensors))
    return info


def is_split_part(info: GGUFInfo) -> bool:
    """One part of a model gguf-split wrote in several files (the others hold more tensors)."""
    count = info.metadata.get("split.count")
    return is_count(count) and int(count) > 1


def read_tensor(info: GGUFInfo, name: str) -> np.ndarray:
    """The values of one small unquantized tensor (F32/F16), e.g. `rope_freqs.weight`."""
    tensor = next((t for t in info.tensors if t.name == name), None)
    if tensor is None:
        raise KeyError(f"{info.path.name}: no tensor {name!r}")
    dtypes = {"F32": "<f4", "F16": "<f2"}
    if tensor.ggml_type not in dtypes:
        raise ValueError(f"{info.path.name}: tensor {name} is {tensor.ggml_type}, not F32/F16")
    with open(info.path, "rb") as handle:
        handle.seek(info.data_offset + tensor.offset)
        raw = handle.read(tensor.n_bytes)
    return np.frombuffer(raw, dtype=dtypes[tensor.ggml_type]).astype(np.float32).reshape(tensor.shape)


def hash_header(digest, path: str | Path, n_bytes: int) -> None:
    """Feed a file's first n_bytes (a GGUF's header: everything before its tensor data, or
    less) to a hashlib digest, a megabyte at a time."""
    with open(path, "rb") as handle:
        while n_bytes > 0:
            chunk = handle.read(min(n_bytes, 1 << 20))
            if not chunk:
                break
            digest.update(chunk)
            n_bytes -= len(chunk)
