"""Errors a user may see. Each carries a one-line message that names the file and the cause."""

from __future__ import annotations

from typing import Callable

# What long work (a load, a download, a reply) asks between its steps: True once the user
# cancelled (a load then raises LoadCancelled).
Cancel = Callable[[], bool]


def first_line(exc: BaseException, limit: int = 300) -> str:
    """The first line of an error's text, at most `limit` characters; "" where it has none
    (each caller says what stands in then: the error's type, or nothing)."""
    text = str(exc).strip().splitlines()
    return text[0][:limit] if text else ""


def quoted(raw: bytes | str, limit: int = 160) -> str:
    """Up to `limit` characters of text that is not ours (a remote's, a model's) for a message:
    every character that is not printable (controls, terminal escapes, line breaks) escaped, the
    rest cut with '...'."""
    if isinstance(raw, bytes):  # decode no more than the limit needs: answers run to megabytes
        text = raw[:limit * 4].decode("utf-8", "replace")
        more = len(raw) > limit * 4
    else:
        text, more = raw[:limit + 1], len(raw) > limit
    shown = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text[:limit])
    more = more or len(text) > limit or len(shown) > limit
    return shown[:limit] + ("..." if more else "")


class SpeculaError(Exception):
    """Base of every error shown to a user as one line (never a traceback)."""


class ModelFileError(SpeculaError):
    """The file is missing, not a GGUF file, truncated or otherwise unreadable."""


class UnsupportedModelError(SpeculaError):
    """The GGUF file is valid but its architecture cannot be run."""


class InsufficientMemoryError(SpeculaError):
    """The model would not fit in the memory available for it."""


class DeviceError(SpeculaError):
    """The requested device (a GPU) is not available."""


class IncompatibleDraftError(SpeculaError):
    """The draft model cannot draft for the main model (vocabularies differ)."""


class ContextFullError(SpeculaError):
    """The prompt does not fit in the model's context window."""


class PromptError(SpeculaError):
    """A prompt the engine cannot take (empty, a token id outside the vocabulary, ids where a
    server takes text); `field`: the request's field at fault ("prompt" or "messages")."""

    def __init__(self, message: str, field: str = "prompt") -> None:
        super().__init__(message)
        self.field = field


class LoadCancelled(SpeculaError):
    """Loading was cancelled by the user."""


class ChatTemplateError(SpeculaError):
    """The model's chat template failed on the messages (it raised, did not parse, tripped the
    sandbox or asked too much of it): the file's fault, said in one line."""


class ServerError(SpeculaError):
    """A server that could not be reached, refused a request or answered what it should not
    (llama-server's own API or a server speaking OpenAI's)."""
