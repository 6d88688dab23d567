"""Stop a streamed HTTP answer at once when the user cancels, even while a read waits on a server
that sends nothing (a slow or stalled one): without this, Stop waited out the read timeout
(600 s), since a cancel was only seen between chunks. Standard library only."""

from __future__ import annotations

import http.client
import socket
import threading
from contextlib import contextmanager
from typing import Callable, Iterator

POLL_S = 0.1  # how soon a cancel reaches a blocked read


class Watch:
    """Whether the watcher cut the connection (then a failed read means "cancelled"), and the
    socket to cut: http.client hands a reply without a length over to its response and forgets
    the socket, so callers name it once the request is sent (`watch.sock = connection.sock`)."""

    fired = False
    sock: socket.socket | None = None


@contextmanager
def cut_when_cancelled(connection: http.client.HTTPConnection,
                       cancelled: Callable[[], bool] | None) -> Iterator[Watch]:
    """While the block runs, a watcher thread shuts the connection's socket down once
    `cancelled()` says so: a read blocked in it returns, and the block sees `watch.fired`."""
    watch = Watch()
    if cancelled is None:
        yield watch
        return
    done = threading.Event()

    def cut() -> None:
        while not done.wait(POLL_S):
            if cancelled():
                watch.fired = True
                sock = watch.sock or connection.sock
                if sock is not None:
                    try:
                        sock.shutdown(socket.SHUT_RDWR)
                    except OSError:  # already closed
                        pass
                return

    thread = threading.Thread(target=cut, name="specula-stream-cancel", daemon=True)
    thread.start()
    try:
        yield watch
    finally:
        done.set()
