"""Comparison runs written as a real run records them (one PromptResult per configuration, prompt and
run), with the speeds, counts and schedule notes chosen to put the verdict's rules to the test.

`issue60_run` is the walk-through of issue 60 item 3: on Qwen2.5-Coder 1.5B, llama-server's ngram-mod
accepted 0% of its drafts yet ran 1.2x our plain decoding (llama-server decodes faster than our loop
there), and the 0.5B draft model never drafted (the schedule declined every step).
"""

from __future__ import annotations

from dataclasses import replace

from app.compare.prompts import Prompt
from app.compare.results import (COMPARE_DEFAULTS, LLAMA_SERVER, MODEL, NONE, CompareRun, ConfigSpec, MainFacts,
                                 PromptResult, RunSettings)
from app.engine.drafting.kinds import LEARNING
from app.engine.events import RunSummary, StopReason

TOKENS = 40
PROMPTS = (Prompt("code", "def f(x):"), Prompt("chat", "hello"))
DECLINED = ("drafting declined in all 40 steps: a drafted token costs 0.65x a main-model token here and a verify "
            "of 4 drafts 3.7x, so plain decoding was faster")
DRAFT_05B = "Qwen2.5 Coder 0.5B Instruct Q4_K_M"
OURS_PLAIN = ConfigSpec(NONE, NONE, label=NONE)
SERVER_PLAIN = ConfigSpec("llama-server plain", LLAMA_SERVER, None, "llama-server plain")
SERVER_MOD = ConfigSpec("llama-server ngram-mod", LLAMA_SERVER, None, "llama-server ngram-mod", server_types="ngram-mod")
OURS_DEFAULT = ConfigSpec(LEARNING, LEARNING, None, LEARNING)
DRAFT_MODEL = ConfigSpec(DRAFT_05B, MODEL, "/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", DRAFT_05B)


def result(config: ConfigSpec, index: int, repeat: int, tps: float, drafted: int, accepted: int,
           note: str | None = None) -> PromptResult:
    summary = RunSummary("x", tuple(range(TOKENS + 1)), StopReason.MAX_TOKENS, config.drafter, 5, 5, 0.01, TOKENS + 1,
                         TOKENS / tps, 0.01, TOKENS, drafted, min(accepted, drafted), (), (), schedule_note=note)
    return PromptResult(config.name, index, PROMPTS[index].category, summary, (), repeat=repeat)


def made_run(rows: dict[ConfigSpec, tuple[list[float], int, int, str | None]]) -> CompareRun:
    """rows: configuration -> (its tok/s in each run, drafted and accepted per reply, the schedule's
    note). The first configuration must be plain decoding (none)."""
    configs = tuple(rows)
    results = []
    n_runs = len(next(iter(rows.values()))[0])
    for repeat in range(n_runs):
        for config, (speeds, drafted, accepted, note) in rows.items():
            for index in range(len(PROMPTS)):
                results.append(result(config, index, repeat, speeds[repeat], drafted, accepted, note))
    settings = RunSettings(replace(COMPARE_DEFAULTS, max_tokens=TOKENS), repeats=n_runs)
    return CompareRun(MainFacts("Qwen2.5 Coder 1.5B Instruct Q4_K_M", "/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
                                "CPU, 2 threads"), settings, configs, PROMPTS, tuple(results), status="complete")


def issue60_run(with_server_plain: bool = True) -> CompareRun:
    """none ~20 tok/s; llama-server plain ~24; llama-server ngram-mod ~24 with 0 of 30 drafts accepted;
    our default drafter ~20 with a few accepted; the 0.5B declined in every step."""
    rows = {OURS_PLAIN: ([19.8, 20.1, 20.0], 0, 0, None)}
    if with_server_plain:
        rows[SERVER_PLAIN] = ([24.0, 24.3, 24.1], 0, 0, None)
    rows[SERVER_MOD] = ([24.1, 24.2, 24.0], 30, 0, None)
    rows[OURS_DEFAULT] = ([20.2, 20.0, 20.3], 12, 3, None)
    rows[DRAFT_MODEL] = ([19.9, 20.0, 19.7], 0, 0, DECLINED)
    return made_run(rows)
