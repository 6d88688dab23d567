"""The llama.cpp backend behind the seam: rollback, rows, tokenizer, the loop's greedy identity and
sampling distribution, on tiny real GGUF files and (marked demo) the real demo models."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from app.engine.drafting.drafters import ModelDrafter, NoDrafter, PromptLookupDrafter
from app.engine.events import DoneEvent
from app.engine.loop.sampling import SamplingParams
from app.engine.loop.speculative import DecodeSettings, generate
from tests.llama_support import llama_loaded, require_llama_cpp  # noqa: F401 - fixture

GREEDY = SamplingParams(temperature=0.0)
PROMPT = "def add(a, b):\n    return a + b\n\ndef add(a, b):\n"


def run(loaded, ids, drafter=None, **settings):
    settings.setdefault("sampling", GREEDY)
    events = list(generate(loaded.kv_model(), loaded.tokenizer, ids, drafter, DecodeSettings(**settings)))
    assert isinstance(events[-1], DoneEvent)
    return events[-1].summary


def test_loads_on_llama_cpp_with_its_reason(llama_loaded):
    loaded = llama_loaded("llama-q8")
    assert loaded.backend.name == "llama.cpp"
    assert loaded.plan.describe().startswith("llama.cpp on CPU")
    assert loaded.plan_reason.startswith("llama.cpp")
    assert loaded.kv_model().vocab_size == loaded.info.vocab_size


def test_rollback_gives_the_same_logits_bit_for_bit(llama_loaded):
    loaded = llama_loaded("llama-q8")
    kv = loaded.kv_model()
    ids = loaded.tokenizer.encode(PROMPT)
    first = kv.feed(ids, 1)[0]
    steps = [int(first.argmax())]
    for _ in range(5):
        steps.append(int(kv.feed(steps[-1:], 1)[0].argmax()))
    fed = ids + steps[:-1]  # the last step's token is not fed yet
    after = kv.feed([7, 8, 9], 3)
    kv.rewind(len(fed))
    assert kv.ids == fed
    again = kv.feed([7, 8, 9], 3)
    assert np.array_equal(after, again)
    kv.rewind(len(ids) - 1)
    assert np.array_equal(kv.feed(ids[-1:], 1)[0], first)


def test_rows_read_in_place_match_their_copies(llama_loaded):
    kv = llama_loaded("llama-q8").kv_model()
    rows = kv.feed_rows(list(range(10, 20)), 4)
    assert len(rows) == 4
    copied = rows.all()
    assert copied.shape == (4, kv.vocab_size)
    for i in range(4):
        assert rows.argmax(i) == int(copied[i].argmax())
        assert np.array_equal(rows.row(i), copied[i])


def test_rows_read_in_place_follow_the_buffer_as_llama_cpp_grows_it(llama_loaded):
    """The in-place views are kept by the buffer's address and row count: reading rows after a
    decode that needed more logits than any before (llama.cpp moves its buffer) reads the new
    buffer, and a count read before reads this decode's rows, not the last one's."""
    loaded = llama_loaded("llama-q8")
    ids = list(range(10, 40))
    kv = loaded.kv_model()
    one = kv.feed_rows(ids[:10], 1).row(0)
    two = kv.feed_rows(ids[10:12], 2).row(1)
    many = kv.feed_rows(ids[12:], 18).all()  # more rows than the buffer held
    last = kv.feed_rows([5], 1).row(0)
    fresh = loaded.kv_model()
    assert np.array_equal(fresh.feed(ids[:10], 1)[0], one)
    assert np.array_equal(fresh.feed(ids[10:12], 2)[1], two)
    assert np.array_equal(fresh.feed(ids[12:], 18), many)
    assert np.array_equal(fresh.feed([5], 1)[0], last)


def test_sync_reuses_the_common_prefix(llama_loaded):
    loaded = llama_loaded("llama-q8")
    kv = loaded.kv_model()
    a = loaded.tokenizer.encode("The model reads the file.")
    b = a[:-1] + loaded.tokenizer.encode(" writes")
    last_a = kv.sync(a)
    assert kv.ids == a[:-1] + [a[-1]]
    last_b = kv.sync(b)
    fresh = loaded.kv_model()
    assert np.array_equal(last_b, fresh.sync(b))
    assert np.array_equal(last_a, loaded.kv_model().sync(a))


def test_tokenizer_is_llama_cpps_and_round_trips(llama_loaded):
    tok = llama_loaded("llama-q8").tokenizer
    text = "héllo wörld ✓ 日本 <|im_start|>user"
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == text
    assert tok.convert_tokens_to_ids("<|im_start|>") in ids  # parsed as the special token
    split = tok.encode(text, add_special_tokens=False, split_special_tokens=True)
    assert tok.convert_tokens_to_ids("<|im_start|>") not in split
    assert tok.decode(split) == text
    assert "<|im_end|>" in tok.all_special_tokens
    assert tok.convert_tokens_to_ids("<|im_end|>") in tok.eos_token_id
    offsets = tok(text, return_offsets_mapping=True)["offset_mapping"]
    assert offsets[0][0] == 0 and offsets[-1][1] == len(text)
    assert all(a <= b for a, b in offsets)


def test_chat_template_renders_with_llama_cpps_tokens(llama_loaded):
    from app.engine.loop.chat import render_prompt

    tok = llama_loaded("llama-q8").tokenizer
    ids = render_prompt(tok, [{"role": "user", "content": "hi <|im_end|>"}])
    text = tok.decode(ids)
    assert text == "<|im_start|>user\nhi <|im_end|><|im_end|>\n<|im_start|>assistant\n"
    # the user's own "<|im_end|>" stays text: one special <|im_end|> token only
    assert ids.count(tok.convert_tokens_to_ids("<|im_end|>")) == 1


@pytest.mark.parametrize("drafter", ["lookup", "llama-f32", "llama-other"])
def test_greedy_identity_on_tiny_models(llama_loaded, drafter):
    main = llama_loaded("llama-q8")
    ids = main.tokenizer.encode(PROMPT)
    plain = run(main, ids, NoDrafter(), max_new_tokens=40, stop_token_ids=())
    if drafter == "lookup":
        d = PromptLookupDrafter()
    else:
        d = ModelDrafter(llama_loaded(drafter).kv_model(), main.kv_model().vocab_size)
    spec = run(main, ids, d, max_new_tokens=40, stop_token_ids=(), adaptive_draft=False, draft_max=5)
    assert spec.n_drafted > 0
    assert spec.tokens == plain.tokens


@pytest.mark.demo
def test_a_draft_model_as_dear_as_the_main_one_is_declined_before_it_runs(llama_loaded):
    """The main model's own file as its draft: a drafted token costs a main step (both measured
    at load), so with the defaults a user gets the schedule never runs it (not even its read of
    the prompt), the reply is plain decoding's, and the summary says why in one line. (A demo
    model: a tiny model's steps take microseconds, too few for a curve to mean anything.)"""
    main = llama_loaded("smollm2-135m")
    ids = main.tokenizer.encode(PROMPT)
    plain = run(main, ids, NoDrafter(), max_new_tokens=40, stop_token_ids=())
    draft_kv = main.kv_model()
    drafter = ModelDrafter(draft_kv, main.kv_model().vocab_size)
    assert drafter.token_cost_s() == pytest.approx(draft_kv.step_cost(1))
    spec = run(main, ids, drafter, max_new_tokens=40, stop_token_ids=())
    assert spec.tokens == plain.tokens
    assert spec.n_drafted == 0 and draft_kv.ids == []
    assert spec.schedule_note.startswith("drafting declined in all") and "a drafted token costs" in spec.schedule_note


def test_speculative_sampling_keeps_the_main_distribution(llama_loaded):
    from tests.engine.test_sampling import SAMPLING, always_accept, chi2_pvalue
    from app.engine.loop.sampling import logits_to_probs, speculative_accept

    main = llama_loaded("llama-f32")
    draft = llama_loaded("llama-other")
    prompt = main.tokenizer.encode(" the model and the model and the")

    def dist(ids):
        return logits_to_probs(main.kv_model().feed(ids, 1), SAMPLING)[0]

    p1 = dist(prompt)
    exact = np.zeros_like(p1)
    for t1 in np.flatnonzero(p1).tolist():
        exact += p1[t1] * dist(prompt + [t1])

    def counts(rule):
        found = np.zeros_like(exact)
        kv, drafter = main.kv_model(), ModelDrafter(draft.kv_model(), main.kv_model().vocab_size)
        drafted = 0
        for seed in range(1200):
            settings = DecodeSettings(max_new_tokens=3, draft_max=2, draft_p_min=0.0, adaptive_draft=False,
                                      sampling=SamplingParams(**{**SAMPLING.__dict__, "seed": seed}),
                                      stop_token_ids=())
            summary = list(generate(kv, main.tokenizer, prompt, drafter, settings, accept_rule=rule))[-1].summary
            drafted += summary.n_drafted
            found[summary.tokens[1]] += 1
        assert drafted > 600
        return found

    assert chi2_pvalue(counts(speculative_accept), exact) > 1e-3
    assert chi2_pvalue(counts(always_accept), exact) < 1e-6


# Blocks torch and transformers, then runs the real entry point: the llama.cpp path must not need them.
_WITHOUT_TORCH = ("import sys\n"
                  "class Block:\n"
                  "    def find_spec(self, name, path=None, target=None):\n"
                  "        if name.split('.')[0] in ('torch', 'transformers'):\n"
                  "            raise ImportError('blocked: ' + name)\n"
                  "sys.meta_path.insert(0, Block())\n"
                  "from app.cli import main\n"
                  "sys.exit(main(sys.argv[1:]))\n")


def test_seeded_reply_is_plain_decodings_whatever_is_drafted(llama_loaded):
    from tests.engine.test_sampling import assert_seeded_reply_is_plain_decodings

    assert_seeded_reply_is_plain_decodings(llama_loaded("llama-f32"))


@pytest.mark.parametrize("flags", [["--temp", "0"], ["--temp", "0.8", "--seed", "3", "--lookup"]])
def test_a_run_on_llama_cpp_imports_neither_torch_nor_transformers(tiny_paths, flags):
    """Importing torch is about a second, most of a whole `specula run`'s start to its first token:
    rows are numpy arrays, so greedy and sampled replies, drafted or not, run without it."""
    require_llama_cpp()
    result = subprocess.run([sys.executable, "-c", _WITHOUT_TORCH, "run", "-m", str(tiny_paths["llama-f32"]),
                             "-p", "Hello there", "-n", "12", "--backend", "llama.cpp", *flags],
                            capture_output=True, text=True, timeout=120, cwd=Path(__file__).resolve().parents[2])
    assert result.returncode == 0, result.stderr
    assert "n_predict = 12" in result.stderr or "stop: " in result.stderr, result.stderr


_LOAD_AND_ASK = ("import sys\n"
                 "from app.engine.loader import load_model\n"
                 "loaded = load_model(sys.argv[1], backend='llama.cpp')\n"
                 "kv = loaded.kv_model()\n"
                 "kv.feed(loaded.tokenizer.encode('Hello'))\n"
                 "asked = (loaded.plan_reason, loaded.weights_bytes, loaded.vocab_size, loaded.plan.describe(),\n"
                 "         loaded.backend.threads(), loaded.backend.plain_step_s(), loaded.backend.engine_facts(),\n"
                 "         loaded.backend.tie_cause(), loaded.backend.transformers_model())\n"
                 "print(loaded.backend.name)\n"
                 "print(' '.join(sorted(m for m in sys.modules\n"
                 "                      if m.split('.')[0] == 'torch' or m.startswith('app.engine.backends.torch'))))\n")


def test_a_llama_cpp_model_and_what_callers_ask_it_import_nothing_of_torchs(tiny_paths):
    """A model loaded on llama.cpp holds its backend: its KV cache, weights' bytes, vocabulary and
    reasons come from llama.cpp's backend object, so neither torch nor the torch backend's modules
    are imported (the loader used to reach torch_load, and the loaded model torch_kv, for both)."""
    require_llama_cpp()
    result = subprocess.run([sys.executable, "-c", _LOAD_AND_ASK, str(tiny_paths["llama-f32"])],
                            capture_output=True, text=True, timeout=120, cwd=Path(__file__).resolve().parents[2])
    assert result.returncode == 0, result.stderr
    name, imported = (result.stdout.splitlines() + [""])[:2]
    assert name == "llama.cpp"
    assert imported == "", f"a llama.cpp load imported {imported}"
