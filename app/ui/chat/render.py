"""Markdown replies with accepted draft text marked, in a QTextDocument.

Marks are spans of the *source* text ([start, end) character ranges from the history), but what
the user sees is rendered Markdown: `**bold**` shows as "bold", fences disappear, `&amp;` becomes
"&". Rather than inject markers into the Markdown (which can split a `**` or a code fence in two
and break the rendering), the reply is rendered untouched and each rendered character is then
matched back to the source character it shows: rendered text is, apart from list bullets and
frame/table boundaries, a subsequence of the source. Marking is a character-format merge over the
matched ranges, so the Markdown rendering itself is never affected by the marks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

from PySide6.QtGui import QColor, QPalette, QTextBlockFormat, QTextCharFormat, QTextCursor, QTextDocument
# GitHub's dialect, but HTML in a reply is shown as text: `#include <stdio.h>` must not vanish
# as an unknown tag.
MARKDOWN = QTextDocument.MarkdownFeature(QTextDocument.MarkdownFeature.MarkdownDialectGitHub.value
                                         | QTextDocument.MarkdownFeature.MarkdownNoHTML.value)
_WHITESPACE = {" ", "\n", "\t", "\u2029", "\u2028", "\u00a0", "\r"}
_NO_SOURCE = {"\ufdd0", "\ufdd1", "\ufffc"}  # frame / table cell boundaries, object replacement
_LOOKAHEAD = 64  # how far ahead a rendered character is looked for among the source's


@dataclass(frozen=True)
class Theme:
    """The conversation's colours, for a light or a dark palette."""

    draft: QColor  # background of accepted draft text: green, as LM Studio marks it
    code: QColor  # background of code
    user_bubble: QColor
    reply_bubble: QColor
    border: QColor
    muted: str  # secondary text (headers' links, stats lines)
    user_title: str
    assistant_title: str


def theme_for(palette: QPalette) -> Theme:
    base = palette.color(QPalette.ColorRole.Base)
    text = palette.color(QPalette.ColorRole.Text)
    if base.lightness() >= 128:
        return Theme(QColor("#c9efc4"), _mix(base, text, 0.05), QColor("#eef4ff"), base,
                     _mix(base, text, 0.16), "#6b7280", "#1d4ed8", "#047857")
    return Theme(QColor("#23592f"), _mix(base, text, 0.08), _mix(base, QColor("#3b82f6"), 0.16), base,
                 _mix(base, text, 0.22), "#9ca3af", "#93c5fd", "#6ee7b7")


def _mix(a: QColor, b: QColor, t: float) -> QColor:
    return QColor(round(a.red() + (b.red() - a.red()) * t), round(a.green() + (b.green() - a.green()) * t),
                  round(a.blue() + (b.blue() - a.blue()) * t))


def _norm(ch: str) -> str:
    return " " if ch in _WHITESPACE else ch


def align(source: str, rendered: str) -> list[int | None]:
    """For each rendered character, the index of the source character it shows (None if none).

    Greedy and monotonic: a rendered character matches the next equal source character within a
    short window; one that has no match (a bullet, an entity's expansion) maps to None and does
    not move the source cursor.
    """
    out: list[int | None] = []
    j, n = 0, len(source)
    for ch in rendered:
        if ch in _NO_SOURCE:
            out.append(None)
            continue
        target = _norm(ch)
        limit = min(n, j + _LOOKAHEAD)
        k = j
        while k < limit and _norm(source[k]) != target:
            k += 1
        if k < limit:
            out.append(k)
            j = k + 1
        else:
            out.append(None)
    return out


def marked_flags(length: int, spans: Iterable[Sequence[int]]) -> bytearray:
    flags = bytearray(length)
    for start, end in spans:
        start, end = max(0, int(start)), min(length, int(end))
        if end > start:
            flags[start:end] = b"\x01" * (end - start)
    return flags


def rendered_runs(source: str, rendered: str, spans: Iterable[Sequence[int]]) -> list[tuple[int, int]]:
    """[start, end) ranges of the rendered text that show marked source text. Whitespace between
    two marked characters is marked too, so a marked run reads as one highlight."""
    flags = marked_flags(len(source), spans)
    mapping = align(source, rendered)
    runs: list[tuple[int, int]] = []
    start = None
    for i, src in enumerate(mapping):
        on = src is not None and flags[src] == 1
        if on and start is None:
            start = i
        elif not on and start is not None:
            runs.append((start, i))
            start = None
    if start is not None:
        runs.append((start, len(mapping)))
    return runs


def insert_reply(cursor: QTextCursor, source: str, spans: Iterable[Sequence[int]], mark: bool, theme: Theme) -> None:
    """Insert `source` rendered as Markdown at the cursor (which must be at an empty block), with
    code shaded and, when `mark`, the draft spans highlighted."""
    doc = cursor.document()
    start = cursor.position()
    if source:
        cursor.insertMarkdown(source, MARKDOWN)
    end = cursor.position()
    _shade_code(doc, start, end, theme.code)
    if mark and source:
        rendered = doc.toRawText()[start:end]
        fmt = QTextCharFormat()
        fmt.setBackground(theme.draft)
        marker = QTextCursor(doc)
        for run_start, run_end in rendered_runs(source, rendered, spans):
            marker.setPosition(start + run_start)
            marker.setPosition(start + run_end, QTextCursor.MoveMode.KeepAnchor)
            marker.mergeCharFormat(fmt)
    cursor.setPosition(end)


def _shade_code(doc, start: int, end: int, background: QColor) -> None:
    """Markdown code blocks come out as non-breaking blocks and inline code as fixed-pitch
    text, but with the default family: give code a monospace font, and blocks a background.
    Code lines wrap at the view's edge: a long line otherwise widened the whole conversation and
    hid its end behind a horizontal scroll bar that few noticed (issue 60 item 12)."""
    block = doc.findBlock(start)
    while block.isValid() and block.position() <= end:
        if block.blockFormat().nonBreakableLines():
            cursor = QTextCursor(block)
            fmt = QTextBlockFormat()
            fmt.setBackground(background)
            fmt.setNonBreakableLines(False)
            cursor.mergeBlockFormat(fmt)
            cursor.movePosition(QTextCursor.MoveOperation.EndOfBlock, QTextCursor.MoveMode.KeepAnchor)
            cursor.mergeCharFormat(_mono_format())
        else:
            _monospace_inline_code(doc, block, background)
        block = block.next()


def _monospace_inline_code(doc, block, background: QColor) -> None:
    # block.textFormats(), not the fragment iterator: PySide6 6.12 crashes iterating fragments.
    for span in block.textFormats():
        if span.format.fontFixedPitch():
            cursor = QTextCursor(doc)
            cursor.setPosition(block.position() + span.start)
            cursor.setPosition(block.position() + span.start + span.length, QTextCursor.MoveMode.KeepAnchor)
            fmt = _mono_format()
            fmt.setBackground(background)
            cursor.mergeCharFormat(fmt)


def _mono_format() -> QTextCharFormat:
    char = QTextCharFormat()
    char.setFontFamilies(["monospace"])
    char.setFontFixedPitch(True)
    return char
