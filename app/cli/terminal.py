"""What reaches a terminal from text that is not ours: a model's reply from a server someone else
runs, a server's message, a model's name."""

from __future__ import annotations

# C0 controls but newline and tab, DEL and C1: what a terminal acts on (ESC starts a sequence; OSC 52
# writes the clipboard, a carriage return writes over the line, CSI in C1 as 0x9b).
_CONTROLS = [c for c in (*range(0x20), 0x7F, *range(0x80, 0xA0)) if chr(c) not in "\n\t"]
_SURROGATES = range(0xD800, 0xE000)  # JSON's "\ud800" alone: no encoding writes it (print would raise)
_TERMINAL_SAFE = {**{c: f"\\x{c:02x}" for c in _CONTROLS}, **{c: f"\\u{c:04x}" for c in _SURROGATES}}
_JSON_SAFE = {c: f"\\u{c:04x}" for c in (0x7F, *range(0x80, 0xA0), *_SURROGATES)}  # json.dumps escapes C0 itself


def terminal_text(text: str) -> str:
    """A model's or a server's text as it may reach a terminal: control characters escaped as
    \\xNN (lone surrogates as \\uNNNN), newline and tab kept. A reply, a model's name or a
    server's message is not ours to let drive the terminal."""
    return text.translate(_TERMINAL_SAFE)


def terminal_json(line: str) -> str:
    """A line of JSON (ensure_ascii off) with DEL, C1 controls and lone surrogates as \\u
    escapes: the same JSON, nothing a terminal acts on or an encoding refuses."""
    return line.translate(_JSON_SAFE)
