"""A sandbox for chat templates with bounds on what their code may build and how long it may run.

A template comes from the model file, and transformers renders it in jinja2's sandbox, which
caps range() at 100,000 items and nothing else: `{{ 'ab' * 10**9 }}` built a 2 GB string, `~`
doubled its way to 3.4 GB, `center(2*10**9)` and `'%02000000000d'|format` to 2 GB each, and loops
of loops or squared integers ran for minutes, holding the server's only generation slot. Here
every operator that can grow a value, every call and filter, every `~` and every printed value
is checked before it runs (app.engine.loop.template_bounds), the rendered text is counted as it
is made, and the render stops after MAX_RENDER_S. A refusal is a SecurityError, which
app.engine.loop.chat turns into one line naming the template.
"""

from __future__ import annotations

from typing import Any, Callable

from jinja2.compiler import CodeGenerator, optimizeconst
from jinja2.environment import Template
from jinja2.runtime import Context, EvalContext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from app.engine.loop import template_bounds as bounds

_SIZED = (str, list, tuple)


def _checked_binop(operator: str, left: Any, right: Any) -> None:
    """Refuse an operation whose result would be past the bounds, before it is computed."""
    if operator == "*":
        sized, count = (left, right) if isinstance(left, _SIZED) else (right, left)
        if isinstance(sized, _SIZED) and isinstance(count, int):
            if bounds.text_size(sized) * max(count, 0) > bounds.MAX_TEXT:
                raise bounds.refuse(f"builds a value of over {bounds.MAX_TEXT:,} characters")
        elif isinstance(left, int) and isinstance(right, int):
            if left.bit_length() + right.bit_length() > bounds.MAX_NUMBER_BITS:
                raise bounds.refuse(f"uses a number of over {bounds.MAX_NUMBER_BITS:,} bits")
    elif operator == "**":
        if isinstance(left, int) and isinstance(right, int) and abs(left) > 1 and right > 0:
            if left.bit_length() * right > bounds.MAX_NUMBER_BITS:
                raise bounds.refuse(f"uses a number of over {bounds.MAX_NUMBER_BITS:,} bits")
    elif operator == "+" and isinstance(left, _SIZED) and isinstance(right, _SIZED):
        if bounds.text_size(left) + bounds.text_size(right) > bounds.MAX_TEXT:
            raise bounds.refuse(f"builds a value of over {bounds.MAX_TEXT:,} characters")
    elif operator == "%" and isinstance(left, str):
        bounds.check_format(left)
        bounds.check_arguments(right if isinstance(right, tuple) else (right,), {}, "a format")


def _data(args: tuple) -> tuple:
    """A filter's arguments without the context jinja2 passes some filters first."""
    return args[1:] if args and isinstance(args[0], (Context, EvalContext, ImmutableSandboxedEnvironment)) else args


def _check_filter(name: str, args: tuple, kwargs: dict) -> None:
    """The filters whose output grows with an argument's value, not only with its size."""
    args = _data(args)
    if name == "format" and args:
        bounds.check_format(args[0])
    elif name == "replace" and len(args) >= 3:
        bounds.check_replace(str(args[0]), args[1], args[2])
    elif name == "join" and args:
        bounds.check_join(args[1] if len(args) > 1 else kwargs.get("d", ""), args[0])
    elif name in ("indent", "wordwrap") and args:
        lines = str(args[0]).count("\n") + 1 + (len(str(args[0])) if name == "wordwrap" else 0)
        widest = max((len(v) for v in (*args[1:], *kwargs.values()) if isinstance(v, str)), default=0)
        if lines * (widest + 1) > bounds.MAX_TEXT:
            raise bounds.refuse(f"{name}s its way past {bounds.MAX_TEXT:,} characters")
    elif name == "tojson":
        indent = kwargs.get("indent", args[1] if len(args) > 1 else None)
        if isinstance(indent, (int, str)) and not isinstance(indent, bool) and \
                (indent if isinstance(indent, int) else len(indent)) > 64:
            raise bounds.refuse("indents JSON by over 64")


def _bounded_filter(name: str, func: Callable) -> Callable:
    def bounded(*args: Any, **kwargs: Any) -> Any:
        bounds.check_arguments(_data(args), kwargs, f"the filter {name}")
        _check_filter(name, args, kwargs)
        return bounds.check_number(bounds.check_text(func(*args, **kwargs), f"filters into a value"))

    # jinja2 reads how to call a filter (pass_context, pass_eval_context) from the function.
    bounded.__dict__.update(getattr(func, "__dict__", {}))
    return bounded


class _BoundedFilters(dict):
    """The environment's filters, each handed out inside its bounds: at render time
    (`environment.filters[name]` in compiled code) and at compile time (`.get`, which jinja2 uses
    to fold constant expressions: a constant bomb is refused there and left to fail at render)."""

    def __getitem__(self, name: str) -> Callable:
        return _bounded_filter(name, dict.__getitem__(self, name))

    def get(self, name: str, default: Any = None) -> Any:
        return self[name] if name in self else default


class _BoundedCodeGenerator(CodeGenerator):
    @optimizeconst
    def visit_Concat(self, node, frame) -> None:
        """As jinja2's, with the parts of `a ~ b ~ c` sized before they are joined."""
        if frame.eval_ctx.volatile:
            join = "(markup_join if context.eval_ctx.volatile else str_join)"
        elif frame.eval_ctx.autoescape:
            join = "markup_join"
        else:
            join = "str_join"
        self.write(f"{join}(environment.checked_text((")
        for part in node.nodes:
            self.visit(part, frame)
            self.write(", ")
        self.write(")))")


class _BoundedTemplate(Template):
    def render(self, *args: Any, **kwargs: Any) -> str:
        """As jinja2's, with the rendered text counted as it is made, and a clock."""
        context = self.new_context(dict(*args, **kwargs))
        pieces: list[str] = []
        size = 0
        try:
            with bounds.time_bound():
                for piece in self.root_render_func(context):
                    size += len(piece)
                    if size > bounds.MAX_TEXT:
                        raise bounds.refuse(f"renders a prompt of over {bounds.MAX_TEXT:,} characters")
                    pieces.append(piece)
        except Exception:
            self.environment.handle_exception()
        return "".join(pieces)


class BoundedSandbox(ImmutableSandboxedEnvironment):
    intercepted_binops = frozenset({"*", "**", "+", "%"})
    code_generator_class = _BoundedCodeGenerator
    template_class = _BoundedTemplate

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.filters = _BoundedFilters(self.filters)
        self.finalize = lambda value: bounds.check_text(value, "prints a value")

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        _checked_binop(operator, left, right)
        return bounds.check_number(super().call_binop(context, operator, left, right))

    def call(__self, __context: Context, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805 - jinja2's
        name = getattr(__obj, "__name__", "a function")
        bounds.check_arguments(args, kwargs, name)
        owner = getattr(__obj, "__self__", None)
        if isinstance(owner, str):
            if name == "replace" and len(args) >= 2:
                bounds.check_replace(owner, args[0], args[1])
            elif name == "join" and args:
                bounds.check_join(owner, args[0])
        result = super().call(__context, __obj, *args, **kwargs)
        return bounds.check_number(bounds.check_text(result, f"gets from {name} a value"))

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        """jinja2 hands out `'...'.format` wrapped in its sandbox when the template reads it:
        the format string is checked then, and its arguments where they are used."""
        sandboxed = super().wrap_str_format(value)
        if sandboxed is None:
            return None
        bounds.check_format(value.__self__)

        def bounded(*args: Any, **kwargs: Any) -> str:
            for argument in (*args, *kwargs.values()):
                bounds.check_format(argument if isinstance(argument, str) and argument.isdigit() else None)
            return sandboxed(*args, **kwargs)

        return bounded

    @staticmethod
    def checked_text(parts: tuple) -> tuple:
        bounds.check_text(parts, "joins a text")
        return parts


def install() -> None:
    """Make transformers compile chat templates in the bounded sandbox (both backends render
    through it: transformers' tokenizers and app.engine.backends.llamacpp.tokenizer)."""
    from transformers.utils import chat_template_utils as templates

    if templates.ImmutableSandboxedEnvironment is not BoundedSandbox:
        templates.ImmutableSandboxedEnvironment = BoundedSandbox
        templates._compile_jinja_template.cache_clear()


# A chat as a template sees it: a system turn, a user turn, the assistant's turn to come.
_SAMPLE_CHAT = [{"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": "Hello"}]


def unbounded_reason(template: str) -> str | None:
    """Why the template passes the bounds on a sample chat ("the template ran for over 2 s"), or
    None. For a program that renders templates without our bounds (llama-server's own engine
    ran a bomb for 75 s and 2.3 GB before its start timed out): ask this first. A template that
    fails here for another reason (a syntax only llama.cpp's engine reads, a raise_exception on
    this chat) is that program's to judge: None."""
    from jinja2.exceptions import SecurityError

    def raise_exception(message: str) -> None:
        raise ValueError(message)

    environment = BoundedSandbox(trim_blocks=True, lstrip_blocks=True)
    try:
        environment.from_string(template).render(
            messages=_SAMPLE_CHAT, add_generation_prompt=True, bos_token="", eos_token="",
            raise_exception=raise_exception)
    except SecurityError as exc:
        return (str(exc).splitlines() or [""])[0][:200]
    except Exception:  # noqa: BLE001 - not ours to judge: see above
        return None
    return None
