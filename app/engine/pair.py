"""A main model and its drafter, chosen the way a user chooses them: a draft GGUF file,
prompt lookup, or none. The draft's vocabulary is checked on headers before it is loaded: the same
vocabulary drafts token by token (ModelDrafter), another one through text (TextDrafter)."""

from __future__ import annotations

from pathlib import Path

from app.engine.compat import DraftCheck, check_draft
from app.engine.drafters import Drafter, ModelDrafter, NoDrafter, PromptLookupDrafter
from app.engine.errors import IncompatibleDraftError
from app.engine.gguf_info import GGUFInfo, read_gguf_info
from app.engine.loader import LoadedModel, load_model
from app.engine.text_drafter import TextDrafter

LOOKUP = "lookup"
NONE = "none"


def check_pair(main: GGUFInfo, draft: GGUFInfo) -> DraftCheck:
    """How the draft drafts (token- or text-level); raise IncompatibleDraftError (exit code 3 on
    the command line) naming the reason when it cannot."""
    result = check_draft(main, draft)
    if not result:
        error = IncompatibleDraftError(
            f"{draft.path.name} cannot draft for {main.path.name}: {result.reason}"
        )
        error.exit_code = 3  # type: ignore[attr-defined]
        raise error
    return result


def load_draft(main: LoadedModel, draft_path: str | Path, **load_kwargs) -> LoadedModel:
    """Check the draft against the main model's header, then load it."""
    check_pair(main.info, read_gguf_info(draft_path))
    return load_model(draft_path, **load_kwargs)


def make_drafter(
    main: LoadedModel,
    kind: str = NONE,
    draft: LoadedModel | None = None,
    draft_ctx: int | None = None,
) -> Drafter:
    """kind: "none", "lookup", or "model" (then `draft` is the loaded draft model)."""
    if draft is not None:
        vocab = main.kv_model(1).vocab_size
        if check_draft(main.info, draft.info).text_level:
            return TextDrafter(draft.kv_model(draft_ctx), draft.tokenizer, main.tokenizer, vocab,
                               name=f"{draft.path.stem} (text-level)")
        return ModelDrafter(draft.kv_model(draft_ctx), vocab, name=draft.path.stem)
    if kind == LOOKUP:
        return PromptLookupDrafter()
    if kind == NONE:
        return NoDrafter()
    raise ValueError(f"unknown drafter {kind!r}")
