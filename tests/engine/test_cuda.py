"""The CUDA paths on tiny real GGUF files: the whole model on the GPU or only its first layer, in
bf16, f16 and float32, with prompt lookup and a draft model, greedy and sampled.

Skipped where torch sees no CUDA GPU (CI has none). On a GPU machine: pytest tests/engine/test_cuda.py.
The same checks were first made by hand on an NVIDIA H200 (torch 2.11.0+cu130, transformers 5.24):
`specula compare` gave output identical to plain decoding's in every one of these settings.

The tiny models' logits are spread wide (tests/tiny_gguf.py: logit_scale), so greedy tokens have
no near-ties and bf16 or f16 products of several tokens, which round differently from one-token
steps on a GPU, still give plain decoding's tokens; float32 gives them by construction, and a
model drafting for itself is then accepted every time.
"""

from __future__ import annotations

import pytest
import torch

from app.engine.drafting.drafters import ModelDrafter, NoDrafter, PromptLookupDrafter
from app.engine.events import DoneEvent
from app.engine.loader import load_model
from app.engine.loop.sampling import SamplingParams
from app.engine.loop.speculative import DecodeSettings, generate

DEVICE = "cuda"
pytestmark = pytest.mark.skipif(DEVICE == "cuda" and not torch.cuda.is_available(),
                                reason="needs a CUDA GPU: torch sees none here")

PROMPTS = ["def add(a, b):\n    return a + b\n\ndef add(a, b):\n",
           "The model reads the file and the model writes the file."]
GREEDY = SamplingParams(temperature=0.0)
# (dtype, layers on the GPU): None = all of them; 1 = the first of the tiny models' 2, the rest on the CPU.
PLACEMENTS = [("bfloat16", None), ("float16", None), ("float32", None), ("bfloat16", 1)]


@pytest.fixture(scope="module")
def placed(tiny_paths):
    cache = {}

    def get(name: str, dtype: str, n_gpu_layers: int | None):
        key = (name, dtype, n_gpu_layers)
        if key not in cache:
            cache[key] = load_model(tiny_paths[name], device=DEVICE, dtype=dtype, n_gpu_layers=n_gpu_layers)
        return cache[key]

    return get


def _run(loaded, prompt_ids, drafter, **settings):
    settings.setdefault("sampling", GREEDY)
    events = list(generate(loaded.kv_model(), loaded.tokenizer, prompt_ids, drafter, DecodeSettings(**settings)))
    assert isinstance(events[-1], DoneEvent)
    return events[-1].summary


@pytest.mark.parametrize("dtype,n_gpu_layers", PLACEMENTS, ids=["bf16", "f16", "f32", "bf16-ngl1"])
@pytest.mark.parametrize("main_name", ["llama-q8", "qwen2-q8"])
def test_speculative_output_is_plain_decodings_on_the_gpu(placed, main_name, dtype, n_gpu_layers):
    main = placed(main_name, dtype, n_gpu_layers)
    assert main.plan.gpu == DEVICE
    draft = placed("llama-other", dtype, None)  # a shallower model of the same vocabulary
    for prompt in PROMPTS:
        ids = main.tokenizer.encode(prompt)
        plain = _run(main, ids, NoDrafter(), max_new_tokens=32)
        assert plain.n_predicted > 0
        for drafter in (PromptLookupDrafter(), ModelDrafter(draft.kv_model(), main.kv_model().vocab_size, name="draft")):
            spec = _run(main, ids, drafter, max_new_tokens=32, draft_p_min=0.0)
            assert spec.n_drafted > 0 or drafter.__class__ is PromptLookupDrafter
            assert list(spec.tokens) == list(plain.tokens), (prompt, type(drafter).__name__)


def test_a_model_drafting_for_itself_is_always_accepted_in_float32(placed):
    main = placed("llama-q8", "float32", None)
    ids = main.tokenizer.encode(PROMPTS[1])
    plain = _run(main, ids, NoDrafter(), max_new_tokens=32, stop_token_ids=())
    itself = ModelDrafter(main.kv_model(), main.kv_model().vocab_size, name="itself")
    spec = _run(main, ids, itself, max_new_tokens=32, stop_token_ids=(), draft_max=4, adaptive_draft=False,
                draft_p_min=0.0)
    assert spec.n_drafted > 0 and spec.n_accepted == spec.n_drafted
    assert list(spec.tokens) == list(plain.tokens)


def test_sampling_on_the_gpu_is_repeatable_by_seed(placed):
    main = placed("qwen2-q8", "bfloat16", None)
    ids = main.tokenizer.encode(PROMPTS[0])
    sampled = [_run(main, ids, PromptLookupDrafter(), max_new_tokens=24, stop_token_ids=(),
                    sampling=SamplingParams(temperature=0.8, seed=seed)) for seed in (7, 7)]
    assert sampled[0].n_predicted == 24
    assert list(sampled[0].tokens) == list(sampled[1].tokens)
    assert all(0 <= t < main.kv_model().vocab_size for t in sampled[0].tokens)
