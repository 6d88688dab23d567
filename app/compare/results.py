"""What a comparison is and what it produced, as frozen plain data; saved and reopened as JSON.

A CompareRun is an immutable snapshot: the runner makes a new one after each finished prompt (and
writes it to disk, whole, by a temporary file and a rename), so a cancelled or crashed run keeps
every result it finished and the file is never half-written. The window receives the same
snapshots across threads.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from app.compare.file_versions import upgrade
from app.compare.prompts import Prompt
from app.common.atomic import write_atomic
from app.engine.events import RunSummary, StopReason
from app.engine.drafting.kinds import DEFAULT_DRAFT_MAX, NGRAM_KINDS  # noqa: F401 - the ceiling, also read from here
from app.engine.errors import SpeculaError
from app.engine.settings import GenSettings

FORMAT = "specula-compare"
# 2: settings hold the engine's GenSettings ("gen"), results its RunSummary ("summary"); a version 1
# file is converted on load (app.compare.file_versions).
VERSION = 2
SUPPORTED_VERSIONS = (1, VERSION)
NONE, LOOKUP, MODEL = "none", "lookup", "model"  # drafter kinds
# Beyond this process: llama-server started here with llama.cpp's own --spec-type list, or a
# server at a URL (its model and speculation).
LLAMA_SERVER, SERVER_URL = "llama-server", "server-url"
ENGINE_KINDS = (LLAMA_SERVER, SERVER_URL)
# n-gram drafters, also joined by "+" into one combined drafter ("lookup+ngram-cache"): the
# engine's registry (app.engine.drafting.kinds).
NGRAM_PARTS = NGRAM_KINDS


def is_ngram_kind(kind: str) -> bool:
    parts = kind.split("+")
    return bool(parts) and all(p in NGRAM_PARTS for p in parts) and len(set(parts)) == len(parts)
RUNNING, COMPLETE, CANCELLED, FAILED = "running", "complete", "cancelled", "failed"


class CompareFileError(SpeculaError):
    """A results file that is missing, not JSON, or not a Specula comparison."""


@dataclass(frozen=True)
class DraftChoice:
    """One drafter to compare: "none", an n-gram kind ("lookup", "ngram-cache",
    "lookup+ngram-cache", ...), or a draft model's GGUF file."""

    kind: str
    path: str | None = None
    label: str = ""  # what tables and charts call it (a model's name; the kind otherwise)
    server_types: str = ""  # LLAMA_SERVER: llama.cpp's --spec-type list ("ngram-mod,ngram-simple"; "" plain)
    server_url: str = ""  # SERVER_URL: where it answers

    @property
    def name(self) -> str:
        return self.label or (Path(self.path).stem if self.path else self.kind)


@dataclass(frozen=True)
class ConfigSpec:
    """A drafter with one draft-length setting: one row group of the table, one bar per category."""

    name: str  # unique in a run: "none", "lookup", "lookup k=8", "SmolLM2 360M k=4"
    drafter: str  # NONE, MODEL or an n-gram kind (is_ngram_kind)
    draft_path: str | None = None
    label: str = ""  # the drafter's name without the length (groups a sweep in the verdict)
    draft_max: int = DEFAULT_DRAFT_MAX
    adaptive: bool = True  # False: a fixed length (a --draft-max sweep)
    server_types: str = ""  # as DraftChoice's: the row runs on llama-server (ENGINE_KINDS)
    server_url: str = ""


# What every configuration of a run shares by default: greedy (outputs must then equal the
# baseline's), one fixed seed, 64 tokens a reply. Its draft length is each configuration's own
# (ConfigSpec.draft_max, adaptive).
COMPARE_DEFAULTS = GenSettings(max_tokens=64, temperature=0.0, seed=0)


@dataclass(frozen=True)
class RunSettings:
    """The same for every configuration: that is what makes the rows comparable."""

    gen: GenSettings = COMPARE_DEFAULTS  # reply length, sampling, draft min and p-min
    draft_sweep: tuple[int, ...] = ()  # fixed draft lengths; empty = adaptive, ceiling 16
    ignore_eos: bool = False  # every reply runs to gen.max_tokens (llama-bench style)
    # Every configuration runs the prompt set this many times (llama-bench's -r): a winner must be
    # faster in every run than plain decoding in any, and one run cannot show that.
    repeats: int = 1

    @property
    def greedy(self) -> bool:
        return self.gen.temperature <= 0.0

    def draft_length_text(self) -> str:
        if self.draft_sweep:
            return f"fixed draft lengths {','.join(map(str, self.draft_sweep))}"
        return f"adaptive draft length (ceiling {DEFAULT_DRAFT_MAX})"


@dataclass(frozen=True)
class CompareRequest:
    """Everything a comparison needs, as plain data (the window builds it from its widgets)."""

    main_path: str
    drafts: tuple[DraftChoice, ...]
    prompts: tuple[Prompt, ...]
    settings: RunSettings = RunSettings()
    device: str = "auto"
    dtype: str = "auto"  # the command line's --dtype: float32 makes greedy identity exact
    n_gpu_layers: int | None = None
    n_gpu_layers_draft: int | None = None
    ctx_size: int = 0  # 0: the main model's own
    backend: str = "auto"  # what runs the models: auto, llama.cpp or torch (--backend)
    api_key: str | None = field(default=None, repr=False)  # a SERVER_URL row's key: never saved, never shown
    rpc: tuple[str, ...] = ()  # llama-server rows split the main model across these RPC workers (HOST:PORT)


@dataclass(frozen=True)
class Progress:
    done: int  # prompts finished (over every configuration)
    total: int
    stage: str  # what is happening: "loading draft X", "lookup · code (2/5)"


@dataclass(frozen=True)
class MainFacts:
    name: str
    path: str
    plan: str = ""  # "CPU, bfloat16"
    dtype: str = ""
    load_s: float = 0.0


@dataclass(frozen=True)
class PromptResult:
    """One configuration on one prompt: the engine's summary of the reply, and what Compare
    measures around it."""

    config: str
    prompt_index: int
    category: str
    summary: RunSummary  # tokens, text, stop reason, timings, draft counts (the engine's one record)
    # (tokens generated so far, seconds since the first token) after each step: tok/s over the reply
    timeline: tuple[tuple[int, float], ...]
    peak_rss_bytes: int | None = None  # the process's resident memory, sampled during the prompt
    peak_gpu_bytes: int | None = None  # torch's peak CUDA allocation, when on a CUDA GPU
    identical: bool | None = None  # tokens equal the baseline's; None for the baseline itself
    repeat: int = 0  # which run of the prompt set (RunSettings.repeats), from 0


@dataclass(frozen=True)
class ConfigError:
    config: str
    message: str  # one line: why this configuration did not run (the others did)


@dataclass(frozen=True)
class CompareRun:
    main: MainFacts
    settings: RunSettings
    configs: tuple[ConfigSpec, ...]
    prompts: tuple[Prompt, ...]
    results: tuple[PromptResult, ...] = ()
    errors: tuple[ConfigError, ...] = ()
    status: str = RUNNING
    created: float = field(default_factory=time.time)
    machine: str = ""  # e.g. "2 CPU threads, torch 2.13"
    notes: tuple[str, ...] = ()

    @property
    def baseline(self) -> str:
        return NONE

    @property
    def n_expected(self) -> int:
        return len(self.configs) * len(self.prompts) * max(self.settings.repeats, 1)

    def with_result(self, result: PromptResult) -> CompareRun:
        return replace(self, results=self.results + (result,))

    def with_error(self, config: str, message: str) -> CompareRun:
        return replace(self, errors=self.errors + (ConfigError(config, message),))

    def results_of(self, config: str) -> list[PromptResult]:
        return [r for r in self.results if r.config == config]

    def categories(self) -> list[str]:
        """Categories in the order the prompts first name them."""
        return list(dict.fromkeys(p.category for p in self.prompts))

    def created_text(self) -> str:
        return time.strftime("%Y-%m-%d %H:%M", time.localtime(self.created))

    # --- JSON ---------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for result in data["results"]:
            result["summary"]["stop_reason"] = result["summary"]["stop_reason"].value
        return {"format": FORMAT, "version": VERSION, **data}

    @classmethod
    def from_dict(cls, data: Any, source: str = "the file") -> CompareRun:
        """A run from its JSON dict; an older version's file is brought to today's shape first
        (app.compare.file_versions)."""
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise CompareFileError(f"{source} is not a Specula comparison")
        if data.get("version") not in SUPPORTED_VERSIONS:
            raise CompareFileError(f"{source}: comparison format version {data.get('version')!r} is not supported")
        try:
            data = upgrade(data)
            return cls(
                main=_build(MainFacts, data["main"]),
                settings=_run_settings(data["settings"]),
                configs=tuple(_build(ConfigSpec, c) for c in data["configs"]),
                prompts=tuple(_build(Prompt, p) for p in data["prompts"]),
                results=tuple(_prompt_result(r) for r in data["results"]),
                errors=tuple(_build(ConfigError, e) for e in data.get("errors", [])),
                status=str(data.get("status", COMPLETE)),
                created=float(data.get("created", 0.0)),
                machine=str(data.get("machine", "")),
                notes=tuple(str(n) for n in data.get("notes", [])),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise CompareFileError(f"{source}: damaged comparison ({type(exc).__name__}: {exc})") from exc


def _run_settings(data: Any) -> RunSettings:
    settings = _build(RunSettings, data)
    gen = data.get("gen")
    if not isinstance(gen, dict):
        raise TypeError("settings.gen must be an object")
    return replace(settings, gen=GenSettings.from_dict(gen, base=COMPARE_DEFAULTS))


def _prompt_result(data: Any) -> PromptResult:
    result = _build(PromptResult, data)
    summary = _build(RunSummary, result.summary)
    return replace(result, summary=replace(summary, stop_reason=StopReason(summary.stop_reason)))


def _build(cls, data: Any):
    """A dataclass from its dict: unknown keys ignored, lists back to tuples (nested too)."""
    if not isinstance(data, dict):
        raise TypeError(f"{cls.__name__} must be an object")
    names = {f.name for f in fields(cls)}
    return cls(**{k: _tuples(v) for k, v in data.items() if k in names})


def _tuples(value: Any) -> Any:
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def write_text_atomic(path: str | Path, text: str) -> Path:
    """Write a file whole or not at all, private to the user (app.common.atomic: a fresh
    temporary file beside it, then a rename; never a fixed name a link could be planted on)."""
    path = Path(path).expanduser()
    try:
        return write_atomic(path, text.encode("utf-8"))
    except OSError as exc:
        raise CompareFileError(f"cannot write {path}: {exc.strerror or exc}") from exc


def save_run(run: CompareRun, path: str | Path) -> Path:
    """Write the run as JSON (atomically: a reader never sees half a file)."""
    return write_text_atomic(path, json.dumps(run.to_dict(), ensure_ascii=False, indent=1))


def load_run(path: str | Path) -> CompareRun:
    path = Path(path).expanduser()
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise CompareFileError(f"{path}: no such file") from exc
    except (UnicodeDecodeError, ValueError) as exc:
        raise CompareFileError(f"{path.name} is not a Specula comparison (not JSON)") from exc
    except OSError as exc:
        raise CompareFileError(f"{path}: cannot be read ({exc.strerror})") from exc
    return CompareRun.from_dict(data, path.name)
