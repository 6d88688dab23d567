"""The n-gram cache against concurrent use and hostile files (issue 42, items 5 and 7): readers
racing learners never fail, and a file of any shape is one warning and an empty cache."""

from __future__ import annotations

import sys
import threading
import time

from app.engine.ngram_cache import NgramCache


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
