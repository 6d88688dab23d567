"""Tiny, real GGUF language models for tests.

`write_tiny_gguf` writes a random Llama or Qwen2 model of a few hundred kilobytes the way llama.cpp's
`convert_hf_to_gguf.py` would (permuted llama q/k, byte-level BPE tokenizer with merges, ChatML
template), and `build_hf_model` returns the in-memory transformers model it was written from, so a
test can compare what our loader makes of the file with the model that should come out of it.

    spec = TinySpec(arch="llama", qtype="Q8_0", seed=1)
    path = write_tiny_gguf(tmp_path / "main.gguf", spec)
    model = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file="main.gguf", dtype=torch.float32)

Tokenizer "a" (the default, shared by every spec that keeps it, so any two such files form a valid
main/draft pair):
- ids 0..255 are the 256 bytes in byte order, spelled with GPT-2's byte-to-unicode map;
- then `N_MERGES` merges learned by plain BPE from `_CORPUS` (deterministic, no library training);
- then `<|endoftext|>` (BOS_ID), `<|im_start|>`, `<|im_end|>` (EOS_ID), all CONTROL tokens.
EOS is `<|im_end|>` because that is where a ChatML assistant turn ends; BOS is never added
(`add_bos_token` false), as for Qwen2 and SmolLM2.

Tokenizer "b" (`TinySpec(vocab="b")`) is another vocabulary over the same bytes, for text-level
drafting: the three special tokens first (ids 0, 1, 2), then the bytes, then `N_MERGES_B` merges
learned from the lower-cased corpus. It tokenizes any text (byte fallback), into other tokens.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
import torch
import transformers
from tokenizers import pre_tokenizers

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
N_MERGES = 300
VOCAB_SIZE = 256 + N_MERGES + len(SPECIAL_TOKENS)
BOS_ID = 256 + N_MERGES  # <|endoftext|>
IM_START_ID = BOS_ID + 1
EOS_ID = BOS_ID + 2  # <|im_end|>
N_MERGES_B = 200
VOCAB_SIZE_B = 256 + N_MERGES_B + len(SPECIAL_TOKENS)

# Values stored as float32 in the file: the reference config uses the same float32 values, so the
# config transformers rebuilds from the file is identical to it, not 1e-5 versus 9.99999974e-06.
RMS_EPS = float(np.float32(1e-5))
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    # Small, so the scaling changes several of the 8 frequencies of a 16-wide head.
    "original_max_position_embeddings": 64,
}
LLAMA3_THETA = 500000.0

_QTYPES = {
    "F32": (gguf.GGMLQuantizationType.F32, gguf.LlamaFileType.ALL_F32),
    "F16": (gguf.GGMLQuantizationType.F16, gguf.LlamaFileType.MOSTLY_F16),
    "Q8_0": (gguf.GGMLQuantizationType.Q8_0, gguf.LlamaFileType.MOSTLY_Q8_0),
    "Q4_0": (gguf.GGMLQuantizationType.Q4_0, gguf.LlamaFileType.MOSTLY_Q4_0),
    "Q4_1": (gguf.GGMLQuantizationType.Q4_1, gguf.LlamaFileType.MOSTLY_Q4_1),
    "Q5_0": (gguf.GGMLQuantizationType.Q5_0, gguf.LlamaFileType.MOSTLY_Q5_0),
}


@dataclass(frozen=True)
class TinySpec:
    arch: str = "llama"  # "llama" or "qwen2"
    qtype: str = "F32"  # a _QTYPES key (F32, F16, Q8_0, Q4_0, Q4_1, Q5_0) for the 2-D matrices;
    # norms and biases stay F32
    seed: int = 0
    n_layers: int = 2
    hidden: int = 64
    n_heads: int = 4
    n_kv_heads: int = 2
    intermediate: int = 128
    context_length: int = 512
    rope_theta: float = 10000.0  # replaced by LLAMA3_THETA when llama3_rope
    llama3_rope: bool = False  # Llama 3.1 rope scaling (LLAMA3_ROPE), written as rope_freqs.weight
    chat_template: str | None = CHATML  # None writes no template
    logit_scale: float = 8.0  # about the standard deviation of the logits
    # GGUF tensor-name endings written F16 whatever qtype says, as mixed files keep some matrices
    # in a type the int4 kernel cannot run (e.g. ("ffn_down.weight",)).
    f16_matrices: tuple[str, ...] = ()
    vocab: str = "a"  # the tokenizer: "a" or "b" (see the module's docstring)

    def qtype_of(self, gguf_name: str) -> str:
        return "F16" if self.f16_matrices and gguf_name.endswith(self.f16_matrices) else self.qtype

    @property
    def head_dim(self) -> int:
        return self.hidden // self.n_heads

    @property
    def theta(self) -> float:
        return LLAMA3_THETA if self.llama3_rope else self.rope_theta


# ---------------------------------------------------------------------------------------------
# Tokenizer

_CORPUS = """\
The quick brown fox jumps over the lazy dog. The dog was not amused, and the fox ran away.
Hello world! This is a small model for tests. It is not trained, so what it says is noise,
but it says the same thing every time, and that is what a test of speculative decoding needs.
A draft model proposes a few tokens, and the main model checks all of them in one forward pass.
When the draft is right, we accept the tokens; when it is wrong, we keep the main model's token
and throw the rest away. The output is the same as plain greedy decoding, only faster.
You are a helpful assistant. The user asks a question and the assistant gives an answer.
What is the capital of France? The capital of France is Paris. What time is it now?
Please write a function that returns the sum of a list of numbers, and explain how it works.
Can you rename a variable in this code? Sure, here is the code with the new name.
There are many models in the world, and some of them are small while others are large.
We measure the time of each step and the number of tokens per second for each model.
The user can open a file, load a model, and start a new chat. The model is loaded from a file
on the disk, and the tokens are shown on the screen as soon as they are ready. If the model is
too large for the memory, the app says so before it starts to load it. The first time you run
the app, it will ask you where your models are. You can change this later in the settings.
This is the end of the text. Thank you for reading it, and have a nice day with your models.
There is a new version of the app: it is faster, and it uses less memory than the old one.
In this example, the function takes a string and returns a list of the words in the string.

def add(a, b):
    return a + b


def greet(name: str) -> str:
    \"\"\"Return a greeting for the user.\"\"\"
    return f"Hello, {name}!"


class Counter:
    def __init__(self, start: int = 0) -> None:
        self.count = start

    def increment(self) -> int:
        self.count += 1
        return self.count


for i in range(10):
    if i % 2 == 0:
        print(i, "is even")
    else:
        print(i, "is odd")

import numpy as np
import torch

def sum_list(numbers: list[int]) -> int:
    total = 0
    for number in numbers:
        total += number
    return total

x = [1, 2, 3, 4, 5]
y = {"key": "value", "name": "model", "tokens": 128}
result = sum_list(x)
print(f"The result is {result}")

def tokenize(text: str) -> list[str]:
    words = []
    for word in text.split():
        if word:
            words.append(word.lower())
    return words

class Model:
    def __init__(self, path: str, name: str = "tiny") -> None:
        self.path = path
        self.name = name
        self.tokens = []

    def generate(self, prompt: str, max_tokens: int = 32) -> str:
        tokens = tokenize(prompt)
        for _ in range(max_tokens):
            tokens.append(self.name)
        return " ".join(tokens)
while True:
    line = input()
    if not line:
        break
    print(line.strip().lower())
"""


@functools.lru_cache(maxsize=None)
def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's map from bytes to printable characters (the spelling of byte-level BPE tokens)."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars = printable[:]
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return {byte: chr(char) for byte, char in zip(printable, chars)}


@functools.lru_cache(maxsize=None)
def _train_vocab(vocab: str = "a") -> tuple[tuple[str, ...], tuple[int, ...], tuple[str, ...]]:
    if vocab not in ("a", "b"):
        raise ValueError(f"unknown tiny vocabulary {vocab!r}")
    corpus, n_merges = (_CORPUS, N_MERGES) if vocab == "a" else (_CORPUS.lower(), N_MERGES_B)
    # Split the corpus exactly as the tokenizer built from the file will (GPT-2's regex, then
    # byte-level spelling), so the merges apply to the same words at inference.
    splitter = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    word_counts: dict[tuple[str, ...], int] = {}
    for piece, _ in splitter.pre_tokenize_str(corpus):
        word = tuple(piece)
        word_counts[word] = word_counts.get(word, 0) + 1

    spelling = _bytes_to_unicode()
    tokens = [spelling[byte] for byte in range(256)]
    known = set(tokens)
    merges: list[str] = []
    words = list(word_counts.items())
    while len(merges) < n_merges:
        pairs: dict[tuple[str, str], int] = {}
        for word, count in words:
            for pair in zip(word, word[1:]):
                pairs[pair] = pairs.get(pair, 0) + count
        # Most frequent pair; ties broken by the pair itself so the result never depends on order.
        (left, right), count = min(pairs.items(), key=lambda item: (-item[1], item[0]))
        if count < 2:
            raise RuntimeError(f"corpus too small for {n_merges} merges (got {len(merges)})")
        merges.append(f"{left} {right}")
        if left + right not in known:
            known.add(left + right)
            tokens.append(left + right)
        words = [(_merge(word, left, right), count) for word, count in words]
    if len(tokens) != 256 + n_merges:
        raise RuntimeError("a merge produced an existing token; the fixed ids above would shift")
    normal, control = [int(gguf.TokenType.NORMAL)] * len(tokens), [int(gguf.TokenType.CONTROL)] * 3
    if vocab == "b":
        return tuple([*SPECIAL_TOKENS, *tokens]), tuple(control + normal), tuple(merges)
    return tuple([*tokens, *SPECIAL_TOKENS]), tuple(normal + control), tuple(merges)


def _merge(word: tuple[str, ...], left: str, right: str) -> tuple[str, ...]:
    out: list[str] = []
    i = 0
    while i < len(word):
        if i + 1 < len(word) and word[i] == left and word[i + 1] == right:
            out.append(left + right)
            i += 2
        else:
            out.append(word[i])
            i += 1
    return tuple(out)


def tiny_vocab(vocab: str = "a") -> tuple[list[str], list[int], list[str]]:
    """(tokens, token types, merges) of tiny tokenizer "a" (every spec's default) or "b"."""
    tokens, types, merges = _train_vocab(vocab)
    return list(tokens), list(types), list(merges)


def vocab_ids(vocab: str = "a") -> tuple[int, int, int]:
    """(vocabulary size, BOS id, EOS id) of tiny tokenizer "a" or "b"."""
    if vocab == "b":
        return VOCAB_SIZE_B, 0, 2
    return VOCAB_SIZE, BOS_ID, EOS_ID


# ---------------------------------------------------------------------------------------------
# Model


def _hf_config(spec: TinySpec) -> transformers.PreTrainedConfig:
    if spec.arch not in ("llama", "qwen2"):
        raise ValueError(f"unsupported arch {spec.arch!r}")
    if spec.qtype not in _QTYPES:
        raise ValueError(f"unsupported qtype {spec.qtype!r}")
    if spec.llama3_rope and spec.arch != "llama":
        raise ValueError("llama3_rope is for llama only")
    vocab_size, bos_id, eos_id = vocab_ids(spec.vocab)
    rope: dict = {"rope_type": "default", "rope_theta": spec.theta}
    if spec.llama3_rope:
        rope = {**LLAMA3_ROPE, "rope_theta": spec.theta}
    common = dict(
        vocab_size=vocab_size,
        hidden_size=spec.hidden,
        intermediate_size=spec.intermediate,
        num_hidden_layers=spec.n_layers,
        num_attention_heads=spec.n_heads,
        num_key_value_heads=spec.n_kv_heads,
        max_position_embeddings=spec.context_length,
        rms_norm_eps=RMS_EPS,
        rope_parameters=rope,
        tie_word_embeddings=False,
        bos_token_id=bos_id,
        eos_token_id=eos_id,
    )
    if spec.arch == "llama":
        return transformers.LlamaConfig(head_dim=spec.head_dim, **common)
    return transformers.Qwen2Config(**common)


def _round(array: np.ndarray, qtype: str) -> np.ndarray:
    """The values a matrix has once written as `qtype` and read back."""
    ggml_type = _QTYPES[qtype][0]
    return gguf.quants.dequantize(gguf.quants.quantize(array, ggml_type), ggml_type).reshape(array.shape)


def _random_weights(spec: TinySpec, shapes: dict[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
    # numpy's generator, not torch's init: the weights depend on the seed only, not on how a
    # transformers version initialises modules.
    rng = np.random.default_rng(spec.seed)
    out: dict[str, np.ndarray] = {}
    for name, shape in sorted(shapes.items()):
        if name.endswith("embed_tokens.weight"):
            std = 1.0  # unit-scale rows, so the residual stream starts at the scale of a layer's output
        elif name == "lm_head.weight":
            # After the final RMSNorm the hidden state has unit scale, so logits have std ≈
            # logit_scale: top-2 gaps of order 1 instead of 1e-3, and greedy never flips on noise.
            std = spec.logit_scale / math.sqrt(spec.hidden)
        elif name.endswith("norm.weight"):
            out[name] = (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
            continue
        elif name.endswith(".bias"):
            std = 0.1
        else:
            std = 1.0 / math.sqrt(shape[1])  # keeps activations at unit scale through each matrix
        array = (std * rng.standard_normal(shape)).astype(np.float32)
        out[name] = _round(array, spec.qtype_of(_gguf_name(name))) if array.ndim == 2 else array
    return out


def build_hf_model(spec: TinySpec) -> transformers.PreTrainedModel:
    """The reference model of `spec`: float32, eval mode, weights already rounded to `spec.qtype`."""
    config = _hf_config(spec)
    cls = transformers.LlamaForCausalLM if spec.arch == "llama" else transformers.Qwen2ForCausalLM
    model = cls(config)
    state = model.state_dict()
    weights = _random_weights(spec, {name: tuple(t.shape) for name, t in state.items()})
    with torch.no_grad():
        for name, tensor in state.items():
            tensor.copy_(torch.from_numpy(weights[name]))
    return model.eval()


# ---------------------------------------------------------------------------------------------
# GGUF writing

_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
_TOP_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}


def _gguf_name(hf_name: str) -> str:
    if hf_name in _TOP_NAMES:
        return _TOP_NAMES[hf_name]
    match = re.fullmatch(r"model\.layers\.(\d+)\.(.+)", hf_name)
    if match is None or match[2] not in _LAYER_NAMES:
        raise KeyError(f"no GGUF name for {hf_name}")
    return f"blk.{match[1]}.{_LAYER_NAMES[match[2]]}"


def _permute(weights: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's `LlamaModel.permute`: rotary pairs from HF's half-split layout to interleaved."""
    return (
        weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def llama3_rope_freqs(spec: TinySpec) -> np.ndarray:
    """`rope_freqs.weight` as llama.cpp's converter computes it: per-frequency divisors, so that
    the Llama 3 inverse frequencies are `base_inv_freq / rope_freqs`.

    One deliberate difference: llama.cpp reads `original_max_position_embeddings` from the top of
    config.json (default 8192) rather than from `rope_scaling`; the two agree for Llama 3.1/3.2.
    Here the value comes from the rope parameters, so the file matches the reference model.
    """
    dim = spec.head_dim
    freqs = 1.0 / (spec.theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    factor = LLAMA3_ROPE["factor"]
    low, high = LLAMA3_ROPE["low_freq_factor"], LLAMA3_ROPE["high_freq_factor"]
    old_context_len = LLAMA3_ROPE["original_max_position_embeddings"]
    low_freq_wavelen, high_freq_wavelen = old_context_len / low, old_context_len / high
    factors = []
    for freq in freqs.tolist():
        wavelen = 2 * math.pi / freq
        if wavelen < high_freq_wavelen:
            factors.append(1.0)
        elif wavelen > low_freq_wavelen:
            factors.append(factor)
        else:
            smooth = (old_context_len / wavelen - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray(factors, dtype=np.float32)


def write_tiny_gguf(path: Path, spec: TinySpec, model: transformers.PreTrainedModel | None = None) -> Path:
    """Write `spec`'s model (`build_hf_model(spec)` unless given) as a GGUF file at `path`.

    A given model's matrices are rounded to `spec.qtype` in place first, so it stays exactly the
    model the file holds (a no-op for models from `build_hf_model`).
    """
    path = Path(path)
    if model is None:
        model = build_hf_model(spec)
    _, file_type = _QTYPES[spec.qtype]
    tokens, types, merges = tiny_vocab(spec.vocab)
    vocab_size, bos_id, eos_id = vocab_ids(spec.vocab)

    writer = gguf.GGUFWriter(str(path), spec.arch)
    writer.add_name(f"tiny-{spec.arch}-{spec.qtype}-seed{spec.seed}")
    writer.add_file_type(int(file_type))
    writer.add_vocab_size(vocab_size)
    writer.add_context_length(spec.context_length)
    writer.add_embedding_length(spec.hidden)
    writer.add_block_count(spec.n_layers)
    writer.add_feed_forward_length(spec.intermediate)
    writer.add_head_count(spec.n_heads)
    writer.add_head_count_kv(spec.n_kv_heads)
    writer.add_layer_norm_rms_eps(RMS_EPS)
    writer.add_rope_freq_base(spec.theta)
    if spec.arch == "llama":
        writer.add_rope_dimension_count(spec.head_dim)

    writer.add_tokenizer_model("gpt2")
    # llama.cpp maps "gpt-2" to GPT-2's own split regex, which is also what transformers uses for
    # a name it has no entry for: both sides pre-tokenize as the merges were learned.
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(bos_id)
    writer.add_eos_token_id(eos_id)
    writer.add_add_bos_token(False)
    if spec.chat_template is not None:
        writer.add_chat_template(spec.chat_template)

    state = model.state_dict()
    with torch.no_grad():
        for hf_name, tensor in state.items():
            array = tensor.detach().to(torch.float32).cpu().numpy()
            name = _gguf_name(hf_name)
            qtype = spec.qtype_of(name)
            if array.ndim == 2:
                array = _round(array, qtype)
                tensor.copy_(torch.from_numpy(array))
            if spec.arch == "llama" and name.endswith("attn_q.weight"):
                array = _permute(array, spec.n_heads)
            elif spec.arch == "llama" and name.endswith("attn_k.weight"):
                array = _permute(array, spec.n_kv_heads)
            if array.ndim == 2 and qtype != "F32":
                # Row-wise quantization commutes with the row permutation above.
                tensor_type = _QTYPES[qtype][0]
                writer.add_tensor(name, gguf.quants.quantize(array, tensor_type), raw_dtype=tensor_type)
            else:
                writer.add_tensor(name, np.ascontiguousarray(array, dtype=np.float32))
    if spec.llama3_rope:
        writer.add_tensor("rope_freqs.weight", llama3_rope_freqs(spec))

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def rope_freqs_from_file(path: Path) -> np.ndarray | None:
    """The `rope_freqs.weight` tensor of a GGUF file, or None when it has none."""
    for tensor in gguf.GGUFReader(str(path)).tensors:
        if tensor.name == "rope_freqs.weight":
            return np.array(tensor.data, dtype=np.float32)
    return None
