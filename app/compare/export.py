"""A comparison as text (the command line's table) and as CSV (one row per configuration and
category, the table's rows; the JSON file holds every prompt's figures)."""

from __future__ import annotations

import csv
import io
from pathlib import Path

from app.compare.results import CompareRun, write_text_atomic
from app.compare.summary import Row, table_rows

MiB = 1 << 20
CSV_COLUMNS = ("config", "category", "prompts", "tokens", "tokens_per_s", "speedup", "accept_rate",
               "mean_accepted", "ttft_s", "peak_rss_mib", "identical")


def header_lines(run: CompareRun) -> list[str]:
    """What every figure of the table was measured with."""
    s = run.settings
    mode = "greedy" if s.greedy else f"temperature {s.gen.temperature:g}, seed {s.gen.seed}"
    identity = ("identical = same tokens as none (a batch of drafts can round a near-tie between two "
                "tokens otherwise)" if s.greedy else "identical is not expected when sampling")
    lines = [
        f"# {run.main.name} on {run.main.plan or '?'}, {mode}, n={s.gen.max_tokens}"
        f"{' (EOS ignored)' if s.ignore_eos else ''}, {s.draft_length_text()}, "
        f"{len(run.prompts)} prompt(s), {run.created_text()}{', ' + run.machine if run.machine else ''}",
        "# tok/s = decoding speed after the first token; TTFT = time to first token (prompt pass); "
        "peak RSS = the process's resident memory sampled during each configuration (main model "
        "included; memory an earlier draft freed may still count)",
        f"# {identity}",
    ]
    if run.status != "complete":
        lines.append(f"# run {run.status}: {len(run.results)} of {run.n_expected} results")
    return lines


def format_table(run: CompareRun) -> str:
    rows = table_rows(run)
    header = (f"{'category':<10} {'config':<24} {'tokens':>6} {'tok/s':>8} {'speedup':>8} {'accept':>8} "
              f"{'acc/step':>8} {'TTFT':>8} {'peak RSS':>9}  {'identical':<9}  why")
    lines = [*header_lines(run), header, "-" * len(header)]
    previous = None
    for row in rows:
        if previous is not None and row.category != previous:
            lines.append("")
        previous = row.category
        lines.append(_text_row(row))
    for row in rows:
        if row.nothing_drafted is not None and row.category == rows[-1].category:  # once, on the overall rows
            lines.append(f"# {row.config}: {row.nothing_drafted}")
    for error in run.errors:
        lines.append(f"# {error.config}: not run ({error.message})")
    return "\n".join(lines)


def _text_row(r: Row) -> str:
    speedup = f"{r.speedup:7.2f}x" if r.speedup is not None else f"{'-':>8}"
    if r.nothing_drafted is not None or r.accept_rate is None:
        accept = f"{r.accept_text:>8}"  # "declined", "none drafted", "-"
    else:
        accept = f"{100 * r.accept_rate:7.1f}%"
    mean = f"{r.mean_accepted:8.2f}" if r.mean_accepted is not None else f"{'-':>8}"
    rss = f"{r.peak_rss_bytes / MiB:6.0f} MiB" if r.peak_rss_bytes is not None else f"{'-':>9}"
    return (f"{r.category[:10]:<10} {r.config[:24]:<24} {r.n_tokens:>6} {r.tps:>8.2f} {speedup} {accept} "
            f"{mean} {r.ttft_s * 1000:6.0f}ms {rss}  {r.identical_text:<9}  {r.why_text}")


def csv_text(run: CompareRun) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for r in table_rows(run):
        writer.writerow([
            r.config, r.category, r.n_prompts, r.n_tokens, f"{r.tps:.3f}",
            "" if r.speedup is None else f"{r.speedup:.4f}",
            "" if r.accept_rate is None else f"{r.accept_rate:.4f}",
            "" if r.mean_accepted is None else f"{r.mean_accepted:.3f}",
            f"{r.ttft_s:.4f}",
            "" if r.peak_rss_bytes is None else f"{r.peak_rss_bytes / MiB:.1f}",
            "" if r.n_identical is None else ("yes" if r.n_identical == r.n_prompts else "no"),
        ])
    return out.getvalue()


def save_csv(run: CompareRun, path: str | Path) -> Path:
    return write_text_atomic(path, csv_text(run))
