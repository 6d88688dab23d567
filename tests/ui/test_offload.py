"""-ngl partial offload plumbing, exercised on the CPU (the GPU run is the device script's)."""

from __future__ import annotations

import torch

from app.engine.backends.torch.device import DevicePlan, apply_plan
from app.engine.drafting.drafters import NoDrafter
from app.engine.events import DoneEvent
from app.engine.loader import load_model
from app.engine.loop.sampling import SamplingParams
from app.engine.loop.speculative import DecodeSettings, generate


def test_split_model_computes_the_same(tiny_paths):
    """Place layer 0 on "the GPU" (here the CPU device under another name) and the rest on the
    CPU: the boundary hooks must move every input so generation is unchanged."""
    whole = load_model(tiny_paths["llama-f32"], device="cpu", dtype="float32")
    split = load_model(tiny_paths["llama-f32"], device="cpu", dtype="float32")
    plan = DevicePlan(gpu="cpu", dtype=torch.float32, n_gpu_layers=1, n_layers=whole.info.n_layers)
    assert not plan.all_on_gpu and "1/2 layers" in plan.describe()
    apply_plan(split.model, plan)
    hooked = [m for m in split.model.modules() if m._forward_pre_hooks]
    assert len(hooked) == whole.info.n_layers + 1  # every decoder layer and the final norm
    ids = whole.tokenizer.encode("the model reads the file")
    settings = DecodeSettings(max_new_tokens=16, sampling=SamplingParams(temperature=0.0))

    def tokens(loaded):
        events = list(generate(loaded.kv_model(), loaded.tokenizer, ids, NoDrafter(), settings))
        assert isinstance(events[-1], DoneEvent)
        return events[-1].summary.tokens

    assert tokens(split) == tokens(whole)
