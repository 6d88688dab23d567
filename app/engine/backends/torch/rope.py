"""RoPE scaling that transformers' GGUF loader drops (facts.md).

Llama 3.1/3.2 GGUF files carry their rope scaling as the tensor `rope_freqs.weight`: one divisor
per rotary frequency, computed by llama.cpp's converter from the original rope_scaling. llama.cpp
computes theta_i = pos * base^(-2i/d) / rope_freqs[i]; transformers loads the file with plain RoPE.
We restore it by dividing the rotary embedding's inverse frequencies by those divisors, which is
exactly the llama3 rope of the original model. Linear scaling (`rope.scaling.type = linear`) is
restored the same way.
"""

from __future__ import annotations

import logging

import numpy as np
import torch

log = logging.getLogger(__name__)


def _rotary_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    return [m for m in model.modules() if hasattr(m, "inv_freq") and hasattr(m, "rope_type")]


def apply_rope_scaling(
    model: torch.nn.Module,
    architecture: str,
    metadata: dict,
    rope_freqs: np.ndarray | None,
) -> str | None:
    """Fix the model's rotary frequencies in place; return a description of what was applied."""
    divisors = None
    applied = None
    if rope_freqs is not None:
        divisors = torch.as_tensor(np.asarray(rope_freqs, dtype=np.float32))
        applied = "rope_freqs (Llama 3 frequency factors)"
    scaling_type = metadata.get(f"{architecture}.rope.scaling.type")
    factor = metadata.get(f"{architecture}.rope.scaling.factor")
    if scaling_type == "linear" and factor and float(factor) != 1.0:
        linear = torch.tensor(float(factor))
        divisors = linear if divisors is None else divisors * linear
        applied = f"linear rope scaling x{float(factor):g}" if applied is None else applied + " + linear"
    elif scaling_type not in (None, "none", "linear"):
        log.warning("rope scaling %r of this %s file is not applied", scaling_type, architecture)
    if divisors is None:
        return None
    rotaries = _rotary_modules(model)
    if not rotaries:
        log.warning("no rotary embedding found to apply %s", applied)
        return None
    for rotary in rotaries:
        if rotary.rope_type != "default":
            continue  # transformers already applied a scaling from the config
        base = rotary.inv_freq.float()
        if divisors.numel() not in (1, base.numel()):
            log.warning("rope_freqs has %d values for %d frequencies: ignored", divisors.numel(), base.numel())
            return None
        scaled = (base / divisors.to(base.device)).to(rotary.inv_freq.device)
        rotary.inv_freq = scaled
        rotary.original_inv_freq = scaled.clone()
    log.info("applied %s", applied)
    return applied
