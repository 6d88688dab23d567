"""llama.cpp's own speculation as `specula bench`'s peer: llama-server, built from the binding's
sdist (same llama.cpp commit), started fresh on 127.0.0.1 for each speculative type, prompt and
round, and sent the same prompt token ids as our rows.

Each server answers the request twice: the *first* request (a fresh server: nothing learned) and
the same request *again* (a regenerate: a type that learns, ngram-mod's pool or ngram-cache, may use
the first reply). Its decode rate and drafted/accepted counts are the server's own `timings`."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Sequence

from app.engine.llama_server.client import ServerError
from app.engine.llama_server.process import LlamaServer, ServerStartError
from app.engine.llama_server.programs import SERVER, find_program, missing_reason

log = logging.getLogger(__name__)

# llama.cpp's model-free types, each with llama.cpp's defaults (what `--spec-type T` gives a user).
SERVER_TYPES = ("none", "ngram-simple", "ngram-mod", "ngram-map-k", "ngram-map-k4v", "ngram-cache")
# With a draft model (-md): what a user of llama-server would try with a pair, by row name -> its
# extra flags: the draft model at llama.cpp's defaults and at 8 drafts, its best n-gram type, both.
PAIR_TYPES = {"none": [], "draft-simple": [], "draft-simple n-max 8": ["--spec-draft-n-max", "8"],
              "ngram-mod": [], "draft-simple,ngram-mod": []}
ERRORS = (ServerError, ServerStartError)
_WARM_PROMPT_LEN = 4  # shorter than any n-gram llama.cpp learns from a prompt: warms kernels, teaches nothing


# One timed request, as bench's other rows: (tokens, wall seconds, llama-server's decode tok/s).
ServerRun = tuple[list[int], float, float | None]


def available() -> str | None:
    """None where llama-server is here, else why not."""
    return None if find_program(SERVER) is not None else missing_reason(SERVER)


class LlamaServerPeer:
    """llama-server on the same file, threads and context as our rows, one server per
    (type, prompt, round): `first` starts it and times the first request, `again` times the
    same request on it and stops it."""

    def __init__(self, model: Path, threads: int, n_ctx: int, draft: Path | None = None,
                 extra_args: Sequence[str] = (), stop_ids: Sequence[int] = (), swa_full: bool = True) -> None:
        self.model = Path(model)
        self.stop_ids = set(stop_ids)  # llama-server's tokens end with the end-of-generation token; ours do not
        self.draft = draft
        # --swa-full: a sliding-window model's cache as ours keeps it (whole, so that a rejected
        # draft can be rolled back), so that both engines compute the same attention and time the
        # same text. With llama-server's window-sized cache, Gemma 3 270M's greedy replies to the
        # bench's prompts left ours at near-ties on 3 of 5 (rewrite at token 2, maths at token 1),
        # and on 0 of 5 with it; its plain decode rate the same (57.4/58.0, 58.1/57.1, 57.5/56.7
        # tok/s without/with on chat, maths, summarise; Zen 2, 2 threads). No effect on a model
        # without sliding-window layers.
        swa = ["--swa-full"] if swa_full else []
        self.base_args = ["-t", str(threads), "-tb", str(threads), "-c", str(n_ctx), *swa, *extra_args]
        self.types = list(PAIR_TYPES) if draft is not None else list(SERVER_TYPES)
        self._servers: dict[str, LlamaServer] = {}

    def args_for(self, row: str) -> list[str]:
        """llama-server's flags for a row ('ngram-mod', 'draft-simple n-max 8', ...)."""
        args = list(self.base_args)
        spec_type = row.split(" ")[0]
        if spec_type != "none":
            args += ["--spec-type", spec_type, *PAIR_TYPES.get(row, [])]
        if "draft-" in spec_type:
            args += ["-md", str(self.draft)]
        return args

    def first(self, spec_type: str, ids: list[int], n_predict: int) -> ServerRun:
        self._stop(spec_type)
        server = LlamaServer(self.model, self.args_for(spec_type))
        client = server.start()
        self._servers[spec_type] = server
        client.complete(ids[:_WARM_PROMPT_LEN], 2)  # first touches of the weights and kernels, untimed
        return self._timed(spec_type, ids, n_predict)

    def again(self, spec_type: str, ids: list[int], n_predict: int) -> ServerRun:
        try:
            return self._timed(spec_type, ids, n_predict)
        finally:
            self._stop(spec_type)

    def _timed(self, spec_type: str, ids: list[int], n_predict: int) -> ServerRun:
        client = self._servers[spec_type].client
        started = time.monotonic()
        reply = client.complete(ids, n_predict)
        seconds = time.monotonic() - started
        tokens = list(reply.tokens)
        if tokens and tokens[-1] in self.stop_ids:
            tokens.pop()
        return tokens, seconds, reply.decode_tps

    def _stop(self, spec_type: str) -> None:
        server = self._servers.pop(spec_type, None)
        if server is not None:
            server.stop()

    def close(self) -> None:
        for spec_type in list(self._servers):
            self._stop(spec_type)

    def check(self, ids: list[int]) -> None:
        """Start and stop the plain server once: a missing program or a model it refuses is
        known before any row is timed (ERRORS, one line)."""
        with LlamaServer(self.model, self.args_for("none")) as server:
            server.client.complete(ids[:_WARM_PROMPT_LEN], 1)
