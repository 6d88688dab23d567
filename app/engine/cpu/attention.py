"""Attention for half-precision models on the CPU: torch's SDPA, computed in float32.

On this CPU (avx512_bf16) torch's SDPA kernel is several times slower in bf16 than in float32:
alone, for one query of Gemma 3 270M over 400 cached tokens, 18 layers cost 6.8 ms in bf16 and
1.1 ms in float32 (the bf16 kernel's cost grows about 4x faster with the context). bf16 matrix
products whose sizes change every step are slow too (each new size costs more than the product),
so no hand-made products either. So the queries, keys and values (the model's own bf16 states,
widened exactly) go to SDPA in float32, and its output is rounded back to the model's dtype.
Measured inside the model while decoding Gemma 3 270M, against the bf16 products used before,
attention went from 3.4 to 1.6 ms per token at 100 tokens of context and from 4.6 to 2.8 ms at
380, widening included.

The KV cache of such a model holds its keys and values in float32 too (app.engine.cpu.kvbuffer):
they are the model's bf16 states, widened exactly, so the results are the same as widening them
at every step, without the widening: decoding with 400 tokens of context measured 1-3 ms per token
faster on both demo models, for twice the cache's memory (Gemma 3 270M: 36 KB per token instead of
18). That cache appends in place rather than concatenating; see its module for the figures.

On int4 loads, verifying drafts computes each position on its own (float32_attention): SDPA
over several queries rounds differently from SDPA over one, and in bf16 that was enough to flip
near-tied greedy tokens (5 of 10 speculative rows of SmolLM2 in `specula bench` differed from
plain decoding; none do now). It costs SmolLM2 about 12% on 16-token verifies and Gemma 3 270M
nothing measurable. Dequantized bf16 loads batch their matrices (not row-exact anyway), so their
attention stays one batched call, which long verifies of prompt lookup need to stay cheap.
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface, AttentionMaskInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import sdpa_mask

NAME = "specula_cpu"
# Up to this many query positions (decoding, verifying drafts) are computed one position at a time,
# in attention modules marked with this attribute (use_cpu_attention).
ROW_BY_ROW_QUERIES = 32
ROW_BY_ROW = "specula_row_by_row"


def float32_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' SDPA attention computed in float32; the output in the query's dtype.

    A few query positions are computed one at a time, each over exactly the keys it sees: the
    same call, on the same numbers, as decoding that position alone. So a verify of k drafts gives
    bit for bit the attention outputs of k one-token steps, and the greedy tokens cannot differ
    from plain decoding through attention (SDPA over several queries rounds differently)."""
    out_dtype = query.dtype
    if attention_mask is not None and attention_mask.is_floating_point():
        attention_mask = attention_mask.float()  # an additive mask must match the query's dtype
    query, key, value = query.float(), key.float(), value.float()
    n_queries = query.shape[2]
    row_by_row = getattr(module, ROW_BY_ROW, False) and query.shape[0] == 1 and n_queries <= ROW_BY_ROW_QUERIES
    ranges = _visible_ranges(attention_mask, n_queries, key.shape[2]) if row_by_row else None
    if ranges is None:  # prompts, batches, masks that are not one range per row
        out, weights = sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
        return out.to(out_dtype), weights
    rows = [sdpa_attention_forward(module, query[:, :, i : i + 1], key[:, :, start:stop], value[:, :, start:stop],
                                   None, **kwargs)[0]
            for i, (start, stop) in enumerate(ranges)]
    out = rows[0] if len(rows) == 1 else torch.cat(rows, dim=1)  # [1, M, H, D]
    return out.to(out_dtype), None


def _visible_ranges(mask: torch.Tensor | None, n_queries: int, n_keys: int) -> list[tuple[int, int]] | None:
    """The keys each query position sees, as one range [start, stop) per position; None when some
    position's keys are not one range (or the mask is not a plain boolean one)."""
    if mask is None:  # causal, the new positions being the last keys
        return [(0, n_keys - n_queries + i + 1) for i in range(n_queries)]
    if mask.dtype != torch.bool or mask.dim() != 4 or mask.shape[:2] != (1, 1) or mask.shape[2] != n_queries:
        return None
    rows = mask[0, 0]
    positions = torch.arange(rows.shape[-1], device=rows.device)
    start = torch.where(rows, positions, rows.shape[-1]).amin(-1)
    stop = torch.where(rows, positions, -1).amax(-1) + 1
    if bool((stop <= start).any()) or not torch.equal(stop - start, rows.sum(-1)):
        return None
    return list(zip(start.tolist(), stop.tolist()))


AttentionInterface.register(NAME, float32_attention)
AttentionMaskInterface.register(NAME, sdpa_mask)  # the masks SDPA would get


def uses_cpu_attention(model: torch.nn.Module) -> bool:
    return getattr(getattr(model, "config", None), "_attn_implementation", None) == NAME


def use_cpu_attention(model: torch.nn.Module, row_by_row: bool) -> bool:
    """Switch a loaded model from SDPA to this; False (unchanged) for any other implementation.
    row_by_row: verify one position at a time, worth it where the rest of the model computes
    each row as decoding does (int4 loads); elsewhere one batched call is cheaper."""
    config = getattr(model, "config", None)
    if config is None or getattr(config, "_attn_implementation", None) != "sdpa":
        return False
    model.set_attn_implementation(NAME)
    for module in model.modules():
        if hasattr(module, "q_proj"):
            setattr(module, ROW_BY_ROW, row_by_row)
    return True
