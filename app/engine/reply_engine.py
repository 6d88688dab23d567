"""Open the reply engine a spec names (app.engine.session's seam): the one place that knows the
three kinds, so that no front end needs to."""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.engine.errors import Cancel
from app.engine.session import LocalOptions, Progress, ServerSpec, Session

if TYPE_CHECKING:
    from app.engine.pair_loader import PairSpec


def open_session(spec: PairSpec | ServerSpec, progress: Progress | None = None, cancel: Cancel | None = None,
                 options: LocalOptions = LocalOptions()) -> Session:
    """Open the engine `spec` names: load the pair here, start llama-server, or reach the server
    at its URL. Progress fractions cover the whole open; `cancel()` true stops it (LoadCancelled)."""
    if isinstance(spec, ServerSpec):
        from app.engine.llama_server.session import open_server

        return open_server(spec, progress, cancel)
    from app.engine.local_session import open_local

    return open_local(spec, progress, cancel, options)


def session_on(main, drafter=None, n_ctx: int | None = None) -> Session:
    """A session in this process on a main model loaded already (app.engine.loader.LoadedModel),
    drafted for by `drafter` (None: plain decoding), with a KV cache of its own: what Compare
    opens per reply, so that every row decodes each prompt from an empty cache."""
    from app.engine.local_session import LocalSession

    return LocalSession.around(main, drafter, n_ctx)
