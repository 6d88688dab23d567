"""Bounds on what a chat template's code may build while it renders.

A template comes from the model file, and transformers renders it in jinja2's sandbox, which
caps range() at 100,000 items but not arithmetic: `{{ 'ab' * 10**9 }}` built a 2 GB string and a
seeded fuzz of the template path ran the process into the OOM killer at 23 GB. The sandbox
intercepts the operators named here, so each multiplication, power and concatenation is checked
before it runs; past the bound it is a SecurityError, which app.engine.loop.chat turns into one line.
"""

from __future__ import annotations

from typing import Any

from jinja2.exceptions import SecurityError
from jinja2.sandbox import ImmutableSandboxedEnvironment

# Characters (or items) one operation may build: a chat prompt is far shorter than this.
MAX_BUILT = 1 << 20
MAX_EXPONENT = 256  # larger powers of big numbers take time and memory without bound
_SIZED = (str, list, tuple)


class BoundedSandbox(ImmutableSandboxedEnvironment):
    intercepted_binops = frozenset({"*", "**", "+"})

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        if operator == "*":
            sized, count = (left, right) if isinstance(left, _SIZED) else (right, left)
            if isinstance(sized, _SIZED) and isinstance(count, int) and len(sized) * count > MAX_BUILT:
                raise SecurityError(f"the template builds a value of over {MAX_BUILT:,} items")
        elif operator == "**":
            if isinstance(right, (int, float)) and abs(right) > MAX_EXPONENT and isinstance(left, (int, float)) \
                    and abs(left) > 1:
                raise SecurityError(f"the template raises a number to a power over {MAX_EXPONENT}")
        elif operator == "+" and isinstance(left, _SIZED) and isinstance(right, _SIZED):
            if len(left) + len(right) > MAX_BUILT:
                raise SecurityError(f"the template builds a value of over {MAX_BUILT:,} items")
        return super().call_binop(context, operator, left, right)


def install() -> None:
    """Make transformers compile chat templates in the bounded sandbox (both backends render
    through it: transformers' tokenizers and app.engine.backends.llamacpp_tokenizer)."""
    from transformers.utils import chat_template_utils as templates

    if templates.ImmutableSandboxedEnvironment is not BoundedSandbox:
        templates.ImmutableSandboxedEnvironment = BoundedSandbox
        templates._compile_jinja_template.cache_clear()
