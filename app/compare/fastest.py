"""From comparison to choice: the fastest configuration of a run, as plain data the chat's pair
picker can take, and as the `specula run` flags that reproduce it. Plain Python (no torch, no Qt).

A drafter wins only when the measurement shows it beyond noise: the prompt set ran at least
MIN_RUNS times, its slowest run was faster than plain decoding's fastest (the spreads do not
overlap), at least one of its drafts was accepted (a drafter that never drafts right cannot be
faster; its lead is noise), and it is MARGIN faster overall. Among those, the best overall speedup
wins; with none of them the verdict is "no clear winner: plain decoding" (the baseline: a drafter
that only matches plain decoding is not worth its memory).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from app.engine.drafting.kinds import SPEC_TYPE_OF  # the engine's n-gram kinds by llama.cpp's names
from app.compare.results import COMPARE_DEFAULTS, ENGINE_KINDS, LLAMA_SERVER, LOOKUP, MODEL, NONE, SERVER_URL, CompareRun, ConfigSpec, RunSettings
from app.compare.summary import ALL, Spread, table_rows, times, tps_spread

MARGIN = 1.05  # a drafter must be this much faster than plain decoding to be chosen
MIN_RUNS = 2  # one run has no spread: nothing tells its lead from the machine's noise
DEFAULTS = COMPARE_DEFAULTS  # `specula run`'s draft defaults are the same (app.cli.add_model_flags)


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

    @property
    def pays_off(self) -> bool:
        return self.drafter != NONE

    def describe(self) -> str:
        """'lookup k=8, 2.3x the speed of none (41.0-44.2 tok/s over 3 runs; plain 17.1-18.0)',
        or 'no clear winner: plain decoding (why)'."""
        if not self.pays_off:
            return "no clear winner: plain decoding" + (f" ({self.why})" if self.why else "")
        text = f"{self.config}, {times(self.speedup)} the speed of none"
        if self.spread is not None and self.base_spread is not None:
            text += f" ({self.spread.tps_text()}; plain decoding {self.base_spread.tps_text()})"
        return text


def fastest(run: CompareRun | None) -> Fastest | None:
    """The fastest configuration overall; None while there is no baseline to measure against."""
    if run is None:
        return None
    speedups = _overall_speedups(run)
    if NONE not in speedups:
        return None
    base = next(c for c in run.configs if c.name == NONE)
    drafting = sorted((c for c in run.configs if c.name in speedups and c.drafter != NONE),
                      key=lambda c: -speedups[c.name])
    if not drafting:
        return _fastest(run, base, 1.0, "no drafter finished")
    whys = {c.name: _doubt(run, c.name, speedups[c.name]) for c in drafting}
    winner = next((c for c in drafting if not whys[c.name]), None)
    if winner is None:
        return _fastest(run, base, 1.0, whys[drafting[0].name])
    return _fastest(run, winner, speedups[winner.name])


def _doubt(run: CompareRun, config: str, speedup: float) -> str:
    """Why this drafter's lead is not shown beyond noise; "" when it is."""
    if speedup < MARGIN:
        return f"the best drafter, {config}, was {times(speedup)} the speed of plain decoding"
    mine, base = tps_spread(run, config), tps_spread(run, NONE)
    if mine is None or base is None or min(mine.n, base.n) < MIN_RUNS:
        return (f"{config} was {times(speedup)} in a single run; repeat the runs (at least {MIN_RUNS}) "
                "to tell a lead from noise")
    engine = next((c.drafter for c in run.configs if c.name == config), None) in ENGINE_KINDS
    if not engine and not any(r.summary.n_accepted for r in run.results_of(config)):  # another engine's speed is its own
        return f"{config} had no draft accepted, so its {times(speedup)} is noise"
    if mine.overlaps(base):
        return f"{config}'s {mine.tps_text()} overlap plain decoding's {base.tps_text().split(' over ')[0]}"
    return ""


def _overall_speedups(run: CompareRun) -> dict[str, float]:
    """config -> its speedup over every prompt (the one category's, if there is only one)."""
    rows = [r for r in table_rows(run) if r.speedup is not None]
    wanted = ALL if any(r.category == ALL for r in rows) else (run.categories() or [ALL])[0]
    return {r.config: r.speedup for r in rows if r.category == wanted}


def _fastest(run: CompareRun, config: ConfigSpec, speedup: float, why: str = "") -> Fastest:
    s = run.settings
    draft_path = config.draft_path if config.drafter in (MODEL, LLAMA_SERVER) else None
    return Fastest(config.name, run.main.path, config.drafter, draft_path,
                   config.draft_max, config.adaptive, s.gen.draft_min, s.gen.draft_p_min, speedup,
                   tps_spread(run, config.name), tps_spread(run, NONE), why, config.server_types, config.server_url)




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

