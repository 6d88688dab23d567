"""The n-gram cache against concurrent use and hostile files (issue 42, items 5 and 7): readers
racing learners never fail, and a file of any shape is one warning and an empty cache."""

from __future__ import annotations

import sys
import threading
import time

from app.engine.drafting.ngram_cache import NgramCache


def test_readers_racing_learners_never_fail():
    # The window's chat and its server share one cache: one learns while the other drafts. A
    # tiny bound makes every learned n-gram a new entry (the moment an entry is half built), and
    # a short switch interval lets the threads interleave inside `_add`.
    cache = NgramCache("k", max_keys=3)
    errors: list[BaseException] = []
    stop = threading.Event()

    def learner(offset: int) -> None:
        i = 0
        while not stop.is_set():
            cache.learn([1, 2, 3 + (i + offset) % 5, 4])
            i += 1

    def reader() -> None:
        try:
            while not stop.is_set():
                for tail in ([1, 2], [9, 1, 2], [2, 3], [2, 4], [3, 4]):
                    cache.predict(tail)
                cache.continuation([1, 2], 4)
        except BaseException as exc:  # noqa: BLE001 - what failed is what the test reports
            errors.append(exc)
            stop.set()

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    threads = [threading.Thread(target=learner, args=(k,)) for k in range(2)]
    threads += [threading.Thread(target=reader) for _ in range(2)]
    try:
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 2.5  # before the fix: an IndexError within about a second
        while time.monotonic() < deadline and not stop.is_set():
            time.sleep(0.05)
    finally:
        stop.set()
        for thread in threads:
            thread.join()
        sys.setswitchinterval(old)
    assert not errors, repr(errors[0])


# --- hostile files ----------------------------------------------------------------------------

import json  # noqa: E402
import logging  # noqa: E402
import os  # noqa: E402
import random  # noqa: E402
import struct  # noqa: E402
import subprocess  # noqa: E402
import tracemalloc  # noqa: E402
import zlib  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from app.engine.drafting.ngram_cache import _HEADER, MAGIC, VERSION  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def write_cache_file(path: Path, raw: bytes, n_keys: int, key: str = "k") -> Path:
    """A file with a valid header and checksum around `raw` (compressed): only what is inside
    is hostile."""
    payload = zlib.compress(raw, 9)
    path.write_bytes(_HEADER.pack(MAGIC, VERSION, key.encode(), n_keys, zlib.crc32(payload), len(payload)) + payload)
    return path


def load_quietly(path: Path, caplog, **kwargs) -> NgramCache:
    with caplog.at_level(logging.WARNING, logger="app.engine.drafting.ngram_cache"):
        return NgramCache.load(path, "k", **kwargs)


def test_a_small_file_that_inflates_to_a_huge_one_is_refused_without_inflating_it(tmp_path, caplog):
    zeros = zlib.compressobj(9)
    payload = b"".join(zeros.compress(bytes(1 << 20)) for _ in range(96)) + zeros.flush()  # 96 MB
    path = tmp_path / "bomb.ngc"
    path.write_bytes(_HEADER.pack(MAGIC, VERSION, b"k", 10, zlib.crc32(payload), len(payload)) + payload)
    assert path.stat().st_size < 200_000
    tracemalloc.start()
    try:
        cache = load_quietly(path, caplog)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(cache) == 0 and peak < 32 << 20, peak
    assert any("inflates to more than" in r.getMessage() for r in caplog.records)


def test_a_file_larger_than_a_cache_can_be_is_not_read(tmp_path, caplog):
    path = tmp_path / "huge.ngc"
    with open(path, "wb") as handle:
        handle.truncate(64 << 20)  # sparse: costs no disk
    tracemalloc.start()
    try:
        cache = load_quietly(path, caplog)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(cache) == 0 and peak < 16 << 20, peak
    assert any("cannot be read" in r.getMessage() and "more than a cache file can be" in r.getMessage()
               for r in caplog.records)


def test_token_ids_past_the_vocabulary_are_refused(tmp_path, caplog):
    path = tmp_path / "k.ngc"
    for bad in (559, 2**31):
        cache = NgramCache("k")
        cache.learn([1, 2, 3, bad, 4])
        cache.save(path)
        assert len(load_quietly(path, caplog, vocab_size=500)) == 0, bad
    assert sum("vocabulary" in r.getMessage() for r in caplog.records) == 2
    cache = NgramCache("k")
    cache.learn([1, 2, 3, 499])
    cache.save(path)
    assert len(load_quietly(path, caplog, vocab_size=500)) == 3  # the last id itself is fine


def test_counts_that_would_overflow_the_file_are_refused(tmp_path, caplog):
    # (1, 2) -> 3, its count 2^32 - 1: learning it once more could not be saved again.
    raw = struct.pack("<9I", 2, 1, 2, 1, 2**32 - 1, 3, 2**32 - 1, 0, 0)[:7 * 4]
    path = write_cache_file(tmp_path / "k.ngc", raw, 1)
    assert len(load_quietly(path, caplog)) == 0
    assert any("malformed" in r.getMessage() for r in caplog.records)


# Paths that are not regular files: each is refused at once (a FIFO must not block the open,
# /dev/zero must not be read until the memory runs out). Run in a child with a memory limit and
# a timeout, so that a regression fails the test instead of the machine.
SPECIAL_LOADS = """
import json, logging, os, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
from app.engine.drafting.ngram_cache import NgramCache
warnings = []
logging.getLogger("app.engine.drafting.ngram_cache").addHandler(type("H", (logging.Handler,), {"emit": lambda self, r: warnings.append(r.getMessage())})())
sizes = [len(NgramCache.load(p, "k")) for p in sys.argv[1:]]
print(json.dumps([sizes, warnings]))
"""


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="POSIX paths")
def test_paths_that_are_not_regular_files_are_refused_at_once(tmp_path):
    fifo = tmp_path / "fifo.ngc"
    os.mkfifo(fifo)
    paths = [str(fifo), "/dev/zero", "/", str(tmp_path)]
    result = subprocess.run([sys.executable, "-c", SPECIAL_LOADS, *paths], cwd=ROOT, capture_output=True,
                            text=True, timeout=30)
    assert result.returncode == 0, result.stderr[-2000:]
    sizes, warnings = json.loads(result.stdout)
    assert sizes == [0, 0, 0, 0] and len(warnings) == 4, warnings
    assert all("not a regular file" in w or "Is a directory" in w for w in warnings), warnings


def test_saving_over_a_path_that_is_not_a_regular_file_is_refused_in_one_line(tmp_path):
    from app.engine.drafting.ngram_cache import NgramCacheError

    cache = NgramCache("k")
    cache.learn([1, 2, 3])
    for target in (tmp_path, Path("/")):
        with pytest.raises(NgramCacheError) as caught:
            cache.save(target)
        assert isinstance(caught.value, OSError)  # the window's save catches OSError: a warning
        assert "\n" not in str(caught.value) and "not a regular file" in str(caught.value)
    assert list(tmp_path.iterdir()) == []


def fuzzed(rng: random.Random, good: bytes) -> bytes:
    """A payload (decompressed) from a good one: words changed, cut, repeated, or random."""
    words = list(struct.unpack(f"<{len(good) // 4}I", good))
    choice = rng.randrange(5)
    if choice == 0:
        for _ in range(rng.randint(1, 4)):
            words[rng.randrange(len(words))] = rng.choice([0, 1, 2, 4, 5, 7, 499, 500, 2**31, 2**32 - 1])
    elif choice == 1:
        words = words[: rng.randrange(len(words))]
    elif choice == 2:
        words = words * rng.randint(2, 50)
    elif choice == 3:
        words = [rng.randrange(2**32) for _ in range(rng.randint(0, 64))]
    else:
        start = rng.randrange(len(words))
        words[start:start] = [rng.randrange(8) for _ in range(rng.randint(1, 6))]
    return struct.pack(f"<{len(words)}I", *words)


def test_fuzzed_cache_files_load_as_a_cache_or_an_empty_one(tmp_path, caplog):
    """Seeded and bounded in time: whatever the payload, load gives a cache whose every entry
    is well formed and within the vocabulary (or an empty one), never an exception, and
    drafting and learning from it then work."""
    good = NgramCache("k")
    good.learn([1, 2, 3, 4, 5, 1, 2, 3, 6, 7, 1, 2])
    good.save(tmp_path / "good.ngc")
    data = (tmp_path / "good.ngc").read_bytes()
    good_raw = zlib.decompress(data[_HEADER.size:])
    n_keys = len(good)
    rng = random.Random(42)
    path = tmp_path / "k.ngc"
    deadline = time.monotonic() + 3.0
    runs = 0
    while time.monotonic() < deadline:
        raw = fuzzed(rng, good_raw)
        write_cache_file(path, raw, rng.choice([n_keys, 0, 1, len(raw) // 28, 2**32 - 1]))
        cache = load_quietly(path, caplog, vocab_size=500)
        for key, entry in cache._table.items():
            assert 2 <= len(key) <= 4 and max(key) < 500 and max(entry[1::2]) < 500
            assert len(entry) in (3, 5, 7) and 1 <= entry[2] <= entry[0]
            cache.continuation(list(key), 8)
        cache.learn([1, 2, 3, 4, 5])
        cache.save(path)
        runs += 1
    assert runs >= 50


def test_a_cache_file_drafting_ids_past_the_vocabulary_does_not_fail_the_run(tiny_paths, tiny_loaded, tmp_path):
    """`specula run -lcd FILE` with a cache whose follower is past the vocabulary: before, an
    IndexError traceback at the first draft; now a warning and an empty cache."""
    from app.engine.drafting.factory import main_vocab_key
    from tests.tiny_gguf import VOCAB_SIZE

    main = tiny_loaded("llama-f32")
    prompt = "def add(a, b):"
    ids = main.tokenizer.encode(prompt)
    cache = NgramCache(main_vocab_key(main))
    for token in range(VOCAB_SIZE):  # whatever the first reply token, the next is drafted
        for _ in range(2):
            cache.learn([ids[-1], token, VOCAB_SIZE + 40])
    path = tmp_path / "hostile.ngc"
    cache.save(path)
    result = subprocess.run(
        [sys.executable, "-m", "app", "run", "-m", str(tiny_paths["llama-f32"]), "-p", prompt, "-n", "4",
         "--temp", "0", "--spec-type", "ngram-cache", "-lcd", str(path), "--draft-fixed",
         "--device", "cpu", "--dtype", "float32"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "Traceback" not in result.stderr and "past the vocabulary" in result.stderr
