"""What a comparison says in words: one short headline (the fastest configuration, and which part
of its gain is drafting), and per drafter a verdict part (the command line's "verdict:" line, the
window's details). Plain Python over results.CompareRun (no torch, no Qt).

Each drafted row is judged against its own engine's plain decoding (summary.plain_of): ours
against none, a llama-server type against llama-server's plain decoding, whose own speed against
ours is said on its own. A gain where no draft was accepted is never drafting's.
"""

from __future__ import annotations

from app.compare.fastest import SERVER_OWN_TEXT, SERVER_PLAIN_TEXT, fastest
from app.compare.results import NONE, SERVER_URL, CompareRun, ConfigSpec
from app.compare.summary import ALL, Row, is_plain, plain_of, speedup_spread, table_rows, times

_NOTHING_ACCEPTED = "no draft was accepted: as fast as {base} at best"


def headline(run: CompareRun | None) -> str:
    """One short line: 'Fastest: lookup, 2.3x the speed of none', 'No clear winner: plain
    decoding (why)', or what the run lacks so far ('no result yet')."""
    if run is None:
        return ""
    choice = fastest(run)
    if choice is None:
        return verdict(run)
    text = choice.short()
    return f"Fastest: {text}" if choice.pays_off else text[0].upper() + text[1:]


def detail_lines(run: CompareRun) -> list[str]:
    """What the headline stands for, a line each: the fastest with its speeds' spreads, every
    drafter's verdict part, and the outputs that differ from plain decoding's."""
    choice = fastest(run)
    if choice is None:
        return []
    text = choice.describe()
    lines = [f"Fastest: {text}" if choice.pays_off else text[0].upper() + text[1:]]
    lines += verdict_parts(run)
    differ = _differ(run)
    return lines + ([f"{differ} output(s) differ from none's"] if differ else [])


def _differ(run: CompareRun) -> int:
    return sum(1 for r in run.results if r.identical is False) if run.settings.greedy else 0


def verdict(run: CompareRun) -> str:
    """One line: "lookup: 2.3x on code, 1.1x on chat; draft X: slower than none on this machine"."""
    rows = table_rows(run)
    if not any(r.config == NONE for r in rows):
        return "no result yet" if not run.results else "no baseline (none) result: no speedup to report"
    parts = verdict_parts(run, rows)
    if not parts:
        return "only the baseline ran: nothing to compare"
    differ = _differ(run)
    tail = f" — {differ} output(s) differ from none's" if differ else ""
    return "; ".join(parts) + tail


def verdict_parts(run: CompareRun, rows: list[Row] | None = None) -> list[str]:
    """'name: judgement' for every drafter and every other engine (a sweep's lengths of one
    drafter summed up by its best length overall), then each configuration that failed."""
    rows = table_rows(run) if rows is None else rows
    parts = []
    for label, configs in _drafters(run).items():
        overall = {c.name: _overall(rows, c.name) for c in configs}
        ranked = [c for c in configs if overall[c.name] is not None]
        if not ranked:
            continue
        best = max(ranked, key=lambda c: overall[c.name].speedup or 0.0)
        name = label if len(configs) == 1 else f"{label} (best k={best.draft_max})"
        spread = speedup_spread(run, best.name, plain_of(run, best) or NONE)
        spread_text = f" (all prompts: {spread.times_text()})" if spread is not None else ""
        parts.append(f"{name}: {_judge(run, rows, best, overall[best.name])}{spread_text}")
    parts += [f"{error.config}: failed ({error.message})" for error in run.errors]
    return parts


def _drafters(run: CompareRun) -> dict[str, list[ConfigSpec]]:
    groups: dict[str, list[ConfigSpec]] = {}
    for config in run.configs:
        if config.drafter != NONE:
            groups.setdefault(config.label or config.name, []).append(config)
    return groups


def _overall(rows: list[Row], config: str) -> Row | None:
    mine = [r for r in rows if r.config == config and r.speedup is not None]
    overall = [r for r in mine if r.category == ALL]
    return (overall or mine or [None])[0]


def _judge(run: CompareRun, rows: list[Row], config: ConfigSpec, overall: Row) -> str:
    """What a configuration's figures say: an engine's own speed against ours, or a drafter's
    gain over its engine's plain decoding."""
    if is_plain(config):  # llama-server's plain decoding: the engine, against ours
        return _engine(overall, f"{SERVER_OWN_TEXT}, no drafting")
    if config.drafter == SERVER_URL:
        return _engine(overall, "its own model and engine, drafting not told apart")
    plain = plain_of(run, config)
    if plain is None:  # a llama-server type without llama-server's plain row to measure it by
        if not overall.accept_rate:
            return f"no draft accepted: its {times(overall.speedup)} over none is {SERVER_OWN_TEXT}, not drafting"
        return (f"{times(overall.speedup)} the speed of none, {SERVER_OWN_TEXT} and drafting together "
                f"(run {SERVER_PLAIN_TEXT} beside it to tell them apart)")
    if overall.nothing_drafted is not None:
        return overall.nothing_drafted
    return _drafting(rows, config, overall, "none" if plain == NONE else SERVER_PLAIN_TEXT)


def _engine(overall: Row, what: str) -> str:
    if (overall.speedup or 0.0) < 1.0:
        return f"slower than none ({times(overall.speedup)}): {what}"
    return f"{times(overall.speedup)} the speed of none: {what}"


def _drafting(rows: list[Row], config: ConfigSpec, overall: Row, base: str) -> str:
    """A drafter's gain over `base` (its engine's plain decoding) by category. A gain where no
    draft was accepted is the machine's noise, not the drafter's: not a headline."""
    over = "" if base == "none" else f" over {base}"
    by_category = sorted((r for r in rows if r.config == config.name and r.category != ALL and r.gain),
                         key=lambda r: -(r.gain or 0.0))
    if not overall.accept_rate:
        if (overall.gain or 0.0) < 1.0:
            return f"no draft was accepted: slower than {base} ({times(overall.gain)})"
        return _NOTHING_ACCEPTED.format(base=base)
    if (overall.gain or 0.0) < 1.0 and all((r.gain or 0.0) < 1.0 for r in by_category):
        return f"slower than {base} on this machine ({times(overall.gain)})"
    if len(by_category) <= 1:
        return times(overall.gain) + over
    faster = [r for r in by_category if (r.gain or 0.0) >= 1.0 and r.accept_rate]
    level = [r.category for r in by_category if (r.gain or 0.0) >= 1.0 and not r.accept_rate]
    shown = [f"{times(r.gain)} on {r.category}" for r in faster]
    if level:
        shown.append(f"nothing accepted on {', '.join(level)} (as fast as {base})")
    slower = [r for r in by_category if (r.gain or 0.0) < 1.0]
    if slower:
        shown.append("slower on " + ", ".join(f"{r.category} ({times(r.gain)})" for r in reversed(slower)))
    return ", ".join(shown) + over
