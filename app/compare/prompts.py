"""Prompt sets for a comparison: the built-in prompts by category, the user's own text, a file.

Plain data (no torch, no Qt), so the window and `specula bench` can list them at once.

A prompt file is either
- JSON lines: one object per line, `{"category": "code", "prompt": "..."}` (category optional,
  "own" when left out; blank lines ignored), for prompts that contain blank lines themselves; or
- plain text: one prompt per paragraph (paragraphs are separated by blank lines), category "own".
A file whose first non-blank line starts with "{" is read as JSON lines.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from app.engine.errors import SpeculaError

OWN = "own"  # the category of the user's own prompts


class PromptFileError(SpeculaError):
    """A prompt file that cannot be read or holds no prompt (one-line message)."""


@dataclass(frozen=True)
class Prompt:
    category: str
    text: str


# One prompt per category. "code" and "rewrite" copy from the prompt (prompt lookup's home
# ground), "chat" and "maths" mostly do not: the spread is what a user needs to see.
BUILTIN_PROMPTS: tuple[Prompt, ...] = (
    Prompt("chat", "What are three good habits for staying healthy? Answer briefly."),
    Prompt("code", (
        "Rewrite this function so the variable names are clearer. Keep everything else the same.\n\n"
        "def total_above(values, limit):\n    result = 0\n    for v in values:\n"
        "        if v > limit:\n            result = result + v\n    return result\n\n"
        "def count_above(values, limit):\n    result = 0\n    for v in values:\n"
        "        if v > limit:\n            result = result + 1\n    return result\n"
    )),
    Prompt("rewrite", (
        "Correct the spelling and grammar of this paragraph. Reply with the corrected paragraph only.\n\n"
        "Our team have finished the new version of the aplication last week. It load faster, "
        "use less memory and the settings page are now easier to find. We recieved many good "
        "feedbacks from the testers, and we thinks it is ready to ship on monday."
    )),
    Prompt("summarise", (
        "Summarise the text below in two sentences, quoting its key phrase.\n\n"
        "The city council voted on Tuesday to extend the bicycle lane network by twelve kilometres. "
        "The new lanes will connect the university campus with the central station. Council members "
        "said the project, called 'Green Link', should be finished before the end of next year."
    )),
    Prompt("maths", (
        "A shop sells pencils at 3 for 45 cents. How much do 12 pencils cost? "
        "Work it out step by step."
    )),
)
CATEGORIES: tuple[str, ...] = tuple(p.category for p in BUILTIN_PROMPTS)


def builtin_prompts(categories: list[str] | tuple[str, ...] | None = None) -> list[Prompt]:
    """The built-in prompts, all or those of the given categories (in the built-in order)."""
    if categories is None:
        return list(BUILTIN_PROMPTS)
    unknown = [c for c in categories if c not in CATEGORIES]
    if unknown:
        raise PromptFileError(f"unknown prompt category {unknown[0]!r} (built-in: {', '.join(CATEGORIES)})")
    return [p for p in BUILTIN_PROMPTS if p.category in categories]


def own_prompt(text: str, category: str = OWN) -> Prompt:
    """The user's own text as one prompt (blank lines and all)."""
    text = text.strip()
    if not text:
        raise PromptFileError("the prompt is empty")
    return Prompt(category.strip() or OWN, text)


def parse_prompts(text: str, source: str = "the prompt text") -> list[Prompt]:
    """Prompts from a file's text (JSON lines or paragraphs, see the module docstring)."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        raise PromptFileError(f"{source} holds no prompt")
    if lines[0].lstrip().startswith("{"):
        return _json_lines(text, source)
    paragraphs = [p.strip() for p in re.split(r"\n[ \t]*\n", text.replace("\r\n", "\n")) if p.strip()]
    return [Prompt(OWN, p) for p in paragraphs]


def _json_lines(text: str, source: str) -> list[Prompt]:
    prompts = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except ValueError as exc:
            raise PromptFileError(f"{source}, line {number}: not a JSON object ({exc.msg})") from exc
        prompt = item.get("prompt") if isinstance(item, dict) else None
        if not isinstance(prompt, str) or not prompt.strip():
            raise PromptFileError(f'{source}, line {number}: needs a non-empty "prompt" string')
        category = item.get("category", OWN)
        if not isinstance(category, str) or not category.strip():
            raise PromptFileError(f'{source}, line {number}: "category" must be a non-empty string')
        prompts.append(Prompt(category.strip(), prompt.strip()))
    return prompts


def read_prompt_file(path: str | Path) -> list[Prompt]:
    path = Path(path).expanduser()
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise PromptFileError(f"{path}: no such prompt file") from exc
    except UnicodeDecodeError as exc:
        raise PromptFileError(f"{path}: not a UTF-8 text file") from exc
    except OSError as exc:
        raise PromptFileError(f"{path}: cannot be read ({exc.strerror})") from exc
    return parse_prompts(text, path.name)


def prompts_from_arg(value: str) -> list[Prompt]:
    """The command line's --prompts: "builtin", built-in categories ("code,chat"), or a file."""
    value = value.strip()
    if value in ("", "builtin"):
        return builtin_prompts()
    path = Path(value).expanduser()
    if path.exists() or not all(c.strip() in CATEGORIES for c in value.split(",")):
        if not path.exists():
            raise PromptFileError(
                f"{value}: no such prompt file, nor built-in categories ({', '.join(CATEGORIES)})"
            )
        return read_prompt_file(path)
    return builtin_prompts([c.strip() for c in value.split(",")])
