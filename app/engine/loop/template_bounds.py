"""The limits a chat template's code renders under: how big any value it builds may be, how big a
number, how long a format's width, and how long the whole render may take.

A template comes from the model file. A chat prompt is a few KB, rendered once per request in
a few milliseconds, so the limits below are generous for every real template and refuse bombs
before they allocate: a value's size is estimated as the text it would print as (a list of one
string repeated a million times prints as a million copies), before the operation that would
build or print it runs. Every refusal is a SecurityError, which app.engine.loop.chat turns into
one line.
"""

from __future__ import annotations

import re
import sys
import time
from contextlib import contextmanager
from typing import Any, Iterator

from jinja2.exceptions import SecurityError
from jinja2.utils import Namespace

MAX_TEXT = 4 << 20  # characters any value may print as, and the rendered prompt as a whole
MAX_NUMBER_BITS = 1 << 12  # a 1,233-digit integer: far past any count or date a template needs
MAX_RENDER_S = 2.0  # a real template renders in milliseconds; this is for a busy machine
TEMPLATE_FILENAME = "<template>"  # the file name jinja2 gives code compiled from a string

# A width or precision in a format string ('%09d', '{:>9}') of more digits than MAX_TEXT has.
_WIDE_FORMAT = re.compile(r"\d{%d,}" % (len(str(MAX_TEXT)) + 1))


def refuse(what: str) -> SecurityError:
    return SecurityError(f"the template {what}")


def text_size(value: Any, budget: int = MAX_TEXT) -> int:
    """About how many characters `value` prints as, counting nested containers by what they hold
    (shared items once per use); counting stops once past `budget`."""
    total, stack = 0, [value]
    while stack and total <= budget:
        item = stack.pop()
        if isinstance(item, str):
            total += len(item)
        elif isinstance(item, bool) or item is None:
            total += 5
        elif isinstance(item, int):
            total += item.bit_length() // 3 + 1
        elif isinstance(item, (list, tuple, set, frozenset)):
            total += 2 + 2 * len(item)
            stack.extend(item)
        elif isinstance(item, dict):
            total += 2 + 4 * len(item)
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, Namespace):
            stack.append(dict(getattr(item, "_Namespace__attrs", {})))
        else:
            total += 16
    return total


def check_text(value: Any, what: str = "builds a value") -> Any:
    """`value`, unless it prints as more than MAX_TEXT characters."""
    if text_size(value) > MAX_TEXT:
        raise refuse(f"{what} of over {MAX_TEXT:,} characters")
    return value


def check_number(value: Any) -> Any:
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > MAX_NUMBER_BITS:
        raise refuse(f"uses a number of over {MAX_NUMBER_BITS:,} bits")
    return value


def check_arguments(args: tuple, kwargs: dict, name: str) -> None:
    """No argument of a call or filter may be a bomb already, or a count or width past MAX_TEXT
    (center, ljust, indent, wordwrap, batch: each builds that many characters or items)."""
    for value in (*args, *kwargs.values()):
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_TEXT:
            raise refuse(f"passes {name} a number over {MAX_TEXT:,}")
        check_text(value, f"passes {name} a value")


def check_format(fmt: Any) -> None:
    """A format string ('%0999999999d', '{:>999999999}') may not ask for a width past MAX_TEXT."""
    if isinstance(fmt, str) and _WIDE_FORMAT.search(fmt):
        raise refuse(f"formats with a width of over {MAX_TEXT:,} characters")


def check_replace(text: Any, old: Any, new: Any) -> None:
    if isinstance(text, str) and isinstance(old, str) and isinstance(new, str):
        count = text.count(old) if old else len(text) + 1
        if len(text) + count * max(len(new) - len(old), 0) > MAX_TEXT:
            raise refuse(f"replaces its way past {MAX_TEXT:,} characters")


def check_join(separator: Any, items: Any) -> None:
    if isinstance(items, (list, tuple)):
        size = len(str(separator)) * max(len(items) - 1, 0) + sum(text_size(item) for item in items[: MAX_TEXT])
        if size > MAX_TEXT:
            raise refuse(f"joins a text of over {MAX_TEXT:,} characters")


@contextmanager
def time_bound(seconds: float = MAX_RENDER_S) -> Iterator[None]:
    """Raise SecurityError inside the template's own code once it has run for `seconds`: a loop
    of loops builds nothing big, so only a clock stops it. The check runs at each line of the
    compiled template (and of its macros) and nowhere else; the previous tracer (a debugger,
    coverage) is put back afterwards."""
    deadline = time.monotonic() + seconds

    def in_template(frame, event, arg):
        if time.monotonic() > deadline:
            raise refuse(f"ran for over {seconds:g} s")
        return in_template

    def on_call(frame, event, arg):
        return in_template if frame.f_code.co_filename == TEMPLATE_FILENAME else None

    previous = sys.gettrace()
    sys.settrace(on_call)
    try:
        yield
    finally:
        sys.settrace(previous)
