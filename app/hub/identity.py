"""Are two GGUF files the same model weights? Decided without hashing gigabytes.

Two files hold the same weights when their tensor tables agree (every tensor's name, shape, type
and offset), their data sections are the same size, and, where both files are on this disk, a
few samples of the tensor data itself are byte for byte equal. A downloaded copy of a built-in
model passes; the instruct and base models of one family (the same table, other numbers) fail on
the samples. A hub file, whose data is not here, is judged on its header: that is the check that
says "already here" before downloading, where a rare false match costs only a note.

A model drafting for itself is the case this exists for: it accepts every draft and costs as much
as the main model, so it can never pay.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

from app.engine.gguf.info import GGUFInfo, hash_header

log = logging.getLogger(__name__)

SAMPLE_BYTES = 4096
N_SAMPLES = 4  # the start and end of the data, and two points between


def table_key(info: GGUFInfo) -> tuple:
    """What the header says about the weights: the tensor table and the data section's size."""
    data_size = info.file_size - info.data_offset if info.file_size else None
    tensors = tuple((t.name, tuple(t.shape), t.ggml_type, t.offset) for t in info.tensors)
    return data_size, tensors


def same_header_weights(a: GGUFInfo, b: GGUFInfo) -> bool:
    """The two headers describe the same tensors (names, shapes, types, places, and the data's
    size where both know it: a header read over HTTP may not know the file's size)."""
    (size_a, tensors_a), (size_b, tensors_b) = table_key(a), table_key(b)
    sizes_agree = size_a is None or size_b is None or size_a == size_b
    return bool(tensors_a) and tensors_a == tensors_b and sizes_agree


def same_weights(a: GGUFInfo, b: GGUFInfo) -> bool:
    """The same weights: the same tensor table and, where both files are readable here, the same
    bytes at a few places of the data section. The same file is, of course, the same weights."""
    if not same_header_weights(a, b):
        return False
    pa, pb = Path(a.path), Path(b.path)
    try:
        if pa.exists() and pb.exists() and pa.resolve() == pb.resolve():
            return True
        return _samples(pa, a) == _samples(pb, b)
    except OSError as exc:  # not both on this disk (a hub header): the header decides
        log.debug("same_weights: no data samples (%s), header only", exc)
        return True


def _samples(path: Path, info: GGUFInfo) -> list[bytes]:
    size = info.file_size - info.data_offset
    step = max(size - SAMPLE_BYTES, 0) // max(N_SAMPLES - 1, 1)
    with open(path, "rb") as f:
        out = []
        for i in range(N_SAMPLES):
            f.seek(info.data_offset + i * step)
            out.append(f.read(SAMPLE_BYTES))
    return out


def same_file(a: GGUFInfo, b: GGUFInfo) -> bool:
    """The same file in two places (a download of a built-in model, a copy in a folder): the same
    size, the same header byte for byte (metadata, vocabulary, chat template, tensor table) and
    the same weights (same_weights' samples of the data). Hashing the header, never the
    gigabytes after it, keeps this cheap; it is asked only of files of one size. Two files with
    the same weights but another header (a newer chat template) are not the same file."""
    if not a.file_size or a.file_size != b.file_size or a.data_offset != b.data_offset:
        return False
    try:
        return _header_digest(Path(a.path), a.data_offset) == _header_digest(Path(b.path), b.data_offset) \
            and same_weights(a, b)
    except OSError as exc:  # one of them is not readable here: not provably the same file
        log.debug("same_file: %s", exc)
        return False


def _header_digest(path: Path, n_bytes: int) -> bytes:
    digest = hashlib.sha256()
    hash_header(digest, path, n_bytes)
    return digest.digest()
