"""The drafts a user names (`--drafts none,lookup,PATH_OR_REPO,...`) and the configurations they make.

A draft is "none", "lookup", "ngram-cache", "ngram-mod", "ngram-map-k", "ngram-map-k4v" (or n-gram
kinds joined by "+", one combined drafter: "lookup+ngram-cache"), a GGUF file, a built-in model's name (app.hub.builtin.BUILTIN_NAMES), or
a Hugging Face file as "owner/repo/file.gguf". A hub file is taken from the Hugging Face cache when
it is there, and downloaded (into that cache, verified) only when it is not.

Beside Specula's own drafters, llama.cpp's: "llama-server:TYPE[+TYPE]" runs the same prompt ids on
llama-server started here with that --spec-type list ("llama-server:none" is its plain decoding;
draft-* types use the -md model; any of its types brings its plain decoding along, to measure
drafting against), and a server at a URL (`--server URL`) answers the same prompts.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Callable

from app.compare.results import (DEFAULT_DRAFT_MAX, ENGINE_KINDS, LLAMA_SERVER, MODEL, NONE, SERVER_URL, ConfigSpec,
                                 DraftChoice, is_ngram_kind)
from app.engine.errors import SpeculaError
from app.hub.builtin import BUILTIN_MODELS, resolve_model_arg
from app.hub.names import model_title

log = logging.getLogger(__name__)

Notice = Callable[[str], None]


def parse_drafts(value: str) -> list[str]:
    """The comma-separated --drafts list, "none" first and every name once."""
    names = [v.strip() for v in value.split(",") if v.strip()]
    return [NONE] + [n for i, n in enumerate(names) if n != NONE and n not in names[:i]]


def parse_lengths(value: str | None, flag: str = "--draft-max", most: int | None = None) -> tuple[int, ...]:
    """--draft-max "4,8,16" -> (4, 8, 16); None or "" -> () (the adaptive default). `flag` names
    the option in the one-line error; `most` bounds each length."""
    if not value:
        return ()
    try:
        lengths = tuple(dict.fromkeys(int(v) for v in value.split(",") if v.strip()))
    except ValueError as exc:
        raise SpeculaError(f"{flag} takes whole numbers separated by commas, not {value!r}") from exc
    if not lengths or min(lengths) < 1 or (most is not None and max(lengths) > most):
        raise SpeculaError(f"{flag} lengths must be at least 1" + (f" and at most {most}" if most else ""))
    return lengths


def resolve_draft(name: str, notice: Notice | None = None, draft_model: str | None = None) -> DraftChoice:
    """A --drafts entry -> a DraftChoice with a local file for a model (downloading a hub file
    that is not in the cache yet; `notice` hears about it). `draft_model`: the file llama-server's
    draft-* types read."""
    if name == NONE or is_ngram_kind(name):
        return DraftChoice(name, label=name)
    if name.startswith(LLAMA_SERVER + ":"):
        return server_choice(name[len(LLAMA_SERVER) + 1:], draft_model)
    path = Path(name).expanduser()
    builtin = {m.key: m.title for m in BUILTIN_MODELS}
    if name in builtin and not path.exists():
        return DraftChoice(MODEL, str(resolve_model_arg(name)), builtin[name])  # the window's title
    if path.exists():
        local = resolve_model_arg(name)
        return DraftChoice(MODEL, str(local), _label(local))  # as the window's library names a file
    repo_file = _hub_form(name)
    if repo_file is None:
        raise SpeculaError(f"{name}: no such file (a draft is none, lookup, ngram-cache, ngram-mod, ngram-map-k, ngram-map-k4v or "
                           "several joined by +, a GGUF file, a built-in model or owner/repo/file.gguf)")
    local = _hub_file(*repo_file, notice)
    return DraftChoice(MODEL, str(local), model_title(*repo_file))  # as the window names a download


def server_choice(types: str, draft_model: str | None = None) -> DraftChoice:
    """llama-server with llama.cpp's --spec-type list `types` ("+" or "," between them)."""
    from app.engine.llama_server.spec import DRAFT_MODEL_TYPES, LLAMA_SPEC_TYPES

    names = tuple(dict.fromkeys(t.strip() for t in types.replace("+", ",").split(",") if t.strip())) or (NONE,)
    unknown = [t for t in names if t not in LLAMA_SPEC_TYPES]
    if unknown:
        raise SpeculaError(f"llama-server:{types}: {unknown[0]!r} is not a llama.cpp --spec-type "
                           f"({', '.join(LLAMA_SPEC_TYPES)})")
    if NONE in names and len(names) > 1:
        raise SpeculaError(f"llama-server:{types}: none cannot be combined with other types")
    needs_draft = [t for t in names if t in DRAFT_MODEL_TYPES]
    if needs_draft and not draft_model:
        raise SpeculaError(f"llama-server:{types}: {needs_draft[0]} needs a draft model (-md FILE)")
    path = str(resolve_model_arg(draft_model)) if needs_draft else None
    plain = names == (NONE,)
    shown = "plain" if plain else "+".join(names)
    return DraftChoice(LLAMA_SERVER, path, f"llama-server {shown}", server_types="" if plain else ",".join(names))


def url_choice(url: str) -> DraftChoice:
    """A server at a URL (its model and speculation) as one more row."""
    from urllib.parse import urlsplit

    return DraftChoice(SERVER_URL, None, f"server {urlsplit(url).netloc}", server_url=url)


def _hub_form(name: str) -> tuple[str, str] | None:
    parts = name.split("/")
    if len(parts) < 3 or not name.lower().endswith(".gguf") or not all(parts):
        return None
    return "/".join(parts[:2]), "/".join(parts[2:])


def _hub_file(repo_id: str, filename: str, notice: Notice | None) -> Path:
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(repo_id, filename)
    if isinstance(cached, str) and Path(cached).exists():
        return Path(cached)
    from app.hub.download import download_gguf

    if notice is not None:
        notice(f"downloading {repo_id}/{filename} into the Hugging Face cache")
    return download_gguf(repo_id, filename)


def _label(path: Path) -> str:
    """A local draft's name: its file name without ".gguf" (never the header's general.name)."""
    return path.name[: -len(".gguf")] if path.name.lower().endswith(".gguf") else path.name


def plan_configs(drafts: list[DraftChoice], sweep: tuple[int, ...] = ()) -> list[ConfigSpec]:
    """"none" first (the baseline, run once), then each drafter: with the adaptive length, or
    with each fixed length of the sweep. Names are unique (a second model of the same name gets
    a number). llama-server's types come with its plain decoding (added before them where not
    asked for): their drafting is measured against it, their engine's speed against ours."""
    configs = [ConfigSpec(NONE, NONE, label=NONE)]
    used = {NONE}
    for draft in _with_server_plain(drafts):
        if draft.kind == NONE:
            continue
        label = _unique(draft.name, used)
        used.add(label)
        server = {"server_types": draft.server_types, "server_url": draft.server_url}
        if not sweep or draft.kind in ENGINE_KINDS:  # llama.cpp's own length rules: no sweep of ours
            configs.append(ConfigSpec(label, draft.kind, draft.path, label, DEFAULT_DRAFT_MAX, True, **server))
            continue
        for k in sweep:
            configs.append(ConfigSpec(f"{label} k={k}", draft.kind, draft.path, label, k, False))
    return configs


def _with_server_plain(drafts: list[DraftChoice]) -> list[DraftChoice]:
    servers = [i for i, d in enumerate(drafts) if d.kind == LLAMA_SERVER]
    if not servers or any(not drafts[i].server_types for i in servers):
        return drafts
    first = servers[0]
    return [*drafts[:first], server_choice(NONE), *drafts[first:]]


def _unique(name: str, used: set[str]) -> str:
    if name not in used:
        return name
    n = 2
    while f"{name} #{n}" in used:
        n += 1
    return f"{name} #{n}"
