"""app.common.batches: items handed over together, the first at once, the rest at most every
`every_s`, nothing lost or reordered, what is left sent at the end."""

from __future__ import annotations

import time

from app.common.batches import Batcher


def test_the_first_goes_at_once_and_the_rest_wait_for_their_interval():
    sent: list[tuple] = []
    batcher = Batcher(sent.append, every_s=0.05)
    batcher.add(1)
    assert sent == [(1,)]
    for item in (2, 3, 4):
        batcher.add(item)
    assert sent == [(1,)]  # within the interval: held
    time.sleep(0.06)
    batcher.add(5)
    assert sent == [(1,), (2, 3, 4, 5)]
    batcher.add(6)
    batcher.send()
    batcher.send()  # nothing left: nothing sent
    assert sent == [(1,), (2, 3, 4, 5), (6,)]
