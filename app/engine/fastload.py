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

Only architectures whose result is checked against transformers' own load (tests/test_fastload.py)
take this path; anything else, or any surprise, falls back to transformers.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

import gguf
import numpy as np
import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers import modeling_gguf_pytorch_utils as gguf_utils
from transformers.initialization import no_init_weights
from transformers.integrations.ggml import GGUF_CONFIG_DEFAULTS_MAPPING, GGUF_CONFIG_MAPPING
from transformers.integrations.gguf import dequant as torch_dequant
from transformers.models.auto.configuration_auto import CONFIG_MAPPING

from app.engine.errors import LoadCancelled, ModelFileError
from app.engine.gguf_info import GGUFInfo

log = logging.getLogger(__name__)

# Checked tensor for tensor against transformers' own GGUF load in tests/test_fastload.py.
FAST_ARCHITECTURES = frozenset({"llama", "qwen2", "gemma3"})
_MODEL_TYPE = {"gemma3": "gemma3_text"}  # GGUF holds only Gemma 3's text model
_FLOAT_TYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}

ProgressCallback = Callable[[str, float], None]
CancelCheck = Callable[[], bool]


def can_fast_load(info: GGUFInfo) -> bool:
    return info.architecture in FAST_ARCHITECTURES and os.environ.get("SPECULA_SLOW_LOAD") != "1"


# --- config -------------------------------------------------------------------------------------


def config_dict(info: GGUFInfo) -> dict:
    """The config transformers builds from these GGUF keys (its mapping, our parsed metadata)."""
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
    cancel: CancelCheck | None = None,
) -> None:
    """Fill `model`'s parameters from the file, in place, one tensor in flight at a time."""
    processor = gguf_utils.TENSOR_PROCESSORS.get(info.architecture, gguf_utils.TensorProcessor)(config=config)
    name_map = gguf_to_hf_names(model, info)
    params = dict(model.named_parameters(remove_duplicate=False))
    filled: set[str] = set()
    # copy-on-write: torch wants writable arrays; the file is never written
    blob = np.memmap(info.path, dtype=np.uint8, mode="c")
    try:
        for index, tensor in enumerate(info.tensors):
            if cancel is not None and cancel():
                raise LoadCancelled("loading cancelled")
            if progress is not None:
                progress("reading weights", index / max(len(info.tensors), 1))
            start = info.data_offset + tensor.offset
            raw = np.asarray(blob[start : start + tensor.n_bytes])
            values = _dequantize(raw, tensor.ggml_type, tensor.shape)
            result = processor.process(weights=values.numpy(), name=tensor.name,
                                       tensor_key_mapping=name_map, parsed_parameters={})
            hf_name = name_map.get(result.name)
            if hf_name is None or hf_name not in params:
                continue  # e.g. rope_freqs.weight: applied separately (app.engine.rope)
            target = params[hf_name]
            weights = torch.as_tensor(np.asarray(result.weights))
            if tuple(weights.shape) != tuple(target.shape):
                raise ModelFileError(f"{info.path.name}: tensor {tensor.name} has shape "
                                     f"{tuple(weights.shape)}, the model expects {tuple(target.shape)}")
            with torch.no_grad():
                target.copy_(weights)
            filled.add(hf_name)
    finally:
        del blob
    _check_all_filled(model, filled, info)


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
                cancel: CancelCheck | None = None) -> torch.nn.Module:
    config = build_config(info)
    with no_init_weights():  # every parameter is overwritten from the file
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    load_weights(model, info, config_dict(info), progress, cancel)
    return model.eval()


# --- tokenizer ----------------------------------------------------------------------------------


def tokenizer_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "specula" / "tokenizers"


def header_key(info: GGUFInfo) -> str:
    """A hash of the header (vocabulary, merges, template, special ids) and transformers' version:
    the same file under another name or path shares the entry; an edited header does not."""
    digest = hashlib.sha256(transformers.__version__.encode())
    with open(info.path, "rb") as handle:
        remaining = info.data_offset
        while remaining > 0:
            chunk = handle.read(min(remaining, 1 << 20))
            if not chunk:
                break
            digest.update(chunk)
            remaining -= len(chunk)
    return digest.hexdigest()[:32]


def load_tokenizer(info: GGUFInfo) -> transformers.PreTrainedTokenizerBase:
    """The file's tokenizer, from the cache when it has been built before."""
    entry = tokenizer_cache_dir() / header_key(info)
    if (entry / "tokenizer.json").is_file():
        try:
            return AutoTokenizer.from_pretrained(str(entry), local_files_only=True)
        except Exception as exc:  # a damaged cache entry is rebuilt, never fatal
            log.warning("tokenizer cache %s unusable (%s); rebuilding", entry, exc)
            shutil.rmtree(entry, ignore_errors=True)
    tokenizer = AutoTokenizer.from_pretrained(str(info.path.parent), gguf_file=info.path.name,
                                              local_files_only=True)
    _save_tokenizer(tokenizer, entry)
    return tokenizer


def _save_tokenizer(tokenizer, entry: Path) -> None:
    """Write to a temporary folder and rename it into place: a half-written entry never exists."""
    staging: Path | None = None
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".tmp-", dir=entry.parent))
        tokenizer.save_pretrained(str(staging))
        os.replace(staging, entry)
    except OSError as exc:  # a read-only or full cache (or a concurrent load) only costs speed
        log.warning("could not cache the tokenizer in %s: %s", entry, exc)
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
