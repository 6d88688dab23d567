"""Which draft models llama-server can use. llama.cpp drafts token by token only: its draft-simple
refuses a draft whose vocabulary is not the main model's (common_speculative_are_compatible), and
llama-server then runs without drafting and says so only in its log. The same rule, on the GGUF
headers (app.engine.drafting.compat), refuses such a pair before llama-server starts, and lets
the window offer only the drafts llama.cpp can use.

A draft of another vocabulary still drafts in Specula's own loop, through text: the refusal says
so where that is the case."""

from __future__ import annotations

from collections.abc import Sequence

from app.engine.drafting.compat import DraftCheck, check_draft
from app.engine.errors import IncompatibleDraftError
from app.engine.gguf.info import GGUFInfo
from app.engine.llama_server.spec import DRAFT_MODEL_TYPES

TOKEN_BY_TOKEN = "llama.cpp drafts token by token, with the main model's vocabulary only"
OWN_LOOP_HINT = "Specula's own loop drafts with it through text"


def uses_draft_model(types: Sequence[str]) -> bool:
    """Whether llama-server reads the draft model (-md) for these --spec-type values."""
    return any(t in DRAFT_MODEL_TYPES for t in types)


def server_usable(check: DraftCheck) -> bool:
    """Whether llama-server drafts with a draft that has this check against the main model."""
    return check.token.compatible


def why_not_on_server(check: DraftCheck) -> str | None:
    """Why llama-server cannot draft with it (one phrase, without the models' names), or None."""
    if server_usable(check):
        return None
    hint = f"; {OWN_LOOP_HINT}" if check.text_level else ""
    return f"{TOKEN_BY_TOKEN}; here {check.token.reason}{hint}"


def check_server_draft(main: GGUFInfo, draft: GGUFInfo) -> None:
    """IncompatibleDraftError (one line; exit code 3 on the command line, as for our own loop)
    where llama-server would drop the draft: llama.cpp's rule on the two headers."""
    why = why_not_on_server(check_draft(main, draft))
    if why is None:
        return
    error = IncompatibleDraftError(f"{draft.path.name} cannot draft for {main.path.name} on llama-server: {why}")
    error.exit_code = 3  # type: ignore[attr-defined]
    raise error
