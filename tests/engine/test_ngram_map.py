"""llama.cpp's ngram-map-k and ngram-map-k4v in our loop (app.engine.drafting.ngram_map): what each
drafts on hand-made histories (common/ngram-map.cpp's search, key and value statistics,
acceptance bookkeeping and thresholds), its flags, and a seeded reply that stays plain decoding's."""

from __future__ import annotations

import json

import pytest

from app.cli import build_parser, main
from app.cli.request import SERVER_ONLY, engine_of, server_engine
from app.cli.spec_args import spec_choice
from app.engine.drafting.kinds import MapParams
from app.engine.drafting.ngram_map import NgramMapDrafter

SMALL = MapParams(size_n=2, size_m=3)
FILL = [50, 51, 52, 53, 54, 55, 56, 57]  # tokens between passages: no key occurs in them


def test_map_k_drafts_what_followed_the_keys_latest_occurrence():
    context = [1, 2, 10, 11, 12, 60, 1, 2, 20, 21, 22, *FILL, 1, 2]
    assert NgramMapDrafter(SMALL).match(context, 8) == (2, (20, 21, 22))
    assert NgramMapDrafter(SMALL).match(context, 2) == (2, (20, 21))  # the loop's budget holds
    assert NgramMapDrafter(SMALL).match(context[:6], 8) == (0, ())  # fewer than 2n+m tokens


def test_map_k_drafts_no_more_than_its_last_draft_had_accepted():
    drafter = NgramMapDrafter(SMALL)
    context = [0, 1, 2, 10, 11, 12, 13, 14, *FILL, 1, 2]  # position 0 is "no match" in llama.cpp
    assert drafter.match(context, 8)[1] == (10, 11, 12)
    drafter.accept(1)
    assert drafter.match(context + [10, 99, 5, 1, 2], 8)[1] == (10,)
    drafter.accept(0)  # rejected whole: this key never drafts again
    assert drafter.match(context + [10, 99, 5, 1, 2, 77, 1, 2], 8) == (0, ())


def test_k4v_drafts_only_a_continuation_twice_as_frequent_as_the_others():
    once_each = [1, 2, 10, 11, 12, 60, 1, 2, 20, 21, 22, *FILL, 1, 2]
    assert NgramMapDrafter(SMALL, key_only=False).match(once_each, 8) == (0, ())
    # Two to one: it drafts, and (llama.cpp's way) what followed the occurrence found, not the
    # most frequent continuation.
    twice_one = [1, 2, 10, 11, 12, 60, 1, 2, 10, 11, 12, 61, 1, 2, 20, 21, 22, *FILL, 1, 2]
    assert NgramMapDrafter(SMALL, key_only=False).match(twice_one, 8) == (2, (20, 21, 22))


def test_k4v_waits_for_min_hits():
    drafter = NgramMapDrafter(MapParams(2, 3, min_hits=2), key_only=False)
    context = [0, 1, 2, 10, 11, 12, *FILL, 1, 2]
    assert drafter.match(context, 8) == (0, ())  # the key's first hit
    assert drafter.match(context + [10, 11, 1, 2], 8)[1] == (10, 11, 12)


def test_a_new_generation_begins_with_its_prompt():
    drafter = NgramMapDrafter(SMALL)
    context = [0, 1, 2, 10, 11, 12, 13, 14, *FILL, 1, 2]
    drafter.match(context, 8)
    drafter.accept(0)
    drafter.finish(context)
    assert drafter.match(context, 8) == (0, ())  # the key learned in the prompt is kept
    assert drafter.fresh().match(context, 8)[1] == (10, 11, 12)  # another sequence: its own map


def test_the_reply_is_searched_through_the_hash_index_once_indexed():
    """Positions past the prompt go into the index as the reply grows; a key found there drafts."""
    drafter = NgramMapDrafter(SMALL)
    prompt = [0, *FILL, 60, 61, 62]
    reply = [1, 2, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40]
    context = prompt + reply
    assert drafter.match(context, 8) == (0, ())  # 40, the last token: no earlier key (40, ...)
    assert drafter.map.key_map_last_idx == len(context) - 1 - 2 - 3 - 1
    assert drafter.match(context + [41, 1, 2], 8)[1] == (30, 31, 32)


def test_confident_says_whether_the_key_occurred_before_and_changes_nothing():
    context = [0, 1, 2, 10, 11, 12, 13, 14, *FILL, 1, 2]
    drafter = NgramMapDrafter(SMALL)
    assert drafter.confident(context) is True
    assert drafter.confident(context + [99]) is False
    assert NgramMapDrafter(SMALL).confident(context[:6]) is False  # too short to draft
    assert (drafter.map.keys, drafter.map.key_map_last_idx) == ([], 0)  # nothing counted nor indexed
    assert drafter.match(context, 8)[1] == (10, 11, 12)


def test_flags_reach_the_drafters():
    args = build_parser().parse_args([
        "run", "-m", "m.gguf", "-p", "hi", "--spec-type", "ngram-map-k,ngram-simple,ngram-map-k4v",
        "--spec-ngram-map-k-size-n", "3", "--spec-ngram-map-k-size-m", "9", "--spec-ngram-map-k4v-min-hits", "2"])
    choice = spec_choice(args)
    assert choice.ngram == "ngram-map-k4v+ngram-map-k+lookup"
    assert choice.map_k == (3, 9, 1) and choice.map_k4v == (12, 48, 2)
    assert engine_of(args) == "specula" and not {"ngram-map-k", "ngram-map-k4v"} & set(SERVER_ONLY)


def test_run_on_llama_server_forwards_the_map_flags():
    args = build_parser().parse_args([
        "run", "-m", "m.gguf", "-p", "hi", "--engine", "llama-server", "--spec-type", "ngram-map-k4v",
        "--spec-ngram-map-k4v-size-n", "8", "--spec-ngram-map-k4v-min-hits", "2"])
    flags = server_engine(args).flags()
    assert flags[flags.index("--spec-type") + 1] == "ngram-map-k4v"
    assert flags[flags.index("--spec-ngram-map-k4v-size-n") + 1] == "8"
    assert flags[flags.index("--spec-ngram-map-k4v-min-hits") + 1] == "2"
    assert "--spec-ngram-map-k4v-size-m" not in flags  # left at llama.cpp's default


@pytest.mark.parametrize("flag,value", [("--spec-ngram-map-k-size-n", "0"), ("--spec-ngram-map-k4v-size-m", "1025"),
                                        ("--spec-ngram-map-k4v-min-hits", "0")])
def test_out_of_bounds_map_flags_are_one_line_and_exit_2(capsys, flag, value):
    kind = "ngram-map-k" if "map-k-" in flag else "ngram-map-k4v"
    assert main(["run", "-m", "missing.gguf", "-p", "hi", "--spec-type", kind, flag, value]) == 2
    err = capsys.readouterr().err
    assert "between 1 and 1024" in err and err.count("\n") == 1


@pytest.mark.parametrize("kind", ["ngram-map-k", "ngram-map-k4v"])
def test_run_drafts_with_the_type_in_our_loop_and_keeps_plain_decodings_reply(capsys, tiny_paths, kind):
    base = ["run", "-m", str(tiny_paths["llama-f32"]), "-p", "a b c d e f a b c d e f a b c d e f a b", "-n", "24",
            "--temp", "0", "--dtype", "float32", "--json"]
    results = []
    for argv in (base, [*base, "--spec-type", kind, f"--spec-{kind}-size-n", "2", f"--spec-{kind}-size-m", "4"]):
        assert main(argv) == 0
        results.append(json.loads(capsys.readouterr().out.strip().splitlines()[-1]))
    plain, drafted = results
    assert drafted["drafter"] == kind and drafted["tokens"] == plain["tokens"] and drafted["n_drafted"] > 0


def test_seeded_sampling_with_map_drafters_is_plain_decodings(tiny_loaded):
    from tests.engine.test_sampling import assert_seeded_reply_is_plain_decodings

    for key_only in (True, False):
        assert_seeded_reply_is_plain_decodings(
            tiny_loaded("llama-f32"), lambda key_only=key_only: NgramMapDrafter(MapParams(2, 4), key_only))


def test_llama_server_takes_the_forwarded_map_flags_and_gives_our_greedy_reply(capsys, tiny_paths):
    """The flags' names are llama-server's own: it starts with them, and its reply is ours."""
    from tests.engine.test_llama_server import _require_server, _run

    _require_server()
    common = ["run", "-m", str(tiny_paths["llama-q8"]), "-p", "a b c d e f a b c d e f a b c d", "-n", "12",
              "--temp", "0", "--json", "-t", "1", "--spec-type", "ngram-map-k4v",
              "--spec-ngram-map-k4v-size-n", "2", "--spec-ngram-map-k4v-size-m", "4", "--spec-ngram-map-k4v-min-hits", "2"]
    replies = []
    for engine in ("specula", "llama-server"):
        code, out, err = _run(capsys, *common, "--engine", engine, "--backend", "llama.cpp")
        assert code == 0, err
        replies.append(json.loads(out.strip().splitlines()[-1]))
    ours, theirs = replies
    assert ours["drafter"] == "ngram-map-k4v" and theirs["drafter"] == "llama-server ngram-map-k4v"
    assert theirs["text"] == ours["text"] and theirs["n_predicted"] == ours["n_predicted"] == 12


def test_the_pair_loader_and_its_fresh_drafters_carry_the_map_parameters(tiny_paths):
    from app.engine.pair_loader import PairSpec, load_pair

    spec = PairSpec(tiny_paths["llama-f32"], ngram="ngram-map-k+ngram-map-k4v", map_k=MapParams(3, 7),
                    map_k4v=MapParams(5, 9, 2), device="cpu", dtype="float32")
    pair = load_pair(spec)
    for drafter in (pair.drafter, pair.new_drafter()):
        maps = {m.name: m.params for m in drafter.matchers}
        assert maps == {"ngram-map-k": MapParams(3, 7), "ngram-map-k4v": MapParams(5, 9, 2)}


def test_compare_takes_the_map_types_and_its_fastest_line_names_them_again():
    from app.cli.compare import drafts_arg
    from app.compare.choices import resolve_draft
    from app.compare.fastest import Fastest, run_flags

    args = build_parser().parse_args(["compare", "-m", "m.gguf", "--spec-type", "ngram-map-k4v,ngram-simple"])
    assert drafts_arg(args) == "none,lookup+ngram-cache+ngram-mod,ngram-map-k4v+lookup"  # the default, then these
    assert resolve_draft("ngram-map-k").label == "ngram-map-k"
    chosen = Fastest("ngram-map-k4v+lookup", "m.gguf", "ngram-map-k4v+lookup", None, 64, True, 0, 0.75, 1.2)
    flags = run_flags(chosen)
    assert flags[flags.index("--spec-type") + 1] == "ngram-map-k4v,ngram-simple"
