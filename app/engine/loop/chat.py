"""Conversations -> prompt tokens with the model's own chat template, or as plain text to continue.

When a conversation outgrows the context, the oldest turns (never the system prompt) are left out
of the prompt (fitted_prompt_ids); the reply engine (app.engine.local_session) keeps the main
model's KV cache between turns, so only the new turn is evaluated.
"""

from __future__ import annotations

import logging
import re
import weakref
from pathlib import Path
from typing import Sequence

import jinja2

from app.engine.errors import ChatTemplateError, ContextFullError
from app.engine.loop.template_guard import install as install_template_guard

log = logging.getLogger(__name__)

# Used only when the GGUF file has no template (base models such as Gemma 3 270M).
FALLBACK_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{ message['content'] }}\n\n"
    "{% elif message['role'] == 'user' %}User: {{ message['content'] }}\n"
    "{% else %}Assistant: {{ message['content'] }}\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}Assistant:{% endif %}"
)
FALLBACK_STOPS = ("\nUser:",)


def plain_text(messages: list[dict[str, str]]) -> str:
    """Plain completion (base models, which have no chat template): the conversation as the one
    text it is, without the fallback's made-up "User:"/"Assistant:" roles. A reply continues the
    text before it; the user's next words start a new line after a reply."""
    text = ""
    for message in messages:
        if text and message["role"] != "assistant" and not text.endswith("\n"):
            text += "\n"
        text += message["content"]
    return text


def has_chat_template(tokenizer) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def format_stops(tokenizer, plain: bool = False) -> tuple[str, ...]:
    """The stop strings a chat's format adds: a model without a chat template answers in the
    fallback's "User:/Assistant:" frame, which needs its own stop (plain completion has none)."""
    return () if plain or has_chat_template(tokenizer) else FALLBACK_STOPS


def render_prompt(tokenizer, messages: list[dict[str, str]]) -> list[int]:
    """Token ids of the conversation followed by the assistant's turn prefix.

    Special tokens are parsed only where the template writes them: text inside a message that
    spells one (a user typing `<|im_start|>system`) stays ordinary text, as with llama.cpp's
    parse_special=false for user text, so a message cannot forge another turn."""
    template = None if has_chat_template(tokenizer) else FALLBACK_TEMPLATE
    specials = _special_pattern(tokenizer)
    if specials is None or not any(_spells_special(m, specials) for m in messages):
        text = _render(tokenizer, messages, template)  # the common case: one encode, as before
        return tokenizer.encode(text, add_special_tokens=not _starts_with_bos(tokenizer, text))
    return _render_guarded(tokenizer, messages, template, specials)


def _render(tokenizer, messages: list[dict], template: str | None) -> str:
    """The template's text; ChatTemplateError (one line) for whatever the template's code raises:
    it comes from the file, so a traceback would blame us and tell the user nothing. Its
    arithmetic is bounded (app.engine.loop.template_guard): a template cannot build gigabytes."""
    install_template_guard()
    try:
        return tokenizer.apply_chat_template(messages, chat_template=template, add_generation_prompt=True,
                                             tokenize=False)
    except _TEMPLATE_FAILURES as exc:
        detail = (str(exc).splitlines() or [""])[0][:200] or type(exc).__name__
        source = Path(str(getattr(tokenizer, "name_or_path", "") or "")).name
        whose = f"the chat template of {source}" if source else "the model's chat template"
        raise ChatTemplateError(f"{whose} failed on these messages: {detail}") from None


# What a template's code can raise: jinja2's own errors (raise_exception, syntax, the sandbox's
# SecurityError, undefined values) and the Python errors of its expressions (the sandbox's
# OverflowError for a range over 100,000 items, a division by zero, recursion without end).
_TEMPLATE_FAILURES = (jinja2.TemplateError, ArithmeticError, LookupError, TypeError, ValueError,
                      AttributeError, RecursionError)


# Message content is wrapped in these while the template renders, to tell it from the template's
# own text afterwards. Supplementary Private Use Area code points: in no template or tokenizer.
_OPEN, _CLOSE = "\U000F0000", "\U000F0001"
_PATTERNS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _special_pattern(tokenizer) -> re.Pattern | None:
    """A regex matching the tokenizer's special tokens, longest first (built once per tokenizer)."""
    try:
        return _PATTERNS[tokenizer]
    except (KeyError, TypeError):
        pass
    decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
    names = {t.content for t in decoder.values() if getattr(t, "special", False) and t.content}
    names |= {t for t in getattr(tokenizer, "all_special_tokens", ()) if t}
    pattern = re.compile("|".join(map(re.escape, sorted(names, key=len, reverse=True)))) if names else None
    try:
        _PATTERNS[tokenizer] = pattern
    except TypeError:  # not weak-referenceable: rebuilt next time
        pass
    return pattern


def _spells_special(message: dict, specials: re.Pattern) -> bool:
    content = message.get("content")
    return isinstance(content, str) and specials.search(content) is not None


def _render_guarded(tokenizer, messages: list[dict], template: str | None, specials: re.Pattern) -> list[int]:
    """Render with each content marked, then encode: the template's special tokens as special,
    everything between them (content included) with special-token parsing off."""
    wrapped = [{**m, "content": _OPEN + m["content"] + _CLOSE} if isinstance(m.get("content"), str) else m
               for m in messages]
    pieces = _split_marked(_render(tokenizer, wrapped, template))
    if pieces is None:
        # The template cut or moved the content (a filter that splits it): the marks cannot be
        # trusted, so the special-token text is taken out of the content instead.
        log.warning("chat template rewrites message content; special-token text removed from it")
        cleaned = [{**m, "content": specials.sub("", m["content"])} if isinstance(m.get("content"), str) else m
                   for m in messages]
        text = _render(tokenizer, cleaned, template)
        return tokenizer.encode(text, add_special_tokens=not _starts_with_bos(tokenizer, text))
    text = "".join(piece for _, piece in pieces)
    ids: list[int] = []
    pending: list[str] = []  # text since the last template marker, content included

    def flush() -> None:
        if pending:
            ids.extend(tokenizer.encode("".join(pending), add_special_tokens=False, split_special_tokens=True))
            pending.clear()

    for is_content, piece in pieces:
        if is_content:
            pending.append(piece)
            continue
        at = 0
        for match in specials.finditer(piece):
            pending.append(piece[at:match.start()])
            flush()
            ids.append(tokenizer.convert_tokens_to_ids(match.group()))
            at = match.end()
        pending.append(piece[at:])
    flush()
    if _starts_with_bos(tokenizer, text):
        return ids
    prefix, suffix = _added_around(tokenizer)
    return prefix + ids + suffix


def _split_marked(text: str) -> list[tuple[bool, str]] | None:
    """(is_content, text) pieces of a render whose contents were wrapped; None if the marks are
    not well nested (the template did something to the content)."""
    pieces, at, inside = [], 0, False
    for index, char in enumerate(text):
        if char not in (_OPEN, _CLOSE):
            continue
        if (char == _OPEN) == inside:
            return None
        pieces.append((inside, text[at:index]))
        at, inside = index + 1, not inside
    if inside:
        return None
    pieces.append((False, text[at:]))
    return pieces


def _added_around(tokenizer) -> tuple[list[int], list[int]]:
    """The ids `encode(..., add_special_tokens=True)` puts before and after a text (BOS, EOS)."""
    plain = tokenizer.encode("a", add_special_tokens=False)
    full = tokenizer.encode("a", add_special_tokens=True)
    for start in range(len(full) - len(plain) + 1):
        if full[start:start + len(plain)] == plain:
            return full[:start], full[start + len(plain):]
    return [], []


def _starts_with_bos(tokenizer, text: str) -> bool:
    bos = getattr(tokenizer, "bos_token", None)
    return bool(bos) and text.startswith(bos)


MIN_REPLY_TOKENS = 64  # room kept free for the answer when old turns are left out


def chat_prompt_ids(tokenizer, messages: list[dict[str, str]], plain: bool = False) -> list[int]:
    """A chat's prompt: its text to continue where `plain` (a base model), else the template's."""
    return tokenizer.encode(plain_text(messages)) if plain else render_prompt(tokenizer, messages)


def fitted_prompt_ids(tokenizer, n_ctx: int, messages: Sequence[dict[str, str]], plain: bool = False) -> list[int]:
    """The prompt of a chat that fits `n_ctx` with room for the reply: the oldest turns are left
    out where it would not (a system message first is always kept); ContextFullError where even
    the last turn does not fit."""
    system = messages[0] if messages and messages[0]["role"] == "system" else None
    head = [system] if system and system["content"] else []  # an empty one is left out
    every_turn = list(messages[1:] if system else messages)
    turns = every_turn
    while True:
        ids = chat_prompt_ids(tokenizer, head + turns, plain)
        if len(ids) + MIN_REPLY_TOKENS <= n_ctx:
            if len(turns) < len(every_turn):
                log.info("context full: left out %d old messages", len(every_turn) - len(turns))
            return ids
        if len(turns) <= 1:
            raise ContextFullError(
                f"the prompt needs {len(ids)} tokens plus {MIN_REPLY_TOKENS} for the reply, "
                f"but the context holds {n_ctx}; shorten it or raise -c"
            )
        turns = turns[2:] if len(turns) > 2 else turns[1:]
