"""What a comparison means: per configuration and category figures, the curves and the
differences from an earlier run (the verdict is app.compare.verdict's). Plain Python over
results.CompareRun (no torch, no Qt).

Speeds are decoding speeds: tokens after the first one over the time they took (the first token
comes from the prompt pass and is the time to first token, reported on its own). A group of
prompts counts all its tokens over all its time, so long replies weigh more than short ones.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass

from app.compare.results import ENGINE_KINDS, LLAMA_SERVER, NONE, SERVER_URL, CompareRun, ConfigSpec, PromptResult
from app.engine.events import RunSummary, StopReason
from app.engine.loop.explain import BreakEven, Prices

ALL = "all"  # the category of a configuration's overall row
SPEED_WINDOW = 8  # tokens per window of the tokens/s-over-the-reply curve


@dataclass(frozen=True)
class Row:
    config: str
    category: str  # a prompt category, or ALL
    n_prompts: int
    n_tokens: int
    tps: float
    speedup: float | None  # over "none" on the same prompts; None when there is no baseline
    accept_rate: float | None  # None for "none"
    mean_accepted: float | None  # draft tokens accepted per verify step
    ttft_s: float
    peak_rss_bytes: int | None
    n_identical: int | None  # prompts whose output equals the baseline's; None for the baseline
    drafter: str = NONE
    # Why its drafts pay here or not, from the schedule's prices in its last reply (None: unpriced).
    why: BreakEven | None = None
    # Over its own engine's plain decoding on the same prompts (plain_of): the part of the speed
    # that is drafting. None for a plain row, and where no plain row of its engine ran.
    gain: float | None = None
    # A drafting row that drafted nothing: why, in words ("declined: <the schedule's reason>").
    nothing_drafted: str | None = None

    @property
    def why_text(self) -> str:
        return self.why.short() if self.why is not None else "-"

    @property
    def identical_text(self) -> str:
        if self.n_identical is None:
            return "-"
        return "yes" if self.n_identical == self.n_prompts else f"NO ({self.n_identical}/{self.n_prompts})"

    @property
    def accept_text(self) -> str:
        """'82%'; 'declined' or 'none drafted' for a drafter that drafted nothing; '-' for plain decoding."""
        if self.nothing_drafted is not None:
            return "declined" if self.nothing_drafted.startswith(DECLINED) else "none drafted"
        return "-" if self.accept_rate is None else f"{self.accept_rate:.0%}"


def is_plain(config: ConfigSpec) -> bool:
    """Plain decoding on its engine: ours (none) or llama-server's (no --spec-type)."""
    return config.drafter == NONE or (config.drafter == LLAMA_SERVER and not config.server_types)


def plain_of(run: CompareRun, config: ConfigSpec) -> str | None:
    """The row whose speed a drafted row's drafting is measured against: its own engine's plain
    decoding (none for ours, llama-server's for a llama-server type). None for a plain row, for a
    server at a URL (its own model and engine), and for a llama-server type run without
    llama-server's plain row (or before it has a result): there the engine's part and drafting's
    cannot be told apart."""
    if is_plain(config) or config.drafter == SERVER_URL:
        return None
    if config.drafter == LLAMA_SERVER:
        return next((c.name for c in run.configs
                     if c.drafter == LLAMA_SERVER and is_plain(c) and run.results_of(c.name)), None)
    return NONE


def _speed(results: list[PromptResult]) -> float:
    summaries = [r.summary for r in results]
    tokens = sum(max(s.n_predicted - 1 + int(s.stop_reason == StopReason.EOS), 0) for s in summaries)  # as decode_tps
    seconds = sum(s.decode_s for s in summaries)
    return tokens / seconds if seconds > 0 else 0.0


def _row(config: ConfigSpec, category: str, results: list[PromptResult], base_tps: float | None,
         plain_tps: float | None = None) -> Row:
    summaries = [r.summary for r in results]
    drafted = sum(s.n_drafted for s in summaries)
    steps = sum(s.n_steps for s in summaries)
    # llama-server's plain decoding drafts nothing by design; a server at a URL may not report it
    drafting = not is_plain(config) and (config.drafter != SERVER_URL or drafted > 0)
    tps = _speed(results)
    rss = [r.peak_rss_bytes for r in results if r.peak_rss_bytes is not None]
    identical = [r.identical for r in results if r.identical is not None]
    return Row(
        config=config.name,
        category=category,
        n_prompts=len(results),
        n_tokens=sum(s.n_predicted for s in summaries),
        tps=tps,
        speedup=tps / base_tps if base_tps else None,
        accept_rate=(sum(s.n_accepted for s in summaries) / drafted if drafted else 0.0) if drafting else None,
        mean_accepted=(sum(s.n_accepted for s in summaries) / steps if steps else 0.0) if drafting else None,
        ttft_s=sum(s.ttft_s for s in summaries) / len(results),
        peak_rss_bytes=max(rss) if rss else None,
        n_identical=sum(identical) if (drafting or config.drafter in ENGINE_KINDS) and identical else None,
        drafter=config.drafter,
        why=_why(summaries, sum(s.n_accepted for s in summaries) / drafted if drafting and drafted else None),
        gain=tps / plain_tps if plain_tps else None,
        nothing_drafted=_nothing_drafted(summaries) if drafting and not drafted else None,
    )


DECLINED = "declined"  # how a row that the schedule kept from drafting begins its words
_SCHEDULE_DECLINED = "drafting declined in all "  # app.engine.loop.schedule's note, when it declined every step


def _nothing_drafted(summaries: list[RunSummary]) -> str:
    """Why a drafter drafted nothing in these replies, as the chat's stats line says it: the
    schedule's reason where it declined every step ("declined: a drafted token costs 0.65x ...");
    else what the schedule noted (the drafter had nothing to propose), or that it drafted nothing."""
    notes = [s.schedule_note for s in summaries if s.schedule_note]
    declined = [n for n in notes if n.startswith(_SCHEDULE_DECLINED)]
    if declined:
        return f"{DECLINED}: {declined[-1].split(': ', 1)[-1]}"
    return f"drafted nothing: {notes[-1]}" if notes else "drafted nothing"


def _why(summaries: list[RunSummary], acceptance: float | None) -> BreakEven | None:
    """The break-even of the row's last priced reply, at the row's acceptance."""
    priced = [s for s in summaries if s.step_costs and s.draft_token_cost is not None]
    if not priced:
        return None
    last = priced[-1]
    return Prices(tuple(last.step_costs), last.draft_token_cost, None).break_even(acceptance)


def table_rows(run: CompareRun, with_all: bool = True) -> list[Row]:
    """One row per configuration and category (in run order), then one per configuration over
    every prompt; only the prompts the baseline (and, for a row's gain, its engine's plain row)
    also finished count toward a speedup."""
    rows: list[Row] = []
    categories = run.categories() + ([ALL] if with_all and len(run.categories()) > 1 else [])
    for category in categories:
        for config in run.configs:
            results = [r for r in run.results_of(config.name) if category in (ALL, r.category)]
            if not results:
                continue
            plain = plain_of(run, config)
            rows.append(_row(config, category, results, _baseline_tps(run, results),
                             _baseline_tps(run, results, plain) if plain else None))
    return rows


def _baseline_tps(run: CompareRun, results: list[PromptResult], baseline: str = NONE) -> float | None:
    wanted = {r.prompt_index for r in results}
    base = [r for r in run.results_of(baseline) if r.prompt_index in wanted]
    return _speed(base) if base and {r.prompt_index for r in base} == wanted else None


# --- the spread over repeated runs ----------------------------------------------------------


@dataclass(frozen=True)
class Spread:
    """The lowest and highest of one figure over the complete runs (rounds) of the prompt set."""

    low: float
    high: float
    n: int  # complete runs

    def overlaps(self, other: Spread) -> bool:
        return self.low <= other.high and other.low <= self.high

    def tps_text(self) -> str:
        """'41.2-44.0 tok/s over 3 runs' ('41.2 tok/s in 1 run')."""
        if self.n < 2:
            return f"{self.low:.1f} tok/s in 1 run"
        return f"{self.low:.1f}-{self.high:.1f} tok/s over {self.n} runs"

    def times_text(self) -> str:
        """'1.9-2.4x over 3 runs'."""
        return f"{times(self.low).removesuffix('x')}-{times(self.high)} over {self.n} runs"


def round_speeds(run: CompareRun, config: str) -> dict[int, float]:
    """run (round) -> the configuration's decoding speed over every prompt of it; only rounds in
    which it finished every prompt (a cancelled round's part would be another prompt mix)."""
    rounds: dict[int, list[PromptResult]] = {}
    for r in run.results_of(config):
        rounds.setdefault(r.repeat, []).append(r)
    n_prompts = len(run.prompts)
    return {k: _speed(rs) for k, rs in sorted(rounds.items()) if len({r.prompt_index for r in rs}) == n_prompts}


def tps_spread(run: CompareRun, config: str) -> Spread | None:
    speeds = list(round_speeds(run, config).values())
    return Spread(min(speeds), max(speeds), len(speeds)) if speeds else None


def speedup_spread(run: CompareRun, config: str, baseline: str = NONE) -> Spread | None:
    """How much faster than plain decoding (`baseline`: ours, or its engine's) it can be said to
    be, from its slowest run over plain decoding's fastest to its fastest over plain decoding's
    slowest: the low end is above 1x exactly when the two spreads do not overlap. None with fewer
    than two runs of each (one run has no spread)."""
    mine, base = tps_spread(run, config), tps_spread(run, baseline)
    if mine is None or base is None or min(mine.n, base.n) < 2 or base.low <= 0:
        return None
    return Spread(mine.low / base.high, mine.high / base.low, min(mine.n, base.n))


def times(speedup: float | None) -> str:
    """"2.3x"; two decimals near 1 ("0.98x"), where one would read as no change."""
    if speedup is None:
        return "-"
    text = f"{speedup:.1f}x"
    return f"{speedup:.2f}x" if text == "1.0x" else text


# --- curves ---------------------------------------------------------------------------------


def speed_curve(results: list[PromptResult], window: int = SPEED_WINDOW) -> list[tuple[int, float]]:
    """(token position in the reply, tokens/s over the last `window` tokens), pooled over the
    prompts that reached that position: the window's tokens over the time they took."""
    points = []
    longest = max((r.summary.n_predicted for r in results), default=0)
    for position in range(1 + window, longest + 1):
        tokens = seconds = 0.0
        for r in results:
            if r.summary.n_predicted >= position and r.timeline:
                start, end = _time_at(r.timeline, position - window), _time_at(r.timeline, position)
                tokens += window
                seconds += max(end - start, 0.0)
        if seconds > 0:
            points.append((position, tokens / seconds))
    return points


def _time_at(timeline: tuple[tuple[int, float], ...], n_tokens: float) -> float:
    """Seconds since the first token when the n-th token arrived (linear between steps: the
    tokens of one verify step all arrive at once, spreading them keeps the curve readable)."""
    counts = [n for n, _ in timeline]
    i = bisect_left(counts, n_tokens)
    if i == 0:
        return timeline[0][1]
    if i >= len(timeline):
        return timeline[-1][1]
    (n0, t0), (n1, t1) = timeline[i - 1], timeline[i]
    return t0 + (t1 - t0) * (n_tokens - n0) / (n1 - n0)


def acceptance_by_position(results: list[PromptResult]) -> list[float]:
    """Accepted / drafted at each draft position, over all the prompts."""
    drafted: list[int] = []
    accepted: list[int] = []
    for r in results:
        for i, (d, a) in enumerate(zip(r.summary.drafted_by_position, r.summary.accepted_by_position)):
            if i == len(drafted):
                drafted.append(0)
                accepted.append(0)
            drafted[i] += d
            accepted[i] += a
    return [a / d if d else 0.0 for a, d in zip(accepted, drafted)]


# --- an earlier run -------------------------------------------------------------------------


@dataclass(frozen=True)
class Delta:
    config: str
    category: str
    tps_before: float
    tps_now: float
    speedup_before: float | None
    speedup_now: float | None

    @property
    def tps_change(self) -> float:
        """Relative change of tokens/s (0.12 = 12 % faster now)."""
        return self.tps_now / self.tps_before - 1.0 if self.tps_before > 0 else 0.0


def deltas(current: CompareRun, earlier: CompareRun) -> dict[tuple[str, str], Delta]:
    """(config, category) -> the change since the earlier run, for the rows both runs have."""
    before = {(r.config, r.category): r for r in table_rows(earlier)}
    out = {}
    for row in table_rows(current):
        old = before.get((row.config, row.category))
        if old is not None:
            out[(row.config, row.category)] = Delta(row.config, row.category, old.tps, row.tps,
                                                    old.speedup, row.speedup)
    return out


def delta_line(current: CompareRun, earlier: CompareRun) -> str:
    """One line on the overall rows: 'vs 2026-05-01 12:00: none +3%, lookup −12%'."""
    changes = deltas(current, earlier)
    wanted = ALL if len(current.categories()) > 1 else (current.categories() or [ALL])[0]
    parts = [f"{d.config} {d.tps_change:+.0%}" for (config, category), d in changes.items() if category == wanted]
    if not parts:
        return f"vs {earlier.created_text()}: no configuration in common"
    return f"tokens/s vs {earlier.created_text()}: " + ", ".join(parts)
