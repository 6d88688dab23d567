"""`specula bench-gpu`: what our speculative-decoding loop costs on a GPU, without model files.

Random-weight Llama-shaped models (a Llama-3.1-8B-shaped main, a Llama-3.2-1B-shaped draft; or
tiny ones of the same structure for CPU tests) are built directly on the device, and we measure:

1. the verify cost: one main-model forward over k+1 new tokens after the prompt, for
   k = 0..16, against k = 0 (a decode step). Speculation pays only if this ratio stays small;
2. plain greedy decoding (no drafter), the baseline;
3. the main model drafting for itself (at fixed lengths 4 and 16): the loop's overhead and the
   verify cost under perfect acceptance. Perfect in float32 only: in bf16 or f16 a GPU's products
   over k+1 tokens round differently from one-token steps, and random weights' logits are so
   nearly tied that tokens flip (an H200: 69% accepted in bf16, 100% and identical in float32);
4. a separate 1B-shaped random draft and the main model's own first 2 layers (weights shared, no
   extra memory), both with acceptance near 0 on random weights: what a useless draft costs,
   with the adaptive schedule and with a fixed length 4.

Tokens/s are decode rates (after the first token, which comes from the prompt pass). Every
drafting row uses draft_p_min 0: random weights are never confident, and the confidence gate
would otherwise turn drafting off and hide the cost being measured.
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import statistics
import time
from dataclasses import asdict, dataclass

import torch
import transformers
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedModel, PreTrainedTokenizerFast
from transformers.initialization import no_init_weights

from app.engine.loop.detok import IncrementalDetokenizer
from app.engine.backends.torch.device import DTYPES
from app.engine.drafting.drafters import Drafter, ModelDrafter
from app.engine.errors import DeviceError, SpeculaError
from app.engine.events import DoneEvent, RunSummary
from app.engine.backends.torch.kv import KVModel
from app.engine.loop.sampling import SamplingParams
from app.engine.loop.speculative import DecodeSettings, generate

log = logging.getLogger(__name__)

_LLAMA = dict(rope_theta=500000.0, rms_norm_eps=1e-5, max_position_embeddings=131072)
# (main, draft) shapes: Llama-3.1-8B and Llama-3.2-1B, or the same structure scaled down.
SHAPES = {
    "full": (dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                  intermediate_size=14336, vocab_size=128256),
             dict(hidden_size=2048, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                  intermediate_size=8192, vocab_size=128256, tie_word_embeddings=True)),
    "tiny": (dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                  intermediate_size=128, vocab_size=512),
             dict(hidden_size=64, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                  intermediate_size=128, vocab_size=512, tie_word_embeddings=True)),
}
VERIFY_KS = (0, 1, 2, 4, 8, 16)
SHARED_LAYERS = 2  # the "truncated main" draft: the main model's first layers
GREEDY = SamplingParams(temperature=0.0)


@dataclass
class VerifyRow:
    k: int
    n_tokens: int
    ms: float
    ratio: float  # to k = 0


@dataclass
class GenRow:
    config: str
    kind: str  # plain | self | small | shallow
    n_predicted: int
    seconds: float  # wall time of the whole generate(), prompt included
    tokens_per_s: float  # decode rate, after the first token
    speedup: float  # tokens_per_s over plain's
    n_drafted: int
    n_accepted: int
    accept_rate: float | None
    identical: bool  # same tokens as plain decoding
    tokens: list[int]


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def resolve_device(name: str) -> str:
    """auto -> cuda when available, else cpu; cuda without CUDA is a one-line error."""
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise DeviceError("--device cuda was asked for but torch sees no CUDA device "
                          f"(torch {torch.__version__})")
    return name


def llama_config(shape: dict, **overrides) -> LlamaConfig:
    return LlamaConfig(**{**_LLAMA, **shape, "eos_token_id": shape["vocab_size"] - 1, **overrides})


def build_model(config: LlamaConfig, dtype: torch.dtype, device: str) -> PreTrainedModel:
    """A random-weight model made on the device itself: no CPU copy, no slow default init."""
    with torch.device(device), no_init_weights():  # as the loader builds models
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.tie_weights()  # skipped with the init under no_init_weights
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                torch.nn.init.normal_(p, std=0.02)
            else:
                p.fill_(1.0)  # RMSNorm gains: 1, as trained models have them roughly
    return model.eval()


def shallow_model(main: PreTrainedModel, shape: dict, n_layers: int) -> PreTrainedModel:
    """A model of the main model's first n_layers, its embedding, final norm and head, all shared."""
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(llama_config(shape, num_hidden_layers=n_layers), dtype=main.dtype)
    model.model.embed_tokens = main.model.embed_tokens
    model.model.layers = torch.nn.ModuleList(main.model.layers[:n_layers])
    model.model.norm = main.model.norm
    model.model.rotary_emb = main.model.rotary_emb
    model.lm_head = main.lm_head
    left = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if left:
        raise SpeculaError(f"the {n_layers}-layer draft still has meta tensors: {', '.join(left)}")
    return model.eval()


def make_tokenizer(vocab_size: int) -> PreTrainedTokenizerFast:
    """A real tokenizer whose token i is the word "t{i}"; generate() only detokenizes with it."""
    inner = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab_size)}, unk_token="t0"))
    inner.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=inner, eos_token=f"t{vocab_size - 1}")
    ids = [5, 17, 3, 9]
    detok = IncrementalDetokenizer(tokenizer)
    text = "".join(detok.push([i]) for i in ids) + detok.flush()
    if text.split() != [f"t{i}" for i in ids]:
        raise SpeculaError(f"the word-level tokenizer detokenizes {ids} as {text!r}")
    return tokenizer


def verify_costs(main_kv: KVModel, prompt: list[int], extra: list[int], device: str, repeats: int) -> list[VerifyRow]:
    """Median time of one main forward over k+1 new tokens after the prompt, per k."""
    main_kv.reset()
    main_kv.feed(prompt, 1)
    rows: list[VerifyRow] = []
    for k in VERIFY_KS:
        times = []
        for i in range(repeats + 1):  # the first is a warm-up
            _sync(device)
            t0 = time.perf_counter()
            main_kv.feed(extra[: k + 1], k + 1)
            _sync(device)
            if i:
                times.append(time.perf_counter() - t0)
            main_kv.rewind(len(prompt))
        ms = 1000 * statistics.median(times)
        rows.append(VerifyRow(k, k + 1, ms, ms / rows[0].ms if rows else 1.0))
        log.info("verify k=%d: %.2f ms", k, ms)
    return rows


def _settings(n: int, draft_max: int = 16, adaptive: bool = True) -> DecodeSettings:
    # No stop tokens: random weights may produce the EOS id, and every row should run n tokens.
    return DecodeSettings(max_new_tokens=n, draft_max=draft_max, draft_p_min=0.0, sampling=GREEDY,
                          stop_token_ids=(), adaptive_draft=adaptive)


def configurations(main_kv: KVModel, draft: PreTrainedModel, shallow: PreTrainedModel,
                   n: int) -> list[tuple[str, str, Drafter | None, DecodeSettings]]:
    """(row name, kind, drafter, settings) for every measured configuration, plain first. The
    drafters have caches of their own, also draft=main (a second KVModel of the same model)."""
    n_ctx, vocab = main_kv.n_ctx, main_kv.vocab_size
    same = ModelDrafter(KVModel(main_kv.model, n_ctx), vocab, name="draft=main")
    small = ModelDrafter(KVModel(draft, n_ctx), vocab, name="draft-1B")
    first = ModelDrafter(KVModel(shallow, n_ctx), vocab, name=f"main[:{SHARED_LAYERS}]")
    return [
        ("plain", "plain", None, _settings(n)),
        ("draft=main fixed 4", "self", same, _settings(n, 4, False)),
        ("draft=main fixed 16", "self", same, _settings(n, 16, False)),
        ("draft-1B adaptive", "small", small, _settings(n)),
        ("draft-1B fixed 4", "small", small, _settings(n, 4, False)),
        (f"main[:{SHARED_LAYERS}] adaptive", "shallow", first, _settings(n)),
        (f"main[:{SHARED_LAYERS}] fixed 4", "shallow", first, _settings(n, 4, False)),
    ]


def run_once(main_kv: KVModel, tokenizer, prompt: list[int], drafter: Drafter | None,
             settings: DecodeSettings, device: str) -> tuple[RunSummary, float]:
    """One generation from empty caches (prompt included in the wall time)."""
    main_kv.reset()
    if isinstance(drafter, ModelDrafter):
        drafter.draft.reset()
    _sync(device)
    t0 = time.perf_counter()
    summary = next(e.summary for e in generate(main_kv, tokenizer, prompt, drafter, settings)
                   if isinstance(e, DoneEvent))
    _sync(device)
    return summary, time.perf_counter() - t0


def measure(main_kv: KVModel, tokenizer, prompt: list[int], configs, device: str) -> list[GenRow]:
    rows: list[GenRow] = []
    for name, kind, drafter, settings in configs:
        warm = DecodeSettings(**{**settings.__dict__, "max_new_tokens": min(8, settings.max_new_tokens)})
        run_once(main_kv, tokenizer, prompt, drafter, warm, device)
        summary, seconds = run_once(main_kv, tokenizer, prompt, drafter, settings, device)
        plain = rows[0] if rows else None
        tps = summary.decode_tps
        rows.append(GenRow(
            config=name, kind=kind, n_predicted=summary.n_predicted, seconds=seconds, tokens_per_s=tps,
            speedup=tps / plain.tokens_per_s if plain and plain.tokens_per_s else 1.0,
            n_drafted=summary.n_drafted, n_accepted=summary.n_accepted,
            accept_rate=summary.accept_rate if drafter is not None else None,
            identical=plain is None or list(summary.tokens) == plain.tokens, tokens=list(summary.tokens),
        ))
        log.info("%s: %.2f tok/s, %d/%d accepted", name, tps, summary.n_accepted, summary.n_drafted)
    return rows


def _meta(args: argparse.Namespace, device: str, dtype: torch.dtype, build_s: float) -> dict:
    cuda = device == "cuda"
    return {
        "device": device,
        "device_name": torch.cuda.get_device_name() if cuda else (platform.processor() or platform.machine()),
        "dtype": str(dtype).removeprefix("torch."),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "shapes": args.shapes,
        "n_predict": args.n_predict,
        "prompt_tokens": args.prompt_tokens,
        "build_s": build_s,
        "peak_gpu_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
    }


def print_report(meta: dict, verify: list[VerifyRow], rows: list[GenRow]) -> None:
    """The command's only output: a header, the verify-cost table and the generation table."""
    peak = f", peak GPU memory {meta['peak_gpu_gib']:.1f} GiB" if meta["peak_gpu_gib"] is not None else ""
    print(f"# bench-gpu: {meta['shapes']} shapes on {meta['device']} ({meta['device_name']}), {meta['dtype']}, "
          f"torch {meta['torch']}, models built in {meta['build_s']:.1f} s{peak}")
    print(f"# greedy, prompt {meta['prompt_tokens']} tokens, n={meta['n_predict']}; tok/s = decode rate")
    print(f"\n{'verify k':>8} {'tokens':>6} {'ms/forward':>10} {'vs k=0':>7}")
    for v in verify:
        print(f"{v.k:>8} {v.n_tokens:>6} {v.ms:>10.2f} {v.ratio:>6.2f}x")
    header = (f"{'config':<22} {'tokens':>6} {'tok/s':>8} {'speedup':>8} {'drafted':>7} "
              f"{'accepted':>8} {'accept':>7}  same")
    print(f"\n{header}\n{'-' * len(header)}")
    for r in rows:
        accept = f"{100 * r.accept_rate:6.1f}%" if r.accept_rate is not None else f"{'-':>7}"
        print(f"{r.config[:22]:<22} {r.n_predicted:>6} {r.tokens_per_s:>8.2f} {r.speedup:>7.2f}x "
              f"{r.n_drafted:>7} {r.n_accepted:>8} {accept}  {'yes' if r.identical else 'NO'}")
    if meta["dtype"] != "float32":
        print(f"# same = plain decoding's tokens; in {meta['dtype']} a verify rounds differently from one-token "
              "steps and random weights' near-ties flip tokens (float32: identical)")


def cmd_bench_gpu(args: argparse.Namespace) -> int:
    if args.n_predict < 1 or args.prompt_tokens < 1:
        raise SpeculaError("-n and --prompt-tokens must be at least 1")
    device, dtype = resolve_device(args.device), DTYPES[args.dtype]
    main_shape, draft_shape = SHAPES[args.shapes]
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    torch.manual_seed(0)
    t0 = time.perf_counter()
    main = build_model(llama_config(main_shape), dtype, device)
    draft = build_model(llama_config(draft_shape), dtype, device)
    shallow = shallow_model(main, main_shape, SHARED_LAYERS)
    _sync(device)
    build_s = time.perf_counter() - t0
    log.info("models built in %.1f s", build_s)
    tokenizer = make_tokenizer(main_shape["vocab_size"])
    gen = torch.Generator().manual_seed(1234)
    ids = torch.randint(0, main_shape["vocab_size"] - 1, (args.prompt_tokens + VERIFY_KS[-1] + 1,), generator=gen).tolist()
    prompt, extra = ids[: args.prompt_tokens], ids[args.prompt_tokens:]
    n_ctx = args.prompt_tokens + max(args.n_predict, VERIFY_KS[-1]) + 32
    main_kv = KVModel(main, n_ctx)
    verify = verify_costs(main_kv, prompt, extra, device, args.repeats)
    rows = measure(main_kv, tokenizer, prompt, configurations(main_kv, draft, shallow, args.n_predict), device)
    meta = _meta(args, device, dtype, build_s)
    print_report(meta, verify, rows)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump({"meta": meta, "verify": [asdict(v) for v in verify], "rows": [asdict(r) for r in rows]},
                      handle, indent=2)
    return 0
