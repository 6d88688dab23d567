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


class LoadCancelled(SpeculaError):
    """Loading was cancelled by the user."""


class ChatTemplateError(SpeculaError):
    """The model's chat template failed on the messages (it raised, did not parse, tripped the
    sandbox or asked too much of it): the file's fault, said in one line."""


class ServerError(SpeculaError):
    """A server that could not be reached, refused a request or answered what it should not
    (llama-server's own API or a server speaking OpenAI's)."""
