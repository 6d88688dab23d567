"""Comparison files written by older Specula versions, brought to today's shape on load.

Version 1 (until issue 49 item 5) kept the shared settings flat in "settings" (`n_predict`,
`temperature`, ... beside the compare-only `draft_sweep`, `ignore_eos`, `repeats`) and each
result's reply counters flat in the result. Version 2 holds the settings a user sets as the
engine's GenSettings under "settings"."gen", and each result's counters as the engine's RunSummary
under "summary". The upgrade only moves keys: a damaged file stays damaged and is refused by
CompareRun.from_dict as before.
"""

from __future__ import annotations

from typing import Any

# Version 1's flat settings keys that are GenSettings' now (n_predict is its max_tokens).
V1_GEN_KEYS = {"n_predict": "max_tokens", "temperature": "temperature", "top_k": "top_k", "top_p": "top_p",
               "min_p": "min_p", "seed": "seed", "draft_min": "draft_min", "draft_p_min": "draft_p_min"}
# Version 1's flat result keys that are RunSummary's now.
V1_SUMMARY_KEYS = ("n_prompt", "n_predicted", "decode_s", "ttft_s", "n_steps", "n_drafted", "n_accepted",
                   "accepted_by_position", "drafted_by_position", "stop_reason", "tokens", "text")
# What version 1 never recorded: zero in the summary and listed as unknown (RunSummary.unknown),
# so that RunSummary.to_dict says null for them rather than a made-up number.
V1_NOT_RECORDED = {"drafter": "", "n_prompt_evaluated": 0, "prompt_s": 0.0}
V1_UNKNOWN = ("n_prompt_evaluated", "prompt_s", "encode_tps")


def upgrade(data: dict[str, Any]) -> dict[str, Any]:
    """A comparison file's dict in today's shape (a new dict; `data` is left as it was). A
    version this module does not know is returned as it is (the caller refuses it)."""
    if data.get("version") == 1:
        data = _from_v1(data)
    return data


def _from_v1(data: dict[str, Any]) -> dict[str, Any]:
    settings = _object(data["settings"], "settings")
    gen = {new: settings[old] for old, new in V1_GEN_KEYS.items() if old in settings}
    rest = {k: v for k, v in settings.items() if k not in V1_GEN_KEYS}
    results = [_result_from_v1(_object(r, "a result")) for r in data["results"]]
    return {**data, "version": 2, "settings": {**rest, "gen": gen}, "results": results}


def _result_from_v1(result: dict[str, Any]) -> dict[str, Any]:
    summary = {k: result[k] for k in V1_SUMMARY_KEYS if k in result}
    summary.update(V1_NOT_RECORDED, unknown=list(V1_UNKNOWN))
    rest = {k: v for k, v in result.items() if k not in V1_SUMMARY_KEYS}
    return {**rest, "summary": summary}


def _object(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise TypeError(f"{what} must be an object")
    return value
