"""From comparison to choice: the fastest configuration of a run, as plain data the chat's pair
picker can take, and as the `specula run` flags that reproduce it. Plain Python (no torch, no Qt).

A drafter wins only when the measurement shows its drafting beyond noise, against its own engine's
plain decoding (ours: none; a llama-server type: llama-server's plain decoding, summary.plain_of):
the prompt set ran at least MIN_RUNS times, its slowest run was faster than that plain decoding's
fastest (the spreads do not overlap), at least one of its drafts was accepted (a drafter that never
drafts right cannot be faster; its lead is noise, or its engine's), and it is MARGIN faster. A
llama-server type must beat ours so too, and one run without llama-server's plain row is never
crowned (its engine's part and drafting's cannot be told apart). Another engine's plain decoding
(llama-server's, a server at a URL) may be the fastest for its own speed, said as such, never as
drafting. Among the winners, the best overall speedup over none wins; with none of them the
verdict is "no clear winner: plain decoding" (the baseline: a drafter that only matches plain
decoding is not worth its memory).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from app.engine.drafting.kinds import SPEC_TYPE_OF  # the engine's n-gram kinds by llama.cpp's names
from app.compare.results import (COMPARE_DEFAULTS, LLAMA_SERVER, MODEL, NONE, SERVER_URL, CompareRun, ConfigSpec,
                                 RunSettings)
from app.compare.summary import ALL, Row, Spread, is_plain, plain_of, table_rows, times, tps_spread

MARGIN = 1.05  # a drafter must be this much faster than plain decoding to be chosen
MIN_RUNS = 2  # one run has no spread: nothing tells its lead from the machine's noise
DEFAULTS = COMPARE_DEFAULTS  # `specula run`'s draft defaults are the same (app.cli.add_model_flags)
SERVER_PLAIN_TEXT = "llama-server's plain decoding"
SERVER_OWN_TEXT = "llama-server's own decoding"  # its plain decoding's speed against ours: the engine's part


@dataclass(frozen=True)
class Fastest:
    """The winning configuration: what to load in the chat and how to draft."""

    config: str  # its name in the run: "none", "lookup k=8", "SmolLM2 360M"
    main_path: str
    drafter: str  # NONE, MODEL or an n-gram kind ("lookup", "lookup+ngram-cache", ...)
    draft_path: str | None
    draft_max: int
    adaptive: bool
    draft_min: int
    draft_p_min: float
    speedup: float  # over "none", overall
    spread: Spread | None = None  # its tok/s over the runs
    base_spread: Spread | None = None  # plain decoding's
    why: str = ""  # with plain decoding chosen: why no drafter won
    server_types: str = ""  # LLAMA_SERVER: llama.cpp's --spec-type list it ran with
    server_url: str = ""  # SERVER_URL: the server that answered
    drafting: float | None = None  # a llama-server type: its speed over llama-server's plain decoding
    engine: float | None = None  # llama-server: its plain decoding's speed over ours

    @property
    def pays_off(self) -> bool:
        return self.drafter != NONE

    def short(self) -> str:
        """'lookup k=8, 2.3x the speed of none'; on llama-server, which part is drafting and
        which its own decoding; 'no clear winner: plain decoding (why)'."""
        if not self.pays_off:
            return "no clear winner: plain decoding" + (f" ({self.why})" if self.why else "")
        return f"{self.config}, {times(self.speedup)} the speed of none{self._source()}"

    def _source(self) -> str:
        if self.drafter == SERVER_URL:
            return ": its own model and engine"
        if self.drafter != LLAMA_SERVER:
            return ""  # our loop: all of it is drafting
        if not self.server_types:
            return f": {SERVER_OWN_TEXT}, no drafting"
        return (f": {times(self.drafting)} from drafting over {SERVER_PLAIN_TEXT}, "
                f"{times(self.engine)} from {SERVER_OWN_TEXT}")

    def describe(self) -> str:
        """short() with the spreads: 'lookup k=8, 2.3x the speed of none (41.0-44.2 tok/s over 3
        runs; plain decoding 17.1-18.0)', or 'no clear winner: plain decoding (why)'."""
        text = self.short()
        if self.pays_off and self.spread is not None and self.base_spread is not None:
            text += f" ({self.spread.tps_text()}; plain decoding {self.base_spread.tps_text()})"
        return text


def fastest(run: CompareRun | None) -> Fastest | None:
    """The fastest configuration overall; None while there is no baseline to measure against."""
    if run is None:
        return None
    rows = _overall_rows(run)
    if NONE not in rows:
        return None
    base = next(c for c in run.configs if c.name == NONE)
    candidates = sorted((c for c in run.configs if c.name in rows and c.drafter != NONE),
                        key=lambda c: -(rows[c.name].speedup or 0.0))
    if not candidates:
        return _fastest(run, base, rows, "no drafter finished")
    whys = {c.name: _doubt(run, c, rows[c.name]) for c in candidates}
    winner = next((c for c in candidates if not whys[c.name]), None)
    if winner is None:
        return _fastest(run, base, rows, whys[candidates[0].name])
    return _fastest(run, winner, rows)


def _doubt(run: CompareRun, config: ConfigSpec, row: Row) -> str:
    """Why this configuration is not shown faster beyond noise (and, drafting, by drafting); ""
    when it is."""
    if is_plain(config) or config.drafter == SERVER_URL:  # another engine's own speed, against ours
        return _noise(run, config.name, NONE, row.speedup, "plain decoding")
    silent = _silence(run, config.name, row)
    plain = plain_of(run, config)
    if plain is None:  # a llama-server type without llama-server's plain row
        if silent:  # what it never drafted cannot have gained it anything
            return f"{config.name}'s {times(row.speedup)} is {SERVER_OWN_TEXT}: {silent}"
        return (f"{config.name}'s {times(row.speedup)} over none is {SERVER_OWN_TEXT} and its drafting "
                f"together: run {SERVER_PLAIN_TEXT} beside it to tell them apart")
    base_text = "plain decoding" if plain == NONE else SERVER_PLAIN_TEXT
    doubt = _noise(run, config.name, plain, row.gain, base_text, silent, drafter=True)
    if doubt or plain == NONE:
        return doubt
    return _noise(run, config.name, NONE, row.speedup, "plain decoding")  # and faster than ours, whole


def _silence(run: CompareRun, config: str, row: Row) -> str:
    """'no draft accepted' ('it never drafted' where the schedule declined every step, or the
    drafter proposed nothing); "" where a draft was accepted."""
    if any(r.summary.n_accepted for r in run.results_of(config)):
        return ""
    return "it never drafted" if row.nothing_drafted is not None else "no draft accepted"


def _noise(run: CompareRun, config: str, baseline: str, speedup: float | None, base_text: str,
           silent: str = "", drafter: bool = False) -> str:
    """Why `config`'s lead over `baseline` (whose name in words is base_text) is not beyond noise;
    `silent`: that no draft of it was accepted (_silence)."""
    if speedup is None or speedup < MARGIN:
        who = f"the best drafter, {config}," if drafter else config
        return f"{who} was {times(speedup)} the speed of {base_text}"
    mine, base = tps_spread(run, config), tps_spread(run, baseline)
    if mine is None or base is None or min(mine.n, base.n) < MIN_RUNS:
        return (f"{config} was {times(speedup)} in a single run; repeat the runs (at least {MIN_RUNS}) "
                "to tell a lead from noise")
    if silent:
        return f"{config}'s {times(speedup)} is noise: {silent}"
    if mine.overlaps(base):
        return f"{config}'s {mine.tps_text()} overlap {base_text}'s {base.tps_text().split(' over ')[0]}"
    return ""


def _overall_rows(run: CompareRun) -> dict[str, Row]:
    """config -> its row over every prompt (the one category's, if there is only one), where it
    has a speedup over none."""
    rows = [r for r in table_rows(run) if r.speedup is not None]
    wanted = ALL if any(r.category == ALL for r in rows) else (run.categories() or [ALL])[0]
    return {r.config: r for r in rows if r.category == wanted}


def _fastest(run: CompareRun, config: ConfigSpec, rows: dict[str, Row], why: str = "") -> Fastest:
    s = run.settings
    chosen = config.drafter != NONE and not why
    draft_path = config.draft_path if config.drafter in (MODEL, LLAMA_SERVER) else None
    return Fastest(config.name, run.main.path, config.drafter, draft_path, config.draft_max, config.adaptive,
                   s.gen.draft_min, s.gen.draft_p_min, rows[config.name].speedup if chosen else 1.0,
                   tps_spread(run, config.name), tps_spread(run, NONE), why, config.server_types, config.server_url,
                   drafting=rows[config.name].gain if config.drafter == LLAMA_SERVER else None,
                   engine=_server_speedup(run, config, rows))


def _server_speedup(run: CompareRun, config: ConfigSpec, rows: dict[str, Row]) -> float | None:
    """llama-server's plain decoding over ours, for a llama-server row (None for any other)."""
    if config.drafter != LLAMA_SERVER:
        return None
    plain = config.name if is_plain(config) else plain_of(run, config)
    return rows[plain].speedup if plain in rows else None


def run_flags(choice: Fastest) -> list[str]:
    """The `specula run` flags for the choice (unquoted), in llama.cpp's current names
    (--spec-type, --spec-draft-n-max, ...; -md is the same in both). Every flag's spelling is
    here, and only here."""
    flags = ["-m", choice.main_path]
    if choice.drafter == NONE:
        return flags
    if choice.drafter == SERVER_URL:
        return flags + ["--server", choice.server_url]
    if choice.drafter == LLAMA_SERVER:  # llama.cpp's own lengths: none of ours
        flags += ["--engine", "llama-server"] + (["-md", choice.draft_path] if choice.draft_path else [])
        return flags + (["--spec-type", choice.server_types] if choice.server_types else [])
    if choice.drafter == MODEL:
        flags += ["-md", choice.draft_path or ""]
    else:  # an n-gram kind, or several joined by "+": one combined drafter, as --spec-type combines
        flags += ["--spec-type", ",".join(SPEC_TYPE_OF[part] for part in choice.drafter.split("+"))]
    flags += ["--spec-draft-n-max", str(choice.draft_max)]
    if not choice.adaptive:
        flags.append("--draft-fixed")
    if choice.draft_min != DEFAULTS.draft_min:
        flags += ["--spec-draft-n-min", str(choice.draft_min)]
    if choice.draft_p_min != DEFAULTS.draft_p_min:
        flags += ["--spec-draft-p-min", f"{choice.draft_p_min:g}"]
    return flags


def run_command(choice: Fastest) -> str:
    """'specula run -m MAIN --lookup --draft-max 8', each argument shell-quoted (add -p or -f)."""
    return shlex.join(["specula", "run", *run_flags(choice)])


def setting_flags(settings: RunSettings, dtype: str = "auto") -> list[str]:
    """The `specula run` flags of what every configuration of a run shared: the reply length, the
    sampling when it was not greedy (`run` is greedy by default too only with --temp 0), and the
    precision when it was forced."""
    gen = settings.gen
    flags = ["-n", str(gen.max_tokens)]
    if settings.greedy:
        flags += ["--temp", "0"]
    else:
        flags += ["--temp", f"{gen.temperature:g}", "--top-k", str(gen.top_k), "--top-p",
                  f"{gen.top_p:g}", "--min-p", f"{gen.min_p:g}", "--seed", str(gen.seed)]
    if dtype != "auto":
        flags += ["--dtype", dtype]
    return flags


def reproduce_line(run: CompareRun, dtype: str = "auto") -> str | None:
    """The command line's last line: which configuration won and how to run it again, with the
    settings the run shared (setting_flags)."""
    choice = fastest(run)
    if choice is None:
        return None
    command = shlex.join(["specula", "run", *run_flags(choice), *setting_flags(run.settings, dtype)])
    return f"reproduce the fastest ({choice.describe()}): {command}"

