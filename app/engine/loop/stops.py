"""Stop strings on streamed text: hold back what could still become a stop string."""

from __future__ import annotations


class StopMatcher:
    def __init__(self, stop_strings: tuple[str, ...] = ()) -> None:
        self.stop_strings = tuple(s for s in stop_strings if s)
        self.text = ""  # everything released so far
        self._held = ""

    def _hold_length(self, pending: str) -> int:
        """Length of the longest tail of `pending` that is a proper prefix of a stop string."""
        longest = 0
        for stop in self.stop_strings:
            for n in range(min(len(stop) - 1, len(pending)), longest, -1):
                if pending.endswith(stop[:n]):
                    longest = n
                    break
        return longest

    def push(self, delta: str) -> tuple[str, bool]:
        """Add streamed text; return (text safe to show, whether a stop string was reached)."""
        pending = self._held + delta
        hits = [i for i in (pending.find(s) for s in self.stop_strings) if i >= 0]
        if hits:
            released, self._held = pending[: min(hits)], ""
            self.text += released
            return released, True
        hold = self._hold_length(pending)
        released = pending[: len(pending) - hold]
        self._held = pending[len(pending) - hold :]
        self.text += released
        return released, False

    def flush(self, delta: str = "") -> str:
        """The generation ended without a stop string: release everything."""
        released, hit = self.push(delta)
        if not hit:
            released += self._held
            self.text += self._held
            self._held = ""
        return released
