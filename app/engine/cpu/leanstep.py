"""The decoder layers of a few new tokens, run as plain functions over the model's own modules.

Decoding and verifying feed 1 to 32 tokens at a time. For those, transformers' module tree costs
more than its arithmetic on a 2-core CPU: per layer, a dozen module calls, kwargs plumbing, mask
building and norms written as ten small ops each. Here the same computation (the same weights,
projections, rotary tables, cache and float32 attention) runs as a few functions, which measured
about 10% faster per decoded token on Gemma 3 270M. Prompts keep transformers' forward.

Supported: Llama-like models (llama, qwen2) without sliding windows, and Gemma 3's text model.
LeanStack.for_model returns None for anything else, and the model's own forward is used.

Every position attends to exactly the keys it sees; on int4 loads one position at a time, as in
app.engine.cpu.attention, so that a verify of k drafts computes bit for bit what k one-token
steps do.

Each layer's q, k and v projections run as one stacked product, and so do the MLP's
gate and up (app.engine.cpu.fused); q and k, then side by side, get Gemma's head norms and the
rotary embedding in one call each. Every value is still the one transformers' modules compute (the
rotation is written as a roll with a signed sine, the same products and sums): together about
1.29x faster per decoded token on SmolLM2, 1.06x on Gemma 3 270M (AVX2, 2 threads).

A step then still spent much of its time in Python: about 600 nn.Module attribute lookups per
SmolLM2 token and a dozen per int4 product. Each layer's weights, products and settings are now
read once into plain attributes (_Layer), and decode-sized rows go straight to the int4 kernel
(Int4Linear.rows_function): 1.17x per decoded token on SmolLM2, 1.05x on Gemma 3 270M, the same
bits (step-interleaved runs, AVX2).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from app.engine.cpu.attention import ROW_BY_ROW, ROW_BY_ROW_QUERIES, uses_cpu_attention
from app.engine.cpu.fused import stack
from app.engine.cpu.quantlinear import Int4Linear

MAX_TOKENS = ROW_BY_ROW_QUERIES
_LLAMA_LIKE = {"llama", "qwen2"}


class LeanStack:
    """hidden(new_ids, cache, start) -> the final-normed hidden states [M, D] of the new tokens."""

    def __init__(self, base: torch.nn.Module, gemma: bool, stacked: bool = True) -> None:
        """stacked=False keeps every matrix its own product (tests compare the two)."""
        self.base, self.gemma = base, gemma
        self.config = base.config
        self.layer_types = list(getattr(self.config, "layer_types", None) or ["full_attention"] * len(base.layers))
        window = getattr(self.config, "sliding_window", None)
        norm = _GemmaNorm.of if gemma else _LlamaNorm.of
        self._final_norm = norm(base.norm)
        self._layers = [_Layer(layer, norm, gemma, stacked, window if kind == "sliding_attention" else None)
                        for layer, kind in zip(base.layers, self.layer_types)]

    @classmethod
    def for_model(cls, model: torch.nn.Module) -> "LeanStack | None":
        """The model's stack, built once per model (its stacked products are shared by every
        KV cache over it), or None where the model's own forward must be used."""
        if not hasattr(model, "_specula_lean_stack"):
            model._specula_lean_stack = cls._build(model)
        return model._specula_lean_stack

    @classmethod
    def _build(cls, model: torch.nn.Module) -> "LeanStack | None":
        config = getattr(model, "config", None)
        base = getattr(model, getattr(model, "base_model_prefix", "model"), None)
        if config is None or base is None or not uses_cpu_attention(model):
            return None
        if config.model_type in _LLAMA_LIKE and not getattr(config, "use_sliding_window", False):
            return cls(base, gemma=False)
        if config.model_type == "gemma3_text" and getattr(config, "attn_logit_softcapping", None) is None:
            return cls(base, gemma=True)
        return None

    @property
    def all_stacked(self) -> bool:
        return all(layer.qkv is not None and layer.gate_up is not None for layer in self._layers)

    @torch.inference_mode()
    def hidden(self, new_ids: list[int], cache, start: int) -> torch.Tensor:
        ids = torch.tensor([new_ids], dtype=torch.long)
        x = self.base.embed_tokens(ids)[0]  # [M, D]; Gemma's embedding scales itself
        positions = torch.arange(start, start + len(new_ids))[None]
        rotary = {kind: self._rotary(x, positions, kind) for kind in set(self.layer_types)}
        for index, (layer, kind) in enumerate(zip(self._layers, self.layer_types)):
            x = layer.forward(x, index, rotary[kind], cache, start)
        return self._final_norm(x)

    def _rotary(self, x: torch.Tensor, positions: torch.Tensor, kind: str) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and the signed sin of _rope, [M, 1, head_dim] (broadcast over heads)."""
        cos, sin = (self.base.rotary_emb(x, positions, kind) if self.gemma else self.base.rotary_emb(x, positions))
        half = sin.shape[-1] // 2
        sin = torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)
        return cos[0][:, None, :], sin[0][:, None, :]


class _Layer:
    """One decoder layer, its weights and settings read once from transformers' modules into plain
    attributes: a step then looks up no module attribute (each costs about a microsecond through
    nn.Module, and a step of SmolLM2 made about 600) and calls the products directly.

    Each layer's q, k and v projections run as one stacked product where they can, and so do the
    MLP's gate and up (app.engine.cpu.fused)."""

    def __init__(self, layer: torch.nn.Module, norm, gemma: bool, stacked: bool, window: int | None) -> None:
        attn, mlp = layer.self_attn, layer.mlp
        self.gemma, self.window = gemma, window
        self.head_dim, self.scaling = attn.head_dim, attn.scaling
        self.row_by_row = bool(getattr(attn, ROW_BY_ROW, False))
        self.n_q, self.n_kv = attn.q_proj.out_features // attn.head_dim, attn.k_proj.out_features // attn.head_dim
        qkv = stack([attn.q_proj, attn.k_proj, attn.v_proj]) if stacked else None
        gate_up = stack([mlp.gate_proj, mlp.up_proj]) if stacked else None
        # Products are taken after stacking, which gives the separate modules views of the stack.
        self.qkv, self.gate_up = _product(qkv), _product(gate_up)
        self.q, self.k, self.v = _product(attn.q_proj), _product(attn.k_proj), _product(attn.v_proj)
        self.o, self.down = _product(attn.o_proj), _product(mlp.down_proj)
        self.gate, self.up = _product(mlp.gate_proj), _product(mlp.up_proj)
        self.gate_up_split = [mlp.gate_proj.out_features, mlp.up_proj.out_features]
        self.act = mlp.act_fn.forward if isinstance(mlp.act_fn, torch.nn.Module) else mlp.act_fn
        self.input_norm = norm(layer.input_layernorm)
        self.post_attention_norm = norm(layer.post_attention_layernorm)
        if gemma:
            self.pre_feedforward_norm = norm(layer.pre_feedforward_layernorm)
            self.post_feedforward_norm = norm(layer.post_feedforward_layernorm)
            self.q_norm, self.k_norm = norm(attn.q_norm), norm(attn.k_norm)
        # Gemma's q and k head norms, stacked like q and k (one norm over both) where their
        # epsilons agree; Llama-like q and k are rotated together without norms.
        self.qk_norm = (_GemmaNorm(torch.cat([self.q_norm.scale.expand(self.n_q, -1),
                                              self.k_norm.scale.expand(self.n_kv, -1)]), self.q_norm.eps)
                        if gemma and self.qkv is not None and self.q_norm.eps == self.k_norm.eps else None)

    def forward(self, x: torch.Tensor, index: int, rotary, cache, start: int) -> torch.Tensor:
        if x.shape[0] == 1 and self.qkv is not None and (not self.gemma or self.qk_norm is not None):
            attention = self.decoding_attention(self.input_norm(x), index, rotary, cache, start)
        else:
            attention = self.attention(self.input_norm(x), index, rotary, cache, start)
        if self.gemma:
            x = x + self.post_attention_norm(attention)
            return x + self.post_feedforward_norm(self.mlp(self.pre_feedforward_norm(x)))
        x = x + attention
        return x + self.mlp(self.post_attention_norm(x))

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate_up is None:
            return self.down(self.act(self.gate(x)) * self.up(x))
        gate_up, n_gate = self.gate_up(x), self.gate_up_split[0]  # slices: Tensor.split costs more in Python
        return self.down(self.act(gate_up[:, :n_gate]) * gate_up[:, n_gate:])

    def qk_v(self, x: torch.Tensor, rotary) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(q, k, v) of the new tokens, q and k normed (Gemma) and rotated:
        [M, heads, head_dim] each."""
        n_tokens, n_q, n_kv = x.shape[0], self.n_q, self.n_kv
        cos, sin = rotary
        if self.qkv is not None:
            states = self.qkv(x).view(n_tokens, n_q + 2 * n_kv, self.head_dim)
            qk, v = states[:, : n_q + n_kv], states[:, n_q + n_kv :]
            if not self.gemma or self.qk_norm is not None:  # q and k normed and rotated together
                if self.gemma:
                    qk = self.qk_norm(qk)
                qk = _rope(qk, cos, sin)
                return qk[:, :n_q], qk[:, n_q:], v
            q, k = qk[:, :n_q], qk[:, n_q:]  # Gemma head norms of different epsilons: each its own
        else:
            q = self.q(x).view(n_tokens, -1, self.head_dim)
            k = self.k(x).view(n_tokens, -1, self.head_dim)
            v = self.v(x).view(n_tokens, -1, self.head_dim)
        if self.gemma:
            q, k = self.q_norm(q), self.k_norm(k)
        return _rope(q, cos, sin), _rope(k, cos, sin), v

    def decoding_attention(self, x: torch.Tensor, index: int, rotary, cache, start: int) -> torch.Tensor:
        """attention for one token where q, k and v are one stacked product and q and k are
        normed (Gemma) and rotated together: the same ops, in fewer Python steps (about 2% of a
        SmolLM2 step, Zen 3, AVX2)."""
        n_q, head_dim = self.n_q, self.head_dim
        states = self.qkv(x).view(1, -1, head_dim)
        qk, v = states[:, : n_q + self.n_kv], states[:, n_q + self.n_kv :]
        qk = _rope(self.qk_norm(qk) if self.gemma else qk, *rotary)
        keys, values = cache.update(qk[:, n_q:].transpose(0, 1)[None], v.transpose(0, 1)[None], index)
        return self.attend_one(qk[:, :n_q], keys, values, index, start, x.dtype)

    def attend_one(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, index: int, start: int,
                   dtype: torch.dtype) -> torch.Tensor:
        """o(attention of one query [1, n_q, head_dim] at position start over the window's keys),
        in dtype. KVModel's cache holds float32 (app.engine.cpu.kvbuffer); it returns its last
        keys, the last of them at start."""
        first = start + 1 - keys.shape[2]
        lo = (0 if self.window is None else max(0, start - self.window + 1)) - first
        if lo < 0:  # never with transformers' layers as KVModel sets them up
            raise RuntimeError(f"layer {index}: the cache holds fewer keys than position {start} attends to")
        if lo:
            keys, values = keys[:, :, lo:], values[:, :, lo:]
        out = F.scaled_dot_product_attention(q.float().view(1, self.n_q, 1, self.head_dim), keys.float(),
                                             values.float(), scale=self.scaling, enable_gqa=self.n_q != self.n_kv)
        return self.o(out.reshape(1, -1).to(dtype))

    def attention(self, x: torch.Tensor, index: int, rotary, cache, start: int) -> torch.Tensor:
        n_tokens = x.shape[0]
        q, k, v = self.qk_v(x, rotary)
        keys, values = cache.update(k.transpose(0, 1)[None], v.transpose(0, 1)[None], index)
        if n_tokens == 1:  # unstacked layers' decoding step
            return self.attend_one(q, keys, values, index, start, x.dtype)
        keys, values = keys.float(), values.float()  # no copies: KVModel's cache holds float32
        # The cache returns its last keys; the first of them is at this absolute position.
        first = start + n_tokens - keys.shape[2]
        ranges = []
        for i in range(n_tokens):
            position = start + i
            lo = 0 if self.window is None else max(0, position - self.window + 1)
            ranges.append((lo - first, position + 1 - first))
        if ranges[0][0] < 0:  # never with transformers' layers as KVModel sets them up
            raise RuntimeError(f"layer {index}: the cache holds fewer keys than position {start} attends to")
        gqa = self.n_q != self.n_kv
        query = q.float().transpose(0, 1)[None]  # [1, H, M, head_dim]
        if self.row_by_row:
            out = torch.cat([F.scaled_dot_product_attention(query[:, :, i : i + 1], keys[:, :, a:b], values[:, :, a:b],
                                                            scale=self.scaling, enable_gqa=gqa)
                             for i, (a, b) in enumerate(ranges)], dim=2)  # [1, H, M, head_dim]
        else:
            mask = torch.zeros(n_tokens, keys.shape[2], dtype=torch.bool)
            for i, (a, b) in enumerate(ranges):
                mask[i, a:b] = True
            out = F.scaled_dot_product_attention(query, keys, values, attn_mask=mask[None, None], scale=self.scaling,
                                                 enable_gqa=gqa)
        return self.o(out[0].transpose(0, 1).reshape(n_tokens, -1).to(x.dtype))


def _product(module: torch.nn.Module | None):
    """x -> module(x) for the 2-D bf16 rows of a step, without nn.Module's call machinery or
    forward's checks: torch's int4 kernel on the packed passes (bound to the module's buffers as
    they are now: take products after stacking), or F.linear on the bf16 weight (the ops
    module.forward runs); None for None."""
    if module is None:
        return None
    if isinstance(module, Int4Linear):
        return module.rows_function()
    if type(module) is torch.nn.Linear:
        return functools.partial(F.linear, weight=module.weight, bias=module.bias)
    return module.forward


def _inverse_rms(xf: torch.Tensor, width: torch.Tensor, eps: torch.Tensor) -> torch.Tensor:
    """rsqrt(mean(xf^2) + eps) over the last dimension, with the bits of transformers' norms
    (torch's float32 mean is this sum divided by the width; tests/test_leanstep.py compares the
    norms with transformers' modules). The width and eps come as one-element float32 tensors:
    with a Python number (mean's own division included) torch makes a tensor of it and converts
    that to float32 at every op, which cost 12 of a norm's 47 us (Zen 3, AVX2, one row of
    SmolLM2; 61 norms a step)."""
    return xf.square().sum(-1, keepdim=True).div_(width).add_(eps).rsqrt_()


def _scalars(width: int, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.tensor(float(width), dtype=torch.float32), torch.tensor(eps, dtype=torch.float32)


class _GemmaNorm:
    """Gemma3RMSNorm over the last dimension: normalized and scaled by (1 + w) in float32, then
    rounded; scale (1 + w) computed once, broadcast to the input."""

    def __init__(self, scale: torch.Tensor, eps: float) -> None:
        self.scale, self.eps = scale, eps
        self._width, self._eps = _scalars(scale.shape[-1], eps)

    @classmethod
    def of(cls, norm: torch.nn.Module) -> "_GemmaNorm":
        return cls(1.0 + norm.weight.float(), norm.eps)

    def __call__(self, t: torch.Tensor) -> torch.Tensor:
        tf = t.float()
        tf = tf * _inverse_rms(tf, self._width, self._eps)
        return (tf * self.scale).to(t.dtype)


class _LlamaNorm:
    """LlamaRMSNorm (and Qwen2's): normalized in float32, rounded, then scaled."""

    def __init__(self, weight: torch.Tensor, eps: float) -> None:
        self.weight, self.eps = weight, eps
        self._width, self._eps = _scalars(weight.shape[-1], eps)

    @classmethod
    def of(cls, norm: torch.nn.Module) -> "_LlamaNorm":
        return cls(norm.weight, norm.variance_epsilon)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * _inverse_rms(xf, self._width, self._eps)
        return self.weight * xf.to(x.dtype)


def _rope(t: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """t * cos + rotate_half(t) * sin, transformers' rotation: rotate_half(t) * sin is
    roll(t) * (the sin with its first half negated), product for product."""
    return t * cos + t.roll(t.shape[-1] // 2, -1) * signed_sin
