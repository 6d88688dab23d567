"""The window's model library: the hub layer's local library (built-in demo models, the Hugging
Face cache, folders the user added) plus single GGUF files the user added.

Plain Python (header reads only, no torch, no Qt): `scan_library` runs on a background thread and
returns one entry per model, with its header facts or the one-line reason it cannot be used.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterable

from app.engine.errors import SpeculaError
from app.engine.gguf.info import GGUFInfo, read_gguf_info
from app.hub.library import LocalModel, list_local_models
from app.hub.display import display_name
from app.hub.identity import same_file
from app.hub.names import file_title
from app.engine.gguf.format import format_bytes

log = logging.getLogger(__name__)

BUILTIN, CACHE, FOLDER, FILE = "builtin", "hf-cache", "folder", "file"  # LocalModel.source, plus FILE


@dataclass(frozen=True)
class LibraryEntry:
    path: str  # "" for a built-in model that is not installed
    title: str
    source: str  # BUILTIN, CACHE, FOLDER or FILE
    info: GGUFInfo | None = None
    error: str | None = None  # why it cannot be used (not a GGUF, truncated, not installed)
    same_as: str | None = None  # the built-in model this file is a copy of (the same weights)
    copies: tuple[str, ...] = ()  # the same file elsewhere (a download of a built-in): listed once, here

    @property
    def usable(self) -> bool:
        return self.info is not None

    def facts(self) -> str:
        """One line of header facts: 'llama · 135M params · Q4_1 · ctx 8,192 · vocab 49,152'."""
        if self.info is None:
            return self.error or "unreadable"
        note = [f"the same model as the built-in {self.same_as}"] if self.same_as else []
        return " · ".join(fact_parts(self.info) + note)


def fact_parts(info: GGUFInfo) -> list[str]:
    parts = [info.architecture, f"{count_text(info.n_params)} params"]
    if info.file_type:
        parts.append(info.file_type)
    parts += [f"context {info.context_length:,} tokens", f"vocabulary {info.vocab_size:,}"]
    if info.file_size:
        parts.append(format_bytes(info.file_size))
    if not info.has_chat_template:
        parts.append("no chat template")
    return parts


def count_text(n: int) -> str:
    for div, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= div:
            return f"{n / div:.1f}{unit}" if n < 10 * div else f"{n / div:.0f}{unit}"
    return str(n)


def entry_for_file(path: Path, source: str, title: str | None = None) -> LibraryEntry:
    try:
        info = read_gguf_info(path)
    except SpeculaError as exc:
        return LibraryEntry(str(path), title or path.name, source, None, str(exc))
    return LibraryEntry(str(path), title or display_name(path, info.file_type), source, info)


def _entry(model: LocalModel) -> LibraryEntry:
    title = model.name
    if model.source == FOLDER:  # the path inside the folder: files of two subfolders stay apart
        title = file_title(model.name)
    return LibraryEntry(str(model.path), title, model.source, model.info if model.usable else None,
                        None if model.usable else model.error or "unreadable", model.same_as,
                        tuple(str(c.path) for c in model.copies))


def scan_library(files: Iterable[str], folders: Iterable[str], builtins: bool = True) -> list[LibraryEntry]:
    """Every model of the library, each file once: the hub layer's local library (built-ins, the
    Hugging Face cache, the added folders), then single files the user added."""
    folders = list(folders)
    entries = [_entry(m) for m in list_local_models([Path(f) for f in folders if Path(f).is_dir()],
                                                    include_builtin=builtins)]
    seen = {_key(p) for e in entries for p in (e.path, *e.copies)}
    for name in folders:
        if not Path(name).is_dir():
            entries.append(LibraryEntry(name, Path(name).name or name, FOLDER, None, f"{name}: folder not found"))
    for name in files:
        if _key(name) not in seen:
            seen.add(_key(name))
            _add_file(entries, entry_for_file(Path(name), FILE))
    return entries


def _add_file(entries: list[LibraryEntry], added: LibraryEntry) -> None:
    """A file the user added that is a copy of a listed one joins that entry (one_entry_per_file)."""
    at = next((i for i, e in enumerate(entries) if added.info is not None and e.info is not None
               and same_file(e.info, added.info)), None)
    if at is None:
        entries.append(added)
    else:
        entries[at] = replace(entries[at], copies=entries[at].copies + (added.path,))


def entry_path(entries: Iterable[LibraryEntry], path: str | None) -> str | None:
    """The path of the entry that lists `path`, as itself or as a copy (a pair saved with a
    downloaded copy of a built-in model selects the built-in's entry)."""
    return next((e.path for e in entries if path and path in e.copies), path)


def _key(path: str) -> str:
    return os.path.realpath(path)
