"""transformers before 5.24 names the forward's KV cache argument past_key_values and swallows our
cache= silently (the model then keeps a cache of its own and the first rollback fails deep inside
transformers, as seen with 5.17): Specula says so in one line instead, and asks pip for 5.24+,
and for the torch that transformers itself runs with."""

from __future__ import annotations

import importlib.metadata
import tomllib
from pathlib import Path

import pytest
import transformers
from packaging.requirements import Requirement
from packaging.version import Version

from app.engine.errors import SpeculaError
from app.engine.backends.torch.kv import MIN_TRANSFORMERS, KVModel, require_cache_argument
from tests.tiny_gguf import TinySpec, build_hf_model


def _forward_before_5_24(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None,
                         inputs_embeds=None, labels=None, use_cache=None, logits_to_keep=0, **kwargs):
    """The signature of LlamaForCausalLM.forward in transformers 5.17 to 5.23."""


def test_installed_transformers_takes_cache():
    require_cache_argument()
    require_cache_argument(build_hf_model(TinySpec()).forward)


def test_an_older_forward_is_one_clear_line():
    with pytest.raises(SpeculaError) as caught:
        require_cache_argument(_forward_before_5_24)
    message = str(caught.value)
    assert "\n" not in message
    assert transformers.__version__ in message and f"transformers>={MIN_TRANSFORMERS},<6" in message


def test_kvmodel_refuses_a_model_whose_forward_ignores_cache():
    model = build_hf_model(TinySpec())
    model.forward = _forward_before_5_24.__get__(model)
    with pytest.raises(SpeculaError, match="too old"):
        KVModel(model)


def _dependencies() -> list[str]:
    return tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())["project"]["dependencies"]


def _lowest(requirement: Requirement) -> Version:
    return max(Version(spec.version) for spec in requirement.specifier if spec.operator == ">=")


def test_the_package_asks_for_the_same_transformers():
    assert f"transformers>={MIN_TRANSFORMERS},<6" in _dependencies()


def test_the_package_asks_for_a_torch_that_transformers_runs_with():
    """transformers turns PyTorch off below the torch its own "torch" extra asks for (5.24: 2.6,
    "Disabling PyTorch because PyTorch >= 2.6 is required"): a user's older CUDA build that our
    pin let through would load no model at all."""
    ours = next(Requirement(r) for r in _dependencies() if Requirement(r).name == "torch")
    theirs = next(Requirement(r) for r in importlib.metadata.requires("transformers")
                  if Requirement(r).name == "torch" and Requirement(r).marker.evaluate({"extra": "torch"}))
    assert _lowest(ours) >= _lowest(theirs)
