"""Conversations -> prompt tokens with the model's own chat template, and multi-turn sessions.

The main model's KV cache is kept between turns; generate() syncs it to each new prompt by
longest common prefix, so only the new turn is evaluated. When a conversation outgrows the
context, the oldest turns (never the system prompt) are left out of the prompt.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Iterator

from app.engine.drafters import Drafter
from app.engine.errors import ContextFullError
from app.engine.events import DoneEvent, GenerationEvent
from app.engine.kvmodel import KVModel
from app.engine.speculative import CancelCheck, DecodeSettings, generate

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


def has_chat_template(tokenizer) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def render_prompt(tokenizer, messages: list[dict[str, str]]) -> list[int]:
    """Token ids of the conversation followed by the assistant's turn prefix."""
    template = None if has_chat_template(tokenizer) else FALLBACK_TEMPLATE
    text = tokenizer.apply_chat_template(
        messages, chat_template=template, add_generation_prompt=True, tokenize=False
    )
    # The template writes BOS itself when the model wants it; don't add a second one.
    return tokenizer.encode(text, add_special_tokens=not _starts_with_bos(tokenizer, text))


def _starts_with_bos(tokenizer, text: str) -> bool:
    bos = getattr(tokenizer, "bos_token", None)
    return bool(bos) and text.startswith(bos)


@dataclass
class ChatSession:
    """A conversation with one main model; reply() streams the assistant's answer."""

    main: KVModel
    tokenizer: object
    system_prompt: str | None = None
    messages: list[dict[str, str]] = field(default_factory=list)
    min_reply_tokens: int = 64  # room kept free for the answer when trimming old turns

    def prompt_ids(self) -> list[int]:
        """The prompt for the next reply, leaving out the oldest turns if it would not fit."""
        turns = list(self.messages)
        head = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        while True:
            ids = render_prompt(self.tokenizer, head + turns)
            if len(ids) + self.min_reply_tokens <= self.main.n_ctx:
                if len(turns) < len(self.messages):
                    log.info("context full: left out %d old messages", len(self.messages) - len(turns))
                return ids
            if len(turns) <= 1:
                raise ContextFullError(
                    f"the prompt needs {len(ids)} tokens plus {self.min_reply_tokens} for the reply, "
                    f"but the context holds {self.main.n_ctx}; shorten it or raise -c"
                )
            turns = turns[2:] if len(turns) > 2 else turns[1:]

    def reply(
        self,
        user_text: str,
        drafter: Drafter | None = None,
        settings: DecodeSettings = DecodeSettings(),
        cancel: CancelCheck | None = None,
    ) -> Iterator[GenerationEvent]:
        """Add the user's message, stream the reply, and keep it (also a partial one)."""
        self.messages.append({"role": "user", "content": user_text})
        stops = settings.stop_strings
        if not has_chat_template(self.tokenizer):
            stops = tuple(stops) + FALLBACK_STOPS
        settings = DecodeSettings(**{**settings.__dict__, "stop_strings": tuple(stops)})
        try:
            prompt = self.prompt_ids()
        except ContextFullError:
            self.messages.pop()  # keep the session usable: the message was never answered
            raise
        for event in generate(self.main, self.tokenizer, prompt, drafter, settings, cancel):
            if isinstance(event, DoneEvent):
                self.messages.append({"role": "assistant", "content": event.summary.text})
            yield event
