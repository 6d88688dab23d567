"""From comparison to choice: the fastest configuration of a run, as plain data the chat's pair
picker can take, and as the `specula run` flags that reproduce it. Plain Python (no torch, no Qt).

The fastest is the configuration with the best overall speedup over "none", if it beats it by
more than the noise of one run (MARGIN); otherwise "none" (the baseline: a drafter that only
matches plain decoding is not worth its memory, and a 1% lead is a measurement's noise).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from app.compare.results import LOOKUP, MODEL, NONE, CompareRun, ConfigSpec, RunSettings
from app.compare.summary import ALL, table_rows, times

MARGIN = 1.05  # a drafter must be this much faster than plain decoding to be chosen
DEFAULTS = RunSettings()  # `specula run`'s draft defaults are the same (app.cli.add_model_flags)


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

    @property
    def pays_off(self) -> bool:
        return self.drafter != NONE

    def describe(self) -> str:
        """'lookup k=8, 2.3x the speed of none', or that plain decoding won."""
        if not self.pays_off:
            return f"none: no drafter beat plain decoding by more than {MARGIN - 1:.0%}"
        return f"{self.config}, {times(self.speedup)} the speed of none"


def fastest(run: CompareRun | None) -> Fastest | None:
    """The fastest configuration overall; None while there is no baseline to measure against."""
    if run is None:
        return None
    speedups = _overall_speedups(run)
    if NONE not in speedups:
        return None
    ranked = [c for c in run.configs if c.name in speedups]
    best = max(ranked, key=lambda c: speedups[c.name])  # "none" comes first, so it wins a tie
    if speedups[best.name] < MARGIN:
        best = next(c for c in ranked if c.name == NONE)
    return _fastest(run, best, speedups[best.name])


def _overall_speedups(run: CompareRun) -> dict[str, float]:
    """config -> its speedup over every prompt (the one category's, if there is only one)."""
    rows = [r for r in table_rows(run) if r.speedup is not None]
    wanted = ALL if any(r.category == ALL for r in rows) else (run.categories() or [ALL])[0]
    return {r.config: r.speedup for r in rows if r.category == wanted}


def _fastest(run: CompareRun, config: ConfigSpec, speedup: float) -> Fastest:
    s = run.settings
    return Fastest(config.name, run.main.path, config.drafter, config.draft_path if config.drafter == MODEL else None,
                   config.draft_max, config.adaptive, s.draft_min, s.draft_p_min, speedup)


# The engine's n-gram kinds by llama.cpp's --spec-type names (app.cli.spec_args.ENGINE_KIND).
SPEC_TYPE_OF = {LOOKUP: "ngram-simple", "ngram-mod": "ngram-mod", "ngram-cache": "ngram-cache"}


def run_flags(choice: Fastest) -> list[str]:
    """The `specula run` flags for the choice (unquoted), in llama.cpp's current names
    (--spec-type, --spec-draft-n-max, ...; -md is the same in both). Every flag's spelling is
    here, and only here."""
    flags = ["-m", choice.main_path]
    if choice.drafter == NONE:
        return flags
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


def setting_flags(settings: RunSettings, dtype: str = "auto", int4: bool = True) -> list[str]:
    """The `specula run` flags of what every configuration of a run shared: the reply length, the
    sampling when it was not greedy (`run` is greedy by default too only with --temp 0), and the
    precision when it was forced."""
    flags = ["-n", str(settings.n_predict)]
    if settings.greedy:
        flags += ["--temp", "0"]
    else:
        flags += ["--temp", f"{settings.temperature:g}", "--top-k", str(settings.top_k), "--top-p",
                  f"{settings.top_p:g}", "--min-p", f"{settings.min_p:g}", "--seed", str(settings.seed)]
    if dtype != "auto":
        flags += ["--dtype", dtype]
    if not int4:
        flags.append("--no-int4")
    return flags


def reproduce_line(run: CompareRun, dtype: str = "auto", int4: bool = True) -> str | None:
    """The command line's last line: which configuration won and how to run it again, with the
    settings the run shared (setting_flags)."""
    choice = fastest(run)
    if choice is None:
        return None
    command = shlex.join(["specula", "run", *run_flags(choice), *setting_flags(run.settings, dtype, int4)])
    return f"reproduce the fastest ({choice.describe()}): {command}"

