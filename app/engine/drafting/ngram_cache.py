"""An n-gram cache that learns from finished chats, in the spirit of llama.cpp's `ngram-cache`.

For every n-gram of 2..4 tokens seen in a conversation (prompts and replies) it counts which
tokens followed, so that a later chat can draft what this user's conversations tend to say next.
It is kept per main-model vocabulary (`vocab_key`): token ids mean nothing under another one.

Bound: at most `max_keys` n-grams (default 100,000: about 40 MB in memory, a few MB at most on disk,
0.6 s to load and 0.3 s to save when full, measured on a 2-core AVX2 CPU) and
at most MAX_FOLLOWERS followers per n-gram. When full, the n-grams least recently *learned* are
evicted first (lookups do not refresh them: a draft that keeps being proposed but never comes up
in a chat again should not keep its place).

The file is written whole to a temporary file and renamed over the old one (os.replace), so a
crash leaves the old file or the new one, never a half-written one; a header carries the payload's
length and CRC, so a file damaged anyway reads as damaged. A damaged or unreadable file is one
warning in the log and an empty cache, never a traceback. The file is untrusted input (a user's
-lcd, a file planted in the data folder): what is not a regular file (a folder, a FIFO, a
device) is refused before it is read, a file larger than a full cache's is not read, its payload
is inflated to at most a full cache's size, parsing stops at the header's count of n-grams (at
most the bound), and every token id is checked against the main model's vocabulary and every
count against what learning keeps.
"""

from __future__ import annotations

import hashlib
import logging
import os
import stat
import struct
import sys
import threading
import zlib
from array import array
from collections import OrderedDict
from pathlib import Path
from typing import Iterable, NamedTuple, Sequence

from app.common.atomic import read_capped, private_dir, write_atomic
from app.engine.errors import SpeculaError

log = logging.getLogger(__name__)

N_MIN, N_MAX = 2, 4
MAX_FOLLOWERS = 3
DEFAULT_MAX_KEYS = 100_000
COUNT_CAP = 1 << 15  # counts of a key are halved past this: recent use keeps its weight
MAGIC = b"SPNG"
VERSION = 1
_HEADER = struct.Struct("<4sH32sIIQ")  # magic, version, vocab key, n keys, crc32, payload bytes


class NgramCacheError(SpeculaError):
    """The cache file belongs to another vocabulary (a user's -lcd pointing at the wrong file)."""


class NgramCacheSaveError(NgramCacheError, OSError):
    """The cache could not be written: one line on the command line (a SpeculaError), a warning
    in the window (which catches OSError)."""


def vocab_key(tokens: Iterable[str], vocab_type: str | None = None) -> str:
    """32 hex digits naming a vocabulary: a hash of its token texts in id order."""
    digest = hashlib.sha256((vocab_type or "").encode())
    for token in tokens:
        digest.update(token.encode("utf-8", "surrogatepass"))
        digest.update(b"\0")
    return digest.hexdigest()[:32]


class NgramCache:
    """n-gram -> [total, token, count, token, count, ...] (followers by count, most first)."""

    def __init__(self, key: str = "", max_keys: int = DEFAULT_MAX_KEYS) -> None:
        if max_keys < 1:
            raise ValueError("max_keys must be at least 1")
        self.key = key
        self.max_keys = max_keys
        self._table: OrderedDict[tuple[int, ...], list[int]] = OrderedDict()
        self._lock = threading.Lock()  # the window's chat and its server may share one cache
        self.dirty = False
        self._last: list[int] = []  # the context learned last (learn_new)

    def __len__(self) -> int:
        return len(self._table)

    def copy(self) -> NgramCache:
        """An independent cache with the same contents (a benchmark's rows start alike)."""
        other = NgramCache(self.key, self.max_keys)
        with self._lock:
            other._table = OrderedDict((k, list(v)) for k, v in self._table.items())
        return other

    # --- learning ---------------------------------------------------------------------------

    def learn(self, tokens: Sequence[int], start: int = 0) -> None:
        """Count every n-gram of `tokens` whose follower is at index `start` or later."""
        with self._lock:
            self._learn_locked(list(tokens), start)

    def learn_new(self, context: Sequence[int]) -> None:
        """Learn a finished generation's context. A chat's next prompt repeats the conversation
        so far: only n-grams followed by a token past the prefix shared with the context learned
        last are counted, or earlier turns would be counted once per turn."""
        ids = list(context)
        with self._lock:  # `_last` too: the window and its server may finish at once
            shared = 0
            for a, b in zip(self._last, ids):
                if a != b:
                    break
                shared += 1
            self._learn_locked(ids, shared)
            self._last = ids

    def _learn_locked(self, ids: list[int], start: int) -> None:
        for i in range(max(start, N_MIN), len(ids)):
            follower = ids[i]
            for n in range(N_MIN, min(N_MAX, i) + 1):
                self._add(tuple(ids[i - n : i]), follower)
        while len(self._table) > self.max_keys:
            self._table.popitem(last=False)
        self.dirty = self.dirty or len(ids) > start

    def _add(self, key: tuple[int, ...], follower: int) -> None:
        # Build then publish: `predict` reads without the lock (a draft must not wait for a
        # long prompt being learned), so an entry in the table is never changed in place; a
        # new list replaces it whole, and a reader holds the old one or the new one.
        old = self._table.pop(key, None)
        entry = list(old) if old else [0]
        entry[0] += 1
        for j in range(1, len(entry), 2):
            if entry[j] == follower:
                entry[j + 1] += 1
                break
        else:
            if len(entry) >= 1 + 2 * MAX_FOLLOWERS:
                del entry[-2:]  # the least counted follower makes room
            entry += [follower, 1]
        _sort_followers(entry)
        if entry[0] > COUNT_CAP:
            entry[:] = [max(1, v // 2) if j % 2 == 0 else v for j, v in enumerate(entry)]
        self._table[key] = entry  # (re)inserted last: the most recently learned

    # --- drafting ---------------------------------------------------------------------------

    def predict(self, tail: Sequence[int]) -> tuple[int, int] | None:
        """(matched n, next token) for the longest n-gram ending `tail` whose top follower is
        trusted: at least half of what followed it, and seen twice for the shortest n-grams.
        Safe beside a learner without the lock: entries are published whole (see `_add`)."""
        for n in range(min(N_MAX, len(tail)), N_MIN - 1, -1):
            entry = self._table.get(tuple(tail[-n:]))
            if entry is None:
                continue
            count = entry[2]
            if 2 * count >= entry[0] and (count >= 2 or n > N_MIN):
                return n, entry[1]
        return None

    def continuation(self, context: Sequence[int], max_tokens: int) -> tuple[int, tuple[int, ...]]:
        """Chain predictions after `context`: (first match's n, tokens); (0, ()) without a match.
        A miss costs N_MAX - N_MIN + 1 dictionary lookups."""
        tail = list(context[-N_MAX:])
        first_n, out = 0, []
        while len(out) < max_tokens:
            hit = self.predict(tail)
            if hit is None:
                break
            first_n = first_n or hit[0]
            out.append(hit[1])
            tail = tail[1:] + [hit[1]] if len(tail) >= N_MAX else tail + [hit[1]]
        return first_n, tuple(out)

    # --- persistence ------------------------------------------------------------------------

    def save(self, path: str | Path) -> None:
        """Write the cache atomically (temporary file, fsync, rename); NgramCacheSaveError when
        it cannot be written or `path` is not a regular file (a folder, a device: never replaced)."""
        path = Path(path)
        why = not_a_cache_file(path)
        if why:
            raise NgramCacheSaveError(f"the n-gram cache cannot be saved: {why}")
        try:
            self._write(path)
        except OSError as exc:
            raise NgramCacheSaveError(f"the n-gram cache cannot be saved to {path}: {exc.strerror or exc}") from exc

    def _write(self, path: Path) -> None:
        with self._lock:
            flat = array("I")
            for key, entry in self._table.items():
                flat.append(len(key))
                flat.extend(key)
                flat.append((len(entry) - 1) // 2)
                flat.extend(entry)
            n_keys = len(self._table)
            self.dirty = False
        if sys.byteorder == "big":
            flat.byteswap()  # the file is little-endian everywhere
        payload = zlib.compress(flat.tobytes(), 6)
        header = _HEADER.pack(MAGIC, VERSION, self.key.encode("ascii")[:32], n_keys,
                              zlib.crc32(payload), len(payload))
        # What was learned from the user's chats is theirs alone: folders 0700, the file 0600, and
        # a fresh staging file (app.common.atomic), not a fixed name a link could be planted on.
        private_dir(path.parent)
        write_atomic(path, header + payload, fsync=True)

    @classmethod
    def load(cls, path: str | Path, key: str, max_keys: int = DEFAULT_MAX_KEYS,
             vocab_size: int | None = None) -> NgramCache:
        """The cache saved at `path`; an empty one when there is none or it is damaged, too
        large, not a regular file or holds a token id at or past `vocab_size` (with a warning).
        Raises NgramCacheError when the file is another vocabulary's."""
        cache = cls(key, max_keys)
        path = Path(path)
        limits = _Limits.of(max_keys)
        try:
            data = read_capped(path, limits.file_bytes, what="a cache file")
        except FileNotFoundError:
            return cache
        except (OSError, ValueError) as exc:
            log.warning("n-gram cache %s cannot be read (%s); starting with an empty cache", path, exc)
            return cache
        try:
            file_key, table = _parse(data, limits, vocab_size)
        except (ValueError, struct.error, zlib.error, IndexError) as exc:
            log.warning("n-gram cache %s is damaged (%s); starting with an empty cache", path, exc)
            return cache
        if file_key != key:
            raise NgramCacheError(f"{path} is the n-gram cache of another vocabulary; use another file")
        for k in list(table)[-max_keys:]:
            cache._table[k] = table[k]
        return cache


def not_a_cache_file(path: str | Path) -> str | None:
    """Why `path` cannot be a cache file (it exists and is not a regular file: a folder, a
    device, a FIFO; or it holds something else than a cache), or None. Saving over such a
    path would replace what Specula did not write."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        return str(exc)
    if not stat.S_ISREG(mode):
        return f"{path} is not a regular file"
    try:
        head = read_capped(path, 1 << 40, first=len(MAGIC))
    except (OSError, ValueError) as exc:
        return f"{path} cannot be read ({exc})"
    if head and head != MAGIC:
        return f"{path} is not an n-gram cache file (Specula replaces only a cache it wrote)"
    return None


class _Limits(NamedTuple):
    """What a cache file may hold: a file written by a cache of the default bound (or of
    `max_keys`, when larger) always fits; anything larger is refused before it is inflated."""

    keys: int
    raw_bytes: int  # the decompressed payload
    file_bytes: int

    @classmethod
    def of(cls, max_keys: int) -> _Limits:
        keys = max(max_keys, DEFAULT_MAX_KEYS)
        raw = keys * _MAX_ENTRY_WORDS * 4
        # zlib's worst case adds 5 bytes a 16 KB block (incompressible data) plus its wrapper.
        return cls(keys, raw, _HEADER.size + raw + raw // 1000 + 1024)


_MAX_ENTRY_WORDS = 1 + N_MAX + 1 + 1 + 2 * MAX_FOLLOWERS  # n, key, m, total, (token, count) * m


def _sort_followers(entry: list[int]) -> None:
    if len(entry) > 3 and entry[2] < max(entry[4::2]):
        pairs = sorted(zip(entry[1::2], entry[2::2]), key=lambda p: -p[1])
        entry[1:] = [v for pair in pairs for v in pair]


def _parse(data: bytes, limits: _Limits, vocab_size: int | None
           ) -> tuple[str, OrderedDict[tuple[int, ...], list[int]]]:
    magic, version, key, n_keys, crc, size = _HEADER.unpack_from(data)
    payload = data[_HEADER.size :]
    if magic != MAGIC:
        raise ValueError("not an n-gram cache file")
    if version != VERSION:
        raise ValueError(f"format version {version}, this Specula reads {VERSION}")
    if n_keys > limits.keys:
        raise ValueError(f"{n_keys} n-grams, more than a cache holds ({limits.keys})")
    if len(payload) != size or zlib.crc32(payload) != crc:
        raise ValueError("its length or checksum does not match (cut short or overwritten)")
    flat = array("I")
    flat.frombytes(_inflate(payload, limits.raw_bytes))
    if sys.byteorder == "big":
        flat.byteswap()
    table: OrderedDict[tuple[int, ...], list[int]] = OrderedDict()
    bound = vocab_size if vocab_size is not None else 1 << 32
    i = 0
    while i < len(flat) and len(table) < n_keys:  # never past the header's count, itself bounded
        n = flat[i]
        if not N_MIN <= n <= N_MAX or i + 2 + n > len(flat):
            raise ValueError(f"a malformed entry at word {i}")
        key_ids = tuple(flat[i + 1 : i + 1 + n])
        m = flat[i + 1 + n]
        entry = list(flat[i + 2 + n : i + 3 + n + 2 * m])
        if len(entry) != 1 + 2 * m or not 1 <= m <= MAX_FOLLOWERS or not _counts_ok(entry):
            raise ValueError(f"a malformed entry at word {i}")
        if max(key_ids) >= bound or max(entry[1::2]) >= bound:
            raise ValueError(f"a token id past the vocabulary (of {bound} ids) at word {i}")
        table[key_ids] = entry
        i += 3 + n + 2 * m
    if i != len(flat) or len(table) != n_keys:
        raise ValueError(f"{len(table)} entries where the header says {n_keys}")
    return key.rstrip(b"\0").decode("ascii"), table


def _counts_ok(entry: list[int]) -> bool:
    """Counts as `_add` keeps them: each follower's in 1..total, total at most COUNT_CAP (so
    that learning more never overflows the file's 32-bit words)."""
    counts = entry[2::2]
    return entry[0] <= COUNT_CAP and min(counts) >= 1 and max(counts) <= entry[0]


def _inflate(payload: bytes, cap: int) -> bytes:
    """The decompressed payload, never more than `cap` bytes of it: a small file may inflate to
    gigabytes."""
    inflater = zlib.decompressobj()
    raw = inflater.decompress(payload, cap + 1)
    if len(raw) > cap:
        raise ValueError(f"it inflates to more than {cap} bytes, more than a cache holds")
    if not inflater.eof or inflater.unused_data:
        raise ValueError("its compressed payload is cut short or followed by other bytes")
    return raw
