"""GGUF -> transformers model in seconds instead of tens of seconds.

transformers' own GGUF path (`from_pretrained(gguf_file=...)`) parses the whole vocabulary with
gguf's slow reader twice and dequantizes every tensor with single-threaded numpy. Here the same
model is built from pieces transformers already has, fed by our fast header parser:

- the config: transformers' own GGUF key mapping (`GGUF_CONFIG_MAPPING`), applied to our metadata;
- the weights: a memory map of the file, dequantized tensor by tensor with transformers' torch
  kernels (gguf's numpy kernels for the few types those lack), renamed and permuted by transformers'
  own GGUF tensor map and processors, and copied into a model built without random initialization;
- the tokenizer: built once by transformers and cached as `tokenizer.json`, keyed by a hash of the
  file's header (which holds the vocabulary), so a second load reads a JSON file.

Only architectures whose result is checked against transformers' own load (tests/engine/test_fastload.py)
take this path; anything else, or any surprise, falls back to transformers.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import hashlib
import json
import logging
import os
import stat
from pathlib import Path
from typing import BinaryIO, Callable

import gguf
import numpy as np
import tokenizers
import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers import modeling_gguf_pytorch_utils as gguf_utils
from transformers.initialization import no_init_weights
from transformers.integrations.ggml import GGUF_CONFIG_DEFAULTS_MAPPING, GGUF_CONFIG_MAPPING
from transformers.integrations.gguf import dequant as torch_dequant
from transformers.models.auto.configuration_auto import CONFIG_MAPPING
from transformers.models.auto.tokenization_auto import TOKENIZER_MAPPING_NAMES, tokenizer_class_from_name

from app.engine.backends.torch import bpe_form
from app.common.atomic import write_atomic
from app.engine.errors import Cancel, LoadCancelled, ModelFileError
from app.engine.gguf.checks import check_tensor_table
from app.engine.gguf.info import GGUFInfo, hash_header

log = logging.getLogger(__name__)

# Checked tensor for tensor against transformers' own GGUF load in tests/engine/test_fastload.py.
FAST_ARCHITECTURES = frozenset({"llama", "qwen2", "gemma3"})
_MODEL_TYPE = {"gemma3": "gemma3_text"}  # GGUF holds only Gemma 3's text model
# The embedding and output matrices: the largest tensors, and no architecture's processor
# rewrites them, so they can be filled a block of rows at a time.
_ROW_CHUNKED = frozenset({"token_embd.weight", "output.weight"})
# Elements dequantized at a time: their float32 block (4 MiB) stays in the CPU's caches between
# the dequantization and the cast into the parameter (Gemma's 262k x 640 Q8_0 table: 0.15-0.19 s,
# against 0.86-1.25 in 64 MiB blocks).
_CHUNK_ELEMENTS = 1 << 20
_FLOAT_TYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}

ProgressCallback = Callable[[str, float], None]


def can_fast_load(info: GGUFInfo) -> bool:
    return info.architecture in FAST_ARCHITECTURES and os.environ.get("SPECULA_SLOW_LOAD") != "1"


# --- config -------------------------------------------------------------------------------------


def config_dict(info: GGUFInfo) -> dict:
    """The config transformers builds from these GGUF keys (its mapping, our parsed metadata).
    The keys are believed only once they agree with the tensors: calibrate's shaped model is
    built from this config alone, and `feed_forward_length = 10**6` or `vocab_size = 10**9`
    would size it (read_gguf_info checks too; an info from elsewhere is checked here)."""
    check_tensor_table(info)
    arch = info.architecture
    config: dict = dict(GGUF_CONFIG_DEFAULTS_MAPPING.get(arch, {}))
    config["tie_word_embeddings"] = all(t.name != "output.weight" for t in info.tensors)
    for key, value in info.metadata.items():
        prefix, _, rest = key.partition(".")
        renames = GGUF_CONFIG_MAPPING.get(prefix)
        if renames is None or rest not in renames or renames[rest] in (None, -1):
            continue
        config[renames[rest]] = _plain(value)
    config["model_type"] = _MODEL_TYPE.get(arch, arch)
    config.setdefault("vocab_size", info.vocab_size)
    return config


def _plain(value):
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value


def build_config(info: GGUFInfo) -> transformers.PretrainedConfig:
    data = config_dict(info)
    return CONFIG_MAPPING[data["model_type"]].from_dict(data)


# --- weights ------------------------------------------------------------------------------------


def _dequantize(raw: np.ndarray, ggml_type: str, shape: tuple[int, ...]) -> torch.Tensor:
    """One tensor's bytes -> float32 values in its torch shape (float types are only viewed)."""
    if ggml_type in _FLOAT_TYPES:
        return torch.from_numpy(raw).view(_FLOAT_TYPES[ggml_type]).reshape(shape).float()
    type_id = int(gguf.GGMLQuantizationType[ggml_type])
    if type_id in torch_dequant.GGML_BLOCK:
        values = torch_dequant.dequantize(torch.from_numpy(raw), type_id, torch.float32)
        return values.reshape(shape)
    # Types transformers' torch kernels lack (Q5_0, Q5_1, ...): gguf's numpy reference.
    values = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType(type_id))
    return torch.from_numpy(np.ascontiguousarray(values)).reshape(shape)


def gguf_to_hf_names(model: torch.nn.Module, info: GGUFInfo) -> dict[str, str]:
    """{gguf tensor name: model parameter name}, from gguf's own name table. (transformers'
    get_gguf_hf_weights_map builds that table once per submodule: seconds for a 30-layer model.)"""
    arch = next((k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == info.architecture), None)
    if arch is None:
        raise ModelFileError(f"{info.path.name}: gguf does not know the architecture {info.architecture!r}")
    table = gguf.get_tensor_name_map(arch, info.n_layers)
    mapping: dict[str, str] = {}
    for hf_name, _ in model.named_parameters(remove_duplicate=False):
        base, dot, suffix = hf_name.rpartition(".")
        parts = base.split(".")
        for skip in range(len(parts)):  # "model.layers.0.x" may be listed as "layers.0.x"
            gguf_name = table.get_name(".".join(parts[skip:]))
            if gguf_name is not None:
                mapping.setdefault(f"{gguf_name}{dot}{suffix}", hf_name)
                break
    return mapping


def load_weights(
    model: torch.nn.Module,
    info: GGUFInfo,
    config: dict,
    progress: ProgressCallback | None = None,
    cancel: Cancel | None = None,
    on_table: Callable[[str, torch.Tensor], None] | None = None,
) -> None:
    """Fill `model`'s parameters from the file, in place, one tensor (or block of rows) in flight.
    on_table(gguf name, parameter) is called as soon as the embedding or output matrix is filled
    (usually the file's first tensor), so that work on it can start while the rest loads.

    Tensors are read with plain reads rather than a memory map so that the file's pages do not
    count against the process while it loads."""
    processor = gguf_utils.TENSOR_PROCESSORS.get(info.architecture, gguf_utils.TensorProcessor)(config=config)
    name_map = gguf_to_hf_names(model, info)
    params = dict(model.named_parameters(remove_duplicate=False))
    filled: set[str] = set()
    with open(info.path, "rb") as handle:
        for index, tensor in enumerate(info.tensors):
            if cancel is not None and cancel():
                raise LoadCancelled("loading cancelled")
            if progress is not None:
                progress("reading weights", index / max(len(info.tensors), 1))
            hf_name = name_map.get(tensor.name)
            if tensor.name in _ROW_CHUNKED and hf_name in params:
                _copy_rows(params[hf_name], handle, tensor, info)
                filled.add(hf_name)
                if on_table is not None:
                    on_table(tensor.name, params[hf_name])
                continue
            raw = _read(handle, info, tensor.offset, tensor.n_bytes)
            values = _dequantize(raw, tensor.ggml_type, tensor.shape)
            result = processor.process(weights=values.numpy(), name=tensor.name,
                                       tensor_key_mapping=name_map, parsed_parameters={})
            hf_name = name_map.get(result.name)
            if hf_name is None or hf_name not in params:
                continue  # e.g. rope_freqs.weight: applied separately (app.engine.backends.torch.rope)
            _copy_into(params[hf_name], torch.as_tensor(np.asarray(result.weights)), tensor.name, info)
            filled.add(hf_name)
    _check_all_filled(model, filled, info)


def _read(handle: BinaryIO, info: GGUFInfo, offset: int, n_bytes: int) -> np.ndarray:
    """n_bytes of tensor data at `offset` (relative to the data section), as a writable array."""
    buffer = bytearray(n_bytes)
    handle.seek(info.data_offset + offset)
    if handle.readinto(buffer) != n_bytes:
        raise ModelFileError(f"{info.path.name}: the file ends inside its tensor data (truncated?)")
    return np.frombuffer(buffer, dtype=np.uint8)


def _copy_into(target: torch.Tensor, values: torch.Tensor, gguf_name: str, info: GGUFInfo) -> None:
    if tuple(values.shape) != tuple(target.shape):
        raise ModelFileError(f"{info.path.name}: tensor {gguf_name} has shape {tuple(values.shape)}, "
                             f"the model expects {tuple(target.shape)}")
    with torch.no_grad():
        target.copy_(values)


def _copy_rows(target: torch.Tensor, handle: BinaryIO, tensor, info: GGUFInfo) -> None:
    """Read and dequantize a large matrix a block of rows at a time, straight into its parameter:
    a 262k-token embedding would otherwise sit in memory once more as float32."""
    if tuple(target.shape) != tuple(tensor.shape):
        raise ModelFileError(f"{info.path.name}: tensor {tensor.name} has shape {tuple(tensor.shape)}, "
                             f"the model expects {tuple(target.shape)}")
    step = max(1, _CHUNK_ELEMENTS // max(tensor.n_elements // tensor.shape[0], 1))
    with torch.no_grad():
        for first, n, raw in _row_blocks(handle, info, tensor, step):
            target[first : first + n].copy_(_dequantize(raw, tensor.ggml_type, (n, *tensor.shape[1:])))


def _row_blocks(handle: BinaryIO, info: GGUFInfo, tensor, step: int):
    """(first row, rows, raw bytes) of a matrix read `step` rows at a time."""
    rows = tensor.shape[0]
    row_bytes = tensor.n_bytes // rows
    for first in range(0, rows, step):
        n = min(step, rows - first)
        yield first, n, _read(handle, info, tensor.offset + first * row_bytes, n * row_bytes)


def _check_all_filled(model: torch.nn.Module, filled: set[str], info: GGUFInfo) -> None:
    if getattr(model.config, "tie_word_embeddings", False):
        model.tie_weights()
    by_storage = {p.data_ptr() for name, p in model.named_parameters(remove_duplicate=False) if name in filled}
    missing = sorted(name for name, p in model.named_parameters(remove_duplicate=False)
                     if name not in filled and p.data_ptr() not in by_storage)
    if missing:
        raise ModelFileError(f"{info.path.name}: the file has no tensor for {', '.join(missing[:3])}"
                             + (f" and {len(missing) - 3} more" if len(missing) > 3 else ""))


def build_model(info: GGUFInfo, dtype: torch.dtype, progress: ProgressCallback | None = None,
                cancel: Cancel | None = None,
                on_table: Callable[[str, torch.Tensor], None] | None = None) -> torch.nn.Module:
    """The model in `dtype`, every weight dequantized. on_table: see load_weights."""
    config = build_config(info)
    with no_init_weights():  # every parameter is overwritten from the file
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    load_weights(model, info, config_dict(info), progress, cancel, on_table=on_table)
    release_freed_memory()  # the float32 tensors each weight passed through
    return model.eval()


# --- tokenizer ----------------------------------------------------------------------------------


def tokenizer_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "specula" / "tokenizers"


def header_key(info: GGUFInfo) -> str:
    """A hash of the header (vocabulary, merges, template, special ids) and the versions of
    transformers and tokenizers (which a split entry was checked with): the same file under
    another name or path shares the entry; an edited header does not."""
    digest = hashlib.sha256(f"{transformers.__version__} {tokenizers.__version__}".encode())
    hash_header(digest, info.path, info.data_offset)
    return digest.hexdigest()[:32]


def release_freed_memory() -> None:
    """Hand memory freed by a load back to the OS. glibc keeps freed heap blocks mapped (the JSON
    tree a tokenizer is parsed from: ~200 MB for Gemma's vocabulary), so the process would stay
    that much bigger for its whole life. No-op where there is no glibc."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return
    trim.argtypes = [ctypes.c_size_t]
    trim(0)


# The entry is data only: the tokenizers library's own `tokenizer.json` and a small JSON of the
# constructor's scalar arguments (special tokens, chat template, bos/eos flags). Nothing in it can
# name a class or a file: the class comes from the model file and path-like arguments are dropped.
_CACHE_FORMAT = 2  # 2: a split BPE model's merges as packed ids (app.engine.backends.torch.bpe_form)
_NOT_CACHED = {"vocab_file", "merges_file", "tokenizer_file", "gguf_file", "name_or_path", "is_local",
               "local_files_only", "backend", "added_tokens_decoder", "tokenizer_object", "vocab", "merges"}
_warned: set[str] = set()


def _warn_once(message: str) -> None:
    """A bad cache entry costs a rebuild, not a warning on every load."""
    if message not in _warned:
        _warned.add(message)
        log.warning(message)


def tokenizer_cache_file(info: GGUFInfo) -> Path:
    """The entry's config JSON; its `tokenizer.json` lies beside it (`tokenizer_json_file`)."""
    return tokenizer_cache_dir() / f"{header_key(info)}.json"


def tokenizer_json_file(entry: Path) -> Path:
    return entry.with_name(entry.stem + ".tokenizer.json")


def bpe_model_file(entry: Path) -> Path:
    """A split BPE entry's vocabulary and merges (app.engine.backends.torch.bpe_form), beside its skeleton."""
    return entry.with_name(entry.stem + ".bpe.json")


def load_tokenizer(info: GGUFInfo) -> transformers.PreTrainedTokenizerBase:
    """The file's tokenizer, from the cache when it has been built before.

    Loading the cached `tokenizer.json` with the tokenizers library's own (Rust) loader is as fast
    as unpickling was, while `from_pretrained` on a saved folder re-parses that JSON in Python
    (3x slower for Gemma's 262k tokens). The cache is the user's own 0700 folder, keyed by the
    header and transformers' version; an unreadable, wrong or mismatching entry is rebuilt."""
    key = header_key(info)
    folder = _usable_cache_dir()
    entry = folder / f"{key}.json" if folder is not None else None
    if entry is not None and entry.is_file():
        tokenizer = _read_cached(info, entry, key)
        if tokenizer is not None:
            release_freed_memory()
            return tokenizer
    tokenizer = build_tokenizer(info)
    if entry is not None:
        _save_tokenizer(tokenizer, entry, key)
    release_freed_memory()
    return tokenizer


def _usable_cache_dir() -> Path | None:
    """The cache folder, created 0700; None (no caching) when it is not ours alone, since anyone
    who can write there chooses the tokenizer we load."""
    folder = tokenizer_cache_dir()
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        status = folder.lstat()
        if not stat.S_ISDIR(status.st_mode):  # a link could point the cache anywhere
            _warn_once(f"tokenizer cache {folder} is not a plain folder; not using it")
            return None
        if hasattr(os, "getuid") and status.st_uid != os.getuid():
            _warn_once(f"tokenizer cache {folder} belongs to another user; not using it")
            return None
        if os.name == "posix" and status.st_mode & 0o077:
            os.chmod(folder, 0o700)  # made by an older version with the default mode
    except OSError as exc:  # a read-only home only costs speed
        _warn_once(f"tokenizer cache {folder} unusable ({exc}); not caching")
        return None
    return folder


def _tokenizer_class(info: GGUFInfo):
    class_name = TOKENIZER_MAPPING_NAMES.get(config_dict(info)["model_type"]) or "TokenizersBackend"
    return tokenizer_class_from_name(class_name)


def _read_cached(info: GGUFInfo, entry: Path, key: str):
    """The cached tokenizer, or None when the entry is not exactly ours (after one warning) or
    of another version's format (an info line)."""
    try:
        meta = json.loads(entry.read_text(encoding="utf-8"))
        kwargs = _checked_meta(meta, key)
        tokenizer_json = tokenizer_json_file(entry)
        if hashlib.sha256(tokenizer_json.read_bytes()).hexdigest() != meta["tokenizer_sha256"]:
            raise ValueError("tokenizer.json does not match its entry")
        tokenizer_class = _tokenizer_class(info)
        if tokenizer_class is None or tokenizer_class.__name__ != meta["class"]:
            raise ValueError("built for another tokenizer class")
        return _built_from(tokenizer_class, entry, meta, kwargs)
    except _OtherFormat:  # an upgrade, not damage: no warning
        log.info("tokenizer cache %s is of another version's format; rebuilding", entry.name)
        return None
    except Exception as exc:  # noqa: BLE001 - any damage is a cache miss, never fatal
        _warn_once(f"tokenizer cache {entry} unusable ({type(exc).__name__}: {exc}); rebuilding")
        return None


def _built_from(tokenizer_class, entry: Path, meta: dict, kwargs: dict):
    """The tokenizer an entry holds: from its tokenizer.json, or from the skeleton there and the
    BPE model beside it (app.engine.backends.torch.bpe_form), as its checksums say."""
    tokenizer = tokenizer_class(tokenizer_file=str(tokenizer_json_file(entry)), **kwargs)
    if meta.get("bpe_sha256") is not None:
        model_text = bpe_model_file(entry).read_bytes()
        if hashlib.sha256(model_text).hexdigest() != meta["bpe_sha256"]:
            raise ValueError("the BPE model does not match its entry")
        bpe_form.join(tokenizer.backend_tokenizer, model_text)
    return tokenizer


class _OtherFormat(ValueError):
    """An entry written by another version of the cache."""


def _checked_meta(meta, key: str) -> dict:
    """The constructor arguments of a well-formed entry for this header; _OtherFormat for an
    entry of another version's format, ValueError for anything else amiss."""
    if isinstance(meta, dict) and isinstance(meta.get("format"), int) and meta["format"] != _CACHE_FORMAT:
        raise _OtherFormat(f"format {meta['format']}")
    if not isinstance(meta, dict) or meta.get("format") != _CACHE_FORMAT or meta.get("key") != key:
        raise ValueError("not an entry of this format for this file")
    if not isinstance(meta.get("class"), str) or not isinstance(meta.get("tokenizer_sha256"), str):
        raise ValueError("class or checksum missing")
    if not isinstance(meta.get("bpe_sha256"), (str, type(None))):
        raise ValueError("bad BPE checksum")
    kwargs = meta.get("kwargs")
    if not isinstance(kwargs, dict) or set(kwargs) & _NOT_CACHED:
        raise ValueError("bad constructor arguments")
    for name, value in kwargs.items():
        if not _plain_json(value):
            raise ValueError(f"{name} is not a plain value")
    return kwargs


def _plain_json(value) -> bool:
    """Scalars, or a chat template given as a list of {name, template} strings."""
    if value is None or isinstance(value, (str, bool, int, float)):
        return True
    if isinstance(value, list):
        return all(isinstance(item, dict) and all(isinstance(v, str) for v in item.values())
                   for item in value)
    return isinstance(value, dict) and all(isinstance(v, str) for v in value.values())


def build_tokenizer(info: GGUFInfo) -> transformers.PreTrainedTokenizerBase:
    """The tokenizer class AutoTokenizer would pick, built from the file by that class.

    AutoTokenizer itself parses the whole header with gguf's slow reader only to learn the model
    type (about 15 s for a 262k vocabulary); our config already knows it."""
    tokenizer_class = _tokenizer_class(info)
    if tokenizer_class is None:
        return AutoTokenizer.from_pretrained(str(info.path.parent), gguf_file=info.path.name,
                                             local_files_only=True)
    return tokenizer_class.from_pretrained(str(info.path.parent), gguf_file=info.path.name,
                                           local_files_only=True)


def _save_tokenizer(tokenizer, entry: Path, key: str) -> None:
    """Write `tokenizer.json` (or, for a BPE model, its skeleton and model: app.engine.backends.torch.bpe_form),
    then the entry naming their checksums, each to a temporary file renamed into place: a
    half-written or mismatched set is never read as an entry. The split form is kept only if a
    tokenizer read back from it serializes to the same `tokenizer.json`."""
    kwargs = {name: value for name, value in tokenizer.init_kwargs.items()
              if name not in _NOT_CACHED}
    if not all(_plain_json(value) for value in kwargs.values()) or not hasattr(tokenizer, "backend_tokenizer"):
        _warn_once(f"{type(tokenizer).__name__} has arguments that are not plain data; not caching it")
        return
    whole = tokenizer.backend_tokenizer.to_str()
    meta = {"format": _CACHE_FORMAT, "key": key, "class": type(tokenizer).__name__, "kwargs": kwargs}
    try:
        parts = bpe_form.split(whole)
        if parts is not None and not _split_reads_back(type(tokenizer), entry, meta, parts, whole):
            log.info("%s: the split tokenizer does not read back the same; caching it whole", entry.name)
            parts = None
        if parts is None:
            text = whole.encode("utf-8")
            write_atomic(tokenizer_json_file(entry), text)
            bpe_model_file(entry).unlink(missing_ok=True)
            meta.update(tokenizer_sha256=hashlib.sha256(text).hexdigest(), bpe_sha256=None)
        write_atomic(entry, json.dumps(meta).encode("utf-8"))
    except OSError as exc:  # a read-only or full cache only costs speed
        _warn_once(f"could not cache the tokenizer in {entry}: {exc}")


def _split_reads_back(tokenizer_class, entry: Path, meta: dict, parts: tuple[str, str], whole: str) -> bool:
    """Write the split form's two files (meta gets their checksums) and say whether a tokenizer
    read from them is the one they came from."""
    skeleton, model = (part.encode("utf-8") for part in parts)
    write_atomic(tokenizer_json_file(entry), skeleton)
    write_atomic(bpe_model_file(entry), model)
    meta.update(tokenizer_sha256=hashlib.sha256(skeleton).hexdigest(), bpe_sha256=hashlib.sha256(model).hexdigest())
    try:
        return _built_from(tokenizer_class, entry, meta, meta["kwargs"]).backend_tokenizer.to_str() == whole
    except Exception as exc:  # noqa: BLE001 - a form this library cannot read back is not kept
        log.info("the split tokenizer failed to read back: %s", exc)
        return False
