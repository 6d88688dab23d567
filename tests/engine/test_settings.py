"""One settings shape and one result record (issue 49 item 5).

The settings a user sets (app.engine.settings.GenSettings) are built by the command line, the
window, Compare and the server alike, and become the engine's DecodeSettings through one checked
method; Compare's results hold the engine's RunSummary. Files written before the change still
load: tests/data holds a comparison JSON (format version 1) and the window's saved gen/settings,
both written by the code of main at e29053d, before the change.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from app.cli import build_parser
from app.engine.errors import SpeculaError
from app.engine.events import StopReason
from app.engine.seam import DEFAULT_DRAFT_MAX
from app.engine.settings import GenSettings

DATA = Path(__file__).resolve().parents[1] / "data"
COMPARE_V1 = DATA / "compare_v1.json"


# --- the one shape ---------------------------------------------------------------------------


def test_the_one_method_makes_the_engines_settings_seed_below_zero_random():
    wanted = GenSettings(max_tokens=12, temperature=0.3, top_k=7, top_p=0.5, min_p=0.2, seed=9, draft_max=5,
                         draft_min=2, draft_p_min=0.4, adaptive_draft=False)
    settings = wanted.decode_settings(stop_strings=("END",), stop_token_ids=())
    assert (settings.max_new_tokens, settings.draft_max, settings.draft_min, settings.draft_p_min,
            settings.adaptive_draft, settings.stop_strings, settings.stop_token_ids) == (12, 5, 2, 0.4, False, ("END",), ())
    sampling = settings.sampling
    assert (sampling.temperature, sampling.top_k, sampling.top_p, sampling.min_p, sampling.seed) == (0.3, 7, 0.5, 0.2, 9)
    assert GenSettings(seed=-1).decode_settings().sampling.seed is None
    assert GenSettings().decode_settings().stop_token_ids is None  # the tokenizer's EOS


@pytest.mark.parametrize("changes, message", [
    ({"max_tokens": 0}, "the number of tokens to generate must be at least 1"),
    ({"draft_max": 0}, "draft max must be at least 1"),
    ({"draft_p_min": 1.5}, "draft p-min must be a finite number between 0 and 1 (got 1.5)"),
    ({"temperature": math.nan}, "temperature must be a finite number 0 or more (got nan)"),
    ({"top_p": 2.0}, "top-p must be a finite number between 0 and 1 (got 2.0)"),
    ({"top_k": -1}, "top-k must be 0 (off) or more (got -1)"),
])
def test_a_value_the_engine_cannot_use_is_one_line(changes, message):
    with pytest.raises(SpeculaError) as raised:
        replace(GenSettings(), **changes).decode_settings()
    assert str(raised.value) == message


def test_every_place_keeps_the_defaults_a_user_sees():
    """`specula run`'s flags and the window share the defaults (temperature 0.8, 256 tokens); a
    comparison is greedy with seed 0 and 64 tokens, from the command line and the window alike."""
    from app.cli.compare import build_request
    from app.cli.request import settings_from_args
    from app.compare.results import COMPARE_DEFAULTS, RunSettings

    run_args = build_parser().parse_args(["run", "-m", "x.gguf", "-p", "hi"])
    assert settings_from_args(run_args) == GenSettings()
    assert (GenSettings().temperature, GenSettings().max_tokens, GenSettings().draft_max) == (0.8, 256, DEFAULT_DRAFT_MAX)
    compare_args = build_parser().parse_args(["compare", "-m", "x.gguf", "-p", "hi"])
    request = build_request(compare_args)
    assert request.settings.gen == COMPARE_DEFAULTS == RunSettings().gen
    assert (COMPARE_DEFAULTS.max_tokens, COMPARE_DEFAULTS.temperature, COMPARE_DEFAULTS.seed) == (64, 0.0, 0)
    fixed = build_parser().parse_args(["run", "-m", "x.gguf", "-p", "hi", "--draft-fixed", "--temp", "0", "-n", "9"])
    assert settings_from_args(fixed) == GenSettings(max_tokens=9, temperature=0.0, adaptive_draft=False)


def test_a_server_request_goes_over_the_servers_defaults_through_the_one_method():
    from app.server.params import parse_chat

    hello = [{"role": "user", "content": "hi"}]
    defaults = GenSettings(top_k=11, draft_max=6)  # as `specula serve --top-k 11 --draft-max 6` sets them
    request = parse_chat({"messages": hello, "temperature": 0.25, "seed": -3, "stop": "END"})
    settings = request.decode_settings(defaults, 40, ("\nUser:",))
    assert settings == replace(defaults, max_tokens=40, temperature=0.25, seed=-1).decode_settings(
        stop_strings=("END", "\nUser:"))
    assert settings.sampling.seed is None and settings.sampling.top_k == 11 and settings.draft_max == 6
    seeded = parse_chat({"messages": hello, "seed": 5}).decode_settings(defaults, 1)
    assert seeded.sampling.seed == 5 and seeded.sampling.temperature == 0.8


# --- the window's saved settings -------------------------------------------------------------


def test_the_windows_saved_settings_load_as_they_were_saved():
    """gen/settings as the window wrote it before the change (tests/data/gen_settings_v1.json)."""
    saved = json.loads((DATA / "gen_settings_v1.json").read_text())
    settings = GenSettings.from_dict(saved)
    assert settings == GenSettings(max_tokens=512, temperature=0.3, top_k=20, top_p=0.9, min_p=0.1, seed=42,
                                   draft_max=12, draft_min=2, draft_p_min=0.5, adaptive_draft=False)
    assert settings.to_dict() == saved  # and is written back the same way


def test_from_dict_keeps_what_it_cannot_read_from_the_base():
    base = GenSettings(max_tokens=64, temperature=0.0, seed=0)
    loaded = GenSettings.from_dict({"top_k": "x", "max_tokens": "32", "seed": 1e400, "unknown": 1}, base=base)
    assert loaded == replace(base, max_tokens=32)  # an infinite seed is no int: the base's kept
    assert GenSettings.from_dict("not a dict", base=base) == base


# --- comparison files ------------------------------------------------------------------------


def test_a_comparison_written_before_the_change_loads_and_reads_the_same():
    """The version 1 file: its settings become GenSettings, each result's counters a RunSummary,
    and the table shows what `specula compare` printed when it wrote the file (none 96.85 tok/s,
    lookup 72.20, 0.75x, 100% accepted, 207 ms to the first token)."""
    from app.compare.export import format_table
    from app.compare.fastest import reproduce_line
    from app.compare.results import VERSION, load_run

    raw = json.loads(COMPARE_V1.read_text())
    assert raw["version"] == 1 and VERSION == 2
    run = load_run(COMPARE_V1)
    gen = run.settings.gen
    assert (gen.max_tokens, gen.temperature, gen.seed, gen.draft_p_min) == (6, 0.0, 0, 0.75)
    assert run.settings.repeats == 1 and run.settings.draft_sweep == () and run.settings.ignore_eos is False
    for old, new in zip(raw["results"], run.results):
        summary = new.summary
        assert (new.config, new.prompt_index, new.identical, new.peak_rss_bytes) == (
            old["config"], old["prompt_index"], old["identical"], old["peak_rss_bytes"])
        for name in ("n_prompt", "n_predicted", "decode_s", "ttft_s", "n_steps", "n_drafted", "n_accepted", "text"):
            assert getattr(summary, name) == old[name], name
        assert summary.tokens == tuple(old["tokens"]) and summary.stop_reason is StopReason(old["stop_reason"])
        assert summary.accepted_by_position == tuple(old["accepted_by_position"])
        assert summary.to_dict()["prompt_s"] is None  # never recorded in version 1: unknown, not 0
    table = format_table(run)
    none_row = next(line for line in table.splitlines() if line.startswith("own        none"))
    lookup_row = next(line for line in table.splitlines() if line.startswith("own        lookup"))
    assert "96.85" in none_row and "207ms" in none_row
    assert "72.20" in lookup_row and "0.75x" in lookup_row and "100.0%" in lookup_row and "yes" in lookup_row
    assert reproduce_line(run).endswith("-n 6 --temp 0")


def test_a_converted_comparison_saves_in_todays_version_and_reads_back_equal(tmp_path):
    from app.compare.results import VERSION, load_run, save_run

    run = load_run(COMPARE_V1)
    path = save_run(run, tmp_path / "again.json")
    data = json.loads(path.read_text())
    assert data["version"] == VERSION and data["settings"]["gen"]["max_tokens"] == 6
    assert data["results"][0]["summary"]["stop_reason"] == "length" and "n_predicted" not in data["results"][0]
    assert load_run(path) == run


def test_a_damaged_old_comparison_is_one_line(tmp_path):
    from app.compare.results import CompareFileError, load_run

    raw = json.loads(COMPARE_V1.read_text())
    del raw["results"][0]["tokens"]
    path = tmp_path / "damaged.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(CompareFileError, match=r"^damaged\.json: damaged comparison \(TypeError: .*tokens"):
        load_run(path)
    raw["version"] = 99
    path.write_text(json.dumps(raw))
    with pytest.raises(CompareFileError, match="comparison format version 99 is not supported"):
        load_run(path)
