"""The Discover panel's words: repository rows, file states, header facts, download progress.

Plain Python (no Qt, no torch): the panel only places these strings, and tests can read them.
"""

from __future__ import annotations

import html
from datetime import datetime
from typing import TYPE_CHECKING

from app.engine.drafting.compat import TOKEN_LEVEL
from app.engine.gguf.info import GGUFInfo
from app.hub.draft_verdict import FAILS, NO_GAIN, PAYS, draft_verdict
from app.hub.fields import shown
from app.hub.library_entries import count_text, fact_parts
from app.ui.common.format import format_bytes, relative_time

if TYPE_CHECKING:  # types only: the hub modules load on the worker threads (see hub_tasks)
    from app.engine.drafting.compat import DraftCheck
    from app.hub.draft_price import DraftPrice
    from app.hub.drafts import DraftSuggestion
    from app.hub.progress import DownloadProgress
    from app.hub.repos import GGUFModelFile, RepoResult
    from app.worker.hub_tasks import FileFacts, RepoFiles

GOOD, WARN, BAD = "#15803d", "#b45309", "#b91c1c"  # readable on light and dark backgrounds alike
# One colour and mark per draft verdict (app.hub.draft_verdict): works and pays, works but will
# not pay, does not work.
VERDICT_STYLE = {PAYS: (GOOD, "✓"), NO_GAIN: (WARN, "!"), FAILS: (BAD, "✗")}


def updated_text(when: datetime | None) -> str:
    return relative_time(when.timestamp()) if when is not None else ""


def repo_row(repo: RepoResult) -> list[str]:
    """Repository, downloads, likes, updated."""
    name = shown(repo.repo_id) + (" (gated)" if repo.gated else "")  # remote text, controls escaped
    return [name, count_text(repo.downloads), count_text(repo.likes), updated_text(repo.last_modified)]


def repo_tooltip(repo: RepoResult) -> str:
    lines = [shown(repo.repo_id), f"{repo.downloads:,} downloads · {repo.likes:,} likes"]
    if repo.architecture or repo.n_params:  # the hub's count sums every tensor, a tied output's copy too
        size = f"{count_text(repo.n_params)} params by the hub's count" if repo.n_params else ""
        lines.append(" · ".join(x for x in (shown(repo.architecture or ""), size) if x))
    if repo.gated:
        lines.append("gated: accept its terms on the hub and give a token to download")
    return "\n".join(lines)


def file_state(listing: RepoFiles, f: GGUFModelFile) -> str:
    """Where this file stands on this machine: 'downloaded', 'partial 1.2 MiB', ''."""
    if f.filename in listing.local:
        return "downloaded"
    if f.filename in listing.partial:
        return f"partial {format_bytes(listing.partial[f.filename])}"
    if not f.complete:
        return "parts missing"
    return ""


def file_label(f: GGUFModelFile) -> str:
    name = shown(f.filename.rsplit("/", 1)[-1])
    return f"{name} ({len(f.parts)} parts)" if f.is_split else name


def split_note(f: GGUFModelFile) -> str | None:
    """Why a split model needs care (the library cannot load split files yet)."""
    if not f.complete:
        return "the repository lacks some parts of this split model: it cannot be downloaded whole"
    if f.is_split:
        return (f"split into {len(f.parts)} files: Specula cannot load split models yet "
                f"(merge them with llama-gguf-split --merge)")
    return None


def _coloured(ok: bool, text: str) -> str:
    mark = "✓" if ok else "✗"
    return f"<span style='color:{GOOD if ok else BAD}'>{mark} {html.escape(text)}</span>"


def draft_html(compat: DraftCheck | None, draft: GGUFInfo, main: GGUFInfo | None,
               price: DraftPrice | None = None, pricing: bool = False) -> str:
    """'As a draft: ✓ ...' in the verdict's one colour (app.hub.draft_verdict), priced by this
    machine's measured steps where known (`price`); or how to get the check. `pricing`: the
    price is still being read. The main model is named by the chooser right above the facts
    ("As a draft for: [X]"), as the library names it."""
    if main is None or compat is None:
        return html.escape("Draft check: choose a main model first.")
    if pricing and compat.compatible:
        return "As a draft: <i>weighing this machine's measured step costs…</i>"
    verdict = draft_verdict(compat, draft, main, local=False, price=price)  # the draft's header came over HTTP
    colour, mark = VERDICT_STYLE[verdict.kind]
    return f"As a draft: <span style='color:{colour}'>{mark} {html.escape(verdict.text)}</span>"


# GGUF's tokenizer.ggml.model names the tokenizer's kind by the model that made it famous ("gpt2"
# for any byte-level BPE, Gemma's and Qwen's included): say the kind, not a model's name.
TOKENIZER_KINDS = {"gpt2": "byte-level BPE", "llama": "SentencePiece", "bert": "WordPiece",
                   "t5": "Unigram", "rwkv": "RWKV", "plamo2": "PLaMo-2"}


def facts_html(facts: FileFacts, size_bytes: int, main: GGUFInfo | None, here: bool = False,
               price: DraftPrice | None = None, pricing: bool = False) -> str:
    """The selected file's facts; `here`: it is downloaded already (no size "to download");
    `price`, `pricing`: as draft_html."""
    info = facts.info
    parts = fact_parts(info)
    if info.file_size:  # fact_parts ends with the file size; the whole model's is shown instead
        parts = parts[:-1] if format_bytes(info.file_size) == parts[-1] else parts
    vocab = f"vocabulary {info.vocab_size:,}"
    kind = TOKENIZER_KINDS.get(info.vocab_type or "")
    parts = [f"{vocab} ({kind} tokenizer)" if p == vocab and kind else p for p in parts]
    # The answers first (does it fit, can it draft), then the facts they rest on: on a laptop's
    # screen the first lines are the ones in sight.
    lines = [
        _coloured(facts.fit.fits, facts.fit.reason),
        *([f"<span style='color:{GOOD}'>✓ already here: the built-in {html.escape(facts.same_as)} "
           f"is this model</span>"] if facts.same_as else []),
        draft_html(facts.compat, info, main, price, pricing),
        html.escape(" · ".join(parts)),
        f"{info.n_layers} layer{'s' if info.n_layers != 1 else ''} · {format_bytes(size_bytes)}" + (", downloaded" if here else " to download"),
        f"<span style='font-size:small'>header read with {facts.requests} range "
        f"request{'s' if facts.requests != 1 else ''}: {format_bytes(facts.bytes_read)}</span>",
    ]
    return "<br>".join(lines)


def eta_text(seconds: float | None) -> str:
    if seconds is None:
        return "time left unknown"
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds} s left"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s left"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min left"


def progress_line(p: DownloadProgress) -> str:
    """'1.2 MiB of 4.0 MiB · 3.1 MiB/s · 8 s left' (and the part of a split model)."""
    amount = f"{format_bytes(p.done)} of {format_bytes(p.total)}"
    if p.phase == "checking":
        return f"checking the kept part: {amount}"
    if p.phase == "verifying":
        return f"verifying SHA-256 ({format_bytes(p.total)})"
    if p.phase == "done":
        return f"done: {format_bytes(p.total)}"
    bits = [amount]
    if p.n_parts > 1:
        bits.append(f"part {p.part} of {p.n_parts}")
    bits.append(f"{format_bytes(p.speed)}/s" if p.speed > 0 else "measuring speed…")
    if p.speed > 0:
        bits.append(eta_text(p.eta))
    if p.resumed_from:
        bits.append(f"resumed at {format_bytes(p.resumed_from)}")
    return " · ".join(bits)


def suggestion_line(s: DraftSuggestion) -> str:
    """'qwen2.5-coder-0.5b-instruct-q8_0.gguf: token by token, 32% of its size'."""
    how = "token by token" if s.level == TOKEN_LEVEL else "through text (another vocabulary)"
    return f"{shown(s.filename or s.name)}: {how}, {s.ratio:.0%} of its size"


def drafts_status(main_title: str, query: str, hub: tuple[DraftSuggestion, ...],
                  local: tuple[DraftSuggestion, ...]) -> str:
    """The status line over a draft search's results: what was searched, what is here already
    (same-vocabulary drafts by name, the text-level ones counted)."""
    same = [shown(s.name) for s in local if s.level == TOKEN_LEVEL]
    through_text = len(local) - len(same)
    here = ", ".join(same + ([f"{through_text} more through text"] if through_text else []))
    here = f"; in your library already: {here}" if here else ""
    if not hub:
        return f"No model on the hub found to draft for {main_title} (searched “{shown(query)}”){here}."
    n = len(hub)
    return (f"Drafts for {main_title}: {n} repositor{'ies' if n != 1 else 'y'} of its family (“{shown(query)}”) "
            f"whose files can draft for it, best first{here}")
