"""Request bodies -> checked, typed requests. Plain Python: a wrong type or value is a 400 naming
the field, never a traceback; unknown fields are ignored (clients send many we do not use), but
known fields that would change the reply and that we cannot honour are a 400 (_refuse_unsupported).

Sampling fields the client leaves out take the server's defaults, which are its command-line flags
(`--temp 0.8`, `--top-k 40`, ...), as llama-server does: OpenAI's own default temperature is 1, but
a llama.cpp user expects the server's flags to decide.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from typing import Any

from app.engine.loop.speculative import DecodeSettings
from app.engine.settings import GenSettings
from app.server.errors import ApiError, bad_field
from app.engine.errors import first_line

CHAT_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
MAX_STOP_STRINGS = 16
MAX_STOP_LENGTH = 256  # the stop matcher's hold-back check is quadratic in a stop string's length
MAX_SEED = 2**63 - 1


@dataclass(frozen=True)
class GenerationRequest:
    """What a chat or text completion asks for; exactly one of `messages` and `prompt` is set."""

    model: str | None
    max_tokens: int | None  # None: up to the server's default / the end of the context
    stream: bool
    include_usage: bool  # stream_options.include_usage: an extra chunk with the usage
    stop: tuple[str, ...]
    # Only the fields the client set, by app.engine.settings.GenSettings' names (seed < 0: random).
    sampling: dict[str, Any] = field(default_factory=dict)
    messages: tuple[dict[str, str], ...] | None = None
    prompt: str | tuple[int, ...] | None = None

    def decode_settings(self, defaults: GenSettings, max_tokens: int,
                        format_stops: tuple[str, ...] = ()) -> DecodeSettings:
        """What to generate with: the client's fields over the server's defaults (its flags, or
        the window's settings), through the engine's one check (the fields were range-checked
        here already, so it refuses nothing a client sent)."""
        wanted = dataclasses.replace(defaults, max_tokens=max_tokens, **self.sampling)
        return wanted.decode_settings(stop_strings=tuple(self.stop) + tuple(format_stops))


def parse_json(body: bytes) -> dict[str, Any]:
    """The body as a JSON object, or a 400 saying why not."""
    try:
        data = json.loads(body, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ApiError(400, f"the request body is not valid JSON: {first_line(exc, 200) or type(exc).__name__}", "invalid_json") from None
    if not isinstance(data, dict):
        raise ApiError(400, "the request body must be a JSON object", "invalid_json")
    _refuse_lone_surrogates(data)
    return data


def _refuse_lone_surrogates(data: Any) -> None:
    """JSON's \\ud800 escapes can spell half a UTF-16 pair, which is no Unicode text: the tokenizer
    and the UTF-8 encoder of our replies would fail on it (a 500). Checked once, for every string."""
    pending = [data]
    while pending:
        value = pending.pop()
        if isinstance(value, dict):
            pending.extend(value.keys())
            pending.extend(value.values())
        elif isinstance(value, list):
            pending.extend(value)
        elif isinstance(value, str) and not _is_text(value):
            raise ApiError(400, "the request contains a lone UTF-16 surrogate (an unpaired \\ud800-\\udfff "
                           "escape), which is not valid Unicode text", "invalid_value")


def _is_text(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")




def parse_chat(data: dict[str, Any]) -> GenerationRequest:
    _refuse_unsupported(data, chat=True)
    messages = data.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_field("messages", "'messages' must be a non-empty list of messages")
    return _common(data, messages=tuple(_message(m, i) for i, m in enumerate(messages)))


def parse_completion(data: dict[str, Any]) -> GenerationRequest:
    _refuse_unsupported(data, chat=False)
    return _common(data, prompt=_prompt(data.get("prompt")))


def _common(data: dict[str, Any], **kind: Any) -> GenerationRequest:
    model = data.get("model")
    if model is not None and not isinstance(model, str):
        raise bad_field("model", "'model' must be a string")
    n = _integer(data, "n", 1, None)
    if n is not None and n != 1:
        raise bad_field("n", "only n=1 is supported (one choice per request)")
    # max_completion_tokens is OpenAI's current name; max_tokens the older one llama.cpp users send.
    max_tokens = _integer(data, "max_completion_tokens", 1, None)
    if max_tokens is None:
        max_tokens = _integer(data, "max_tokens", 1, None)
    stream = _boolean(data, "stream") or False
    options = data.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise bad_field("stream_options", "'stream_options' must be an object")
    include_usage = bool(_boolean(options or {}, "include_usage", "stream_options.include_usage"))
    return GenerationRequest(
        model=model, max_tokens=max_tokens, stream=stream, include_usage=include_usage,
        stop=_stop(data.get("stop")), sampling=_sampling(data), **kind,
    )


def _sampling(data: dict[str, Any]) -> dict[str, Any]:
    values = {
        "temperature": _number(data, "temperature", 0.0, None),
        "top_p": _number(data, "top_p", 0.0, 1.0),
        "top_k": _integer(data, "top_k", 0, None),  # llama.cpp extra
        "min_p": _number(data, "min_p", 0.0, 1.0),  # llama.cpp extra
    }
    chosen = {name: value for name, value in values.items() if value is not None}
    seed = _integer(data, "seed", None, MAX_SEED)
    if seed is not None:
        chosen["seed"] = seed  # negative: random, as llama.cpp's -1
    return chosen


def _refuse_unsupported(data: dict[str, Any], chat: bool) -> None:
    """Fields that change what the client gets back: better a clear 400 than silently ignoring them.
    Their neutral values (0, null, empty, "none"/"auto") are accepted: many clients always send them."""
    if data.get("tools"):
        raise bad_field("tools", "tools / function calling are not supported by this server")
    if data.get("functions") or data.get("function_call") not in (None, "none", "auto"):
        raise bad_field("functions", "functions / function_call are not supported by this server")
    if data.get("tool_choice") not in (None, "none", "auto"):
        raise bad_field("tool_choice", "tool_choice other than 'none' or 'auto' is not supported (no tools)")
    if data.get("logit_bias") not in (None, {}):
        raise bad_field("logit_bias", "logit_bias is not supported by this server")
    for name in ("presence_penalty", "frequency_penalty"):
        value = _number(data, name, -2.0, 2.0)
        if value:
            raise bad_field(name, f"{name} is not supported by this server (only 0)")
    if data.get("top_logprobs") not in (None, 0):
        raise bad_field("top_logprobs", "top_logprobs are not supported by this server")
    response_format = data.get("response_format")
    if response_format is not None and not (isinstance(response_format, dict) and response_format.get("type") in (None, "text")):
        raise bad_field("response_format", "only response_format {'type': 'text'} is supported")
    if data.get("logprobs"):
        raise bad_field("logprobs", "logprobs are not supported by this server")
    if not chat and data.get("echo"):
        raise bad_field("echo", "echo is not supported by this server")
    if not chat and data.get("suffix"):
        raise bad_field("suffix", "suffix (fill-in-the-middle) is not supported by this server")
    best_of = data.get("best_of")
    if not chat and best_of not in (None, 1):
        raise bad_field("best_of", "only best_of=1 is supported")
    _refuse_llama_extras(data)


# llama-server's own sampling and output fields -> the value at which each changes nothing. A client
# written for llama-server that sends another value expects its effect (a grammar, a penalty,
# probabilities): a 400, as for logit_bias, rather than a reply that silently lacks it.
_LLAMA_NEUTRAL_NUMBERS = {"repeat_penalty": 1.0, "typical_p": 1.0, "mirostat": 0, "n_probs": 0,
                          "dry_multiplier": 0.0, "xtc_probability": 0.0, "dynatemp_range": 0.0}


def _refuse_llama_extras(data: dict[str, Any]) -> None:
    for name in ("grammar", "json_schema"):
        if data.get(name) not in (None, ""):
            raise bad_field(name, f"{name} (constrained output) is not supported by this server")
    for name, neutral in _LLAMA_NEUTRAL_NUMBERS.items():
        value = _number(data, name, None, None)
        if value is not None and value != neutral:
            raise bad_field(name, f"{name} is not supported by this server (only {neutral})")
    if data.get("ignore_eos"):
        raise bad_field("ignore_eos", "ignore_eos is not supported by this server")


def _message(message: Any, index: int) -> dict[str, str]:
    where = f"messages[{index}]"
    if not isinstance(message, dict):
        raise bad_field(where, f"{where} must be an object with 'role' and 'content'")
    role = message.get("role")
    if not isinstance(role, str) or role not in CHAT_ROLES:  # a list is unhashable: no `in` on it
        allowed = ", ".join(CHAT_ROLES)
        raise bad_field(f"{where}.role", f"{where}.role must be one of {allowed} (got {str(role)[:40]!r})")
    return {"role": CHAT_ROLES[role], "content": _content(message.get("content"), f"{where}.content")}


def _content(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                raise bad_field(where, f"{where}: only text parts ({{'type': 'text', 'text': ...}}) are supported")
            texts.append(part["text"])
        return "".join(texts)
    raise bad_field(where, f"{where} must be a string or a list of text parts")


def _prompt(prompt: Any) -> str | tuple[int, ...]:
    """A string, a list holding one string, or token ids (a list of ints, or a list holding one)."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        if not prompt:
            raise bad_field("prompt", "the prompt is empty")
        return prompt
    if isinstance(prompt, list) and prompt and all(_is_int(t) for t in prompt):
        return tuple(prompt)
    raise bad_field("prompt", "'prompt' must be a non-empty string or a list of token ids (one prompt per request)")


def _stop(stop: Any) -> tuple[str, ...]:
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise bad_field("stop", "'stop' must be a string or a list of strings")
    if len(stops) > MAX_STOP_STRINGS or any(len(s) > MAX_STOP_LENGTH for s in stops):
        raise bad_field("stop", f"at most {MAX_STOP_STRINGS} stop strings of at most {MAX_STOP_LENGTH} characters")
    return tuple(s for s in stops if s)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _integer(data: dict[str, Any], name: str, low: int | None, high: int | None) -> int | None:
    value = data.get(name)
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # 16.0 from a JavaScript client
    if not _is_int(value):
        raise bad_field(name, f"'{name}' must be an integer")
    _check_range(name, value, low, high)
    return value


def _number(data: dict[str, Any], name: str, low: float | None, high: float | None) -> float | None:
    value = data.get(name)
    if value is None:
        return None
    try:  # float(): an integer beyond float's range (10**400) is refused here, not in math.isfinite
        number = float(value) if _is_int(value) or isinstance(value, float) else math.nan
    except OverflowError:
        number = math.nan
    if not math.isfinite(number):
        raise bad_field(name, f"'{name}' must be a number")
    _check_range(name, number, low, high)
    return number


def _check_range(name: str, value: float, low: float | None, high: float | None) -> None:
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = f"between {low} and {high}" if low is not None and high is not None else (
            f"at least {low}" if low is not None else f"at most {high}")
        raise bad_field(name, f"'{name}' must be {bounds} (got {value})")


def _boolean(data: dict[str, Any], name: str, label: str | None = None) -> bool | None:
    value = data.get(name)
    if value is not None and not isinstance(value, bool):
        raise bad_field(label or name, f"'{label or name}' must be true or false")
    return value
