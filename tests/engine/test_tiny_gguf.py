"""The tiny GGUF generator writes files transformers' GGUF loader turns back into the reference model."""

from __future__ import annotations

from pathlib import Path

import gguf
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.tiny_gguf import (
    BOS_ID,
    EOS_ID,
    IM_START_ID,
    VOCAB_SIZE,
    TinySpec,
    build_hf_model,
    rope_freqs_from_file,
    tiny_vocab,
    write_tiny_gguf,
)

# A fixed prompt: ChatML ids would couple this to the merges, so use raw ids across the vocabulary.
PROMPT = torch.tensor([[5, 300, 17, 421, 99, 256, 512, 77, 3, 400, 261, 150]])


def _load(path: Path) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()


def _greedy(model: torch.nn.Module, ids: torch.Tensor, n: int) -> list[int]:
    """Plain greedy decoding, one full forward per token (no cache, no stopping at EOS)."""
    out = ids
    with torch.no_grad():
        for _ in range(n):
            next_id = model(out).logits[0, -1].argmax()
            out = torch.cat([out, next_id.view(1, 1)], dim=1)
    return out[0, ids.shape[1] :].tolist()


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory):
    """(reference, loaded, path) per spec, built once for the module."""
    cache: dict[TinySpec, tuple[torch.nn.Module, torch.nn.Module, Path]] = {}
    folder = tmp_path_factory.mktemp("tiny")

    def get(spec: TinySpec):
        if spec not in cache:
            ref = build_hf_model(spec)
            name = f"{spec.arch}-{spec.qtype}-{spec.seed}-{int(spec.llama3_rope)}.gguf"
            path = write_tiny_gguf(folder / name, spec, ref)
            cache[spec] = (ref, _load(path), path)
        return cache[spec]

    return get


def test_vocab_layout() -> None:
    tokens, types, merges = tiny_vocab()
    assert len(tokens) == len(types) == VOCAB_SIZE and 400 <= VOCAB_SIZE <= 600
    assert len(set(tokens)) == len(tokens)
    assert tokens[BOS_ID] == "<|endoftext|>" and tokens[IM_START_ID] == "<|im_start|>"
    assert tokens[EOS_ID] == "<|im_end|>"
    assert [t for t, k in zip(tokens, types) if k == gguf.TokenType.CONTROL] == tokens[-3:]
    assert tokens[ord("a")] == "a" and tokens[ord(" ")] == "Ġ"  # GPT-2 byte spelling, byte order
    assert all(len(m.split(" ")) == 2 for m in merges)
    for word in ("Ġthe", "Ġand", "Ġmodel", "Ġreturn", "Ġdef", "Ġself"):
        assert word in tokens
    assert tiny_vocab() == (tokens, types, merges)


ARCH_QTYPES = [(a, q) for a in ("llama", "qwen2") for q in ("F32", "Q8_0")]


@pytest.mark.parametrize("arch,qtype", ARCH_QTYPES)
def test_loaded_model_matches_reference(written, arch: str, qtype: str) -> None:
    ref, loaded, _ = written(TinySpec(arch=arch, qtype=qtype))
    assert loaded.config.model_type == arch and not loaded.config.tie_word_embeddings
    with torch.no_grad():
        diff = (ref(PROMPT).logits - loaded(PROMPT).logits).abs().max().item()
    # Q8_0 too: the reference already holds the dequantized weights, so only op order could differ.
    assert diff < 1e-4
    assert _greedy(loaded, PROMPT, 20) == _greedy(ref, PROMPT, 20)
    gen = dict(max_new_tokens=20, do_sample=False)
    assert torch.equal(loaded.generate(PROMPT, **gen), ref.generate(PROMPT, **gen))


def test_q8_0_is_the_rounded_f32_model(written, tmp_path: Path) -> None:
    """A Q8_0 model is the same seed's F32 model, rounded: close, usually agreeing, not identical."""
    f32, _, _ = written(TinySpec(qtype="F32"))
    q8, _, _ = written(TinySpec(qtype="Q8_0"))
    w32, w8 = f32.model.layers[0].mlp.up_proj.weight, q8.model.layers[0].mlp.up_proj.weight
    assert 0 < (w32 - w8).abs().max().item() < 0.01
    # Writing an unrounded model as Q8_0 rounds it in place to that same model.
    model = build_hf_model(TinySpec(qtype="F32"))
    write_tiny_gguf(tmp_path / "again.gguf", TinySpec(qtype="Q8_0"), model)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), q8.state_dict().values()))


def test_tokenizer_from_file(written) -> None:
    _, _, llama_path = written(TinySpec(arch="llama"))
    _, _, qwen_path = written(TinySpec(arch="qwen2"))
    llama_tok = AutoTokenizer.from_pretrained(llama_path.parent, gguf_file=llama_path.name)
    qwen_tok = AutoTokenizer.from_pretrained(qwen_path.parent, gguf_file=qwen_path.name)
    assert len(llama_tok) == VOCAB_SIZE
    assert llama_tok.bos_token_id == BOS_ID and llama_tok.eos_token_id == EOS_ID

    for text in ("héllo wörld ✓ 日本", "def f(x):\n    return x  # 🙂\n\n", "  spaces\tand\r\n"):
        ids = llama_tok.encode(text)
        assert llama_tok.decode(ids) == text
        assert qwen_tok.encode(text) == ids  # one vocabulary: any two files are a main/draft pair
    assert llama_tok.encode("<|im_start|>") == [IM_START_ID]  # no BOS added, special kept whole
    assert llama_tok.encode(" the")[0] == tiny_vocab()[0].index("Ġthe")

    messages = [{"role": "user", "content": "Hello world"}]
    text = llama_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>user\nHello world<|im_end|>\n<|im_start|>assistant\n"
    ids = llama_tok.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)
    assert ids[0] == IM_START_ID and ids.count(EOS_ID) == 1


def test_no_chat_template(tmp_path: Path) -> None:
    path = write_tiny_gguf(tmp_path / "bare.gguf", TinySpec(chat_template=None))
    assert "tokenizer.chat_template" not in gguf.GGUFReader(str(path)).fields
    assert AutoTokenizer.from_pretrained(tmp_path, gguf_file=path.name).chat_template is None


def test_deterministic(tmp_path: Path) -> None:
    spec = TinySpec(arch="qwen2", qtype="Q8_0", seed=3)
    a = write_tiny_gguf(tmp_path / "a.gguf", spec).read_bytes()
    b = write_tiny_gguf(tmp_path / "b.gguf", spec).read_bytes()
    assert a == b


def test_logits_are_peaky_and_seeds_differ(written) -> None:
    ids = torch.randint(0, VOCAB_SIZE, (4, 48), generator=torch.Generator().manual_seed(0))
    main, _, _ = written(TinySpec(seed=0))
    draft, _, _ = written(TinySpec(seed=1))
    with torch.no_grad():
        logits, other = main(ids).logits, draft(ids).logits
    top2 = logits.topk(2, dim=-1).values
    relative_gap = (top2[..., 0] - top2[..., 1]) / top2[..., 0].abs()
    assert (relative_gap > 1e-3).float().mean() > 0.95
    assert (logits.argmax(-1) == other.argmax(-1)).float().mean() < 0.1
    assert _greedy(main, PROMPT, 20) != _greedy(draft, PROMPT, 20)


def test_llama3_rope_is_dropped_by_the_transformers_loader(written) -> None:
    """Documents the bug our loader must fix: transformers ignores `rope_freqs.weight`."""
    spec = TinySpec(llama3_rope=True)
    ref, loaded, path = written(spec)
    rope_freqs = rope_freqs_from_file(path)
    assert rope_freqs is not None and rope_freqs.shape == (spec.head_dim // 2,)
    assert rope_freqs[0] == 1.0 and rope_freqs[-1] == 8.0 and 1.0 < rope_freqs[1] < 8.0

    # The file's divisors turn plain RoPE frequencies into the reference's Llama 3 ones...
    base = loaded.model.rotary_emb.inv_freq
    torch.testing.assert_close(base / torch.from_numpy(rope_freqs), ref.model.rotary_emb.inv_freq)
    # ...but the naive load keeps plain RoPE, so its logits drift from the reference.
    assert loaded.config.rope_parameters.get("rope_type", "default") == "default"
    with torch.no_grad():
        diff = (ref(PROMPT).logits - loaded(PROMPT).logits).abs().max().item()
    assert diff > 1e-2
    assert rope_freqs_from_file(written(TinySpec())[2]) is None


def test_f16_round_trip(tmp_path: Path) -> None:
    spec = TinySpec(arch="qwen2", qtype="F16", seed=2)
    ref = build_hf_model(spec)
    path = write_tiny_gguf(tmp_path / "f16.gguf", spec, ref)
    types = {t.name: t.tensor_type for t in gguf.GGUFReader(str(path)).tensors}
    assert types["blk.0.attn_q.weight"] == gguf.GGMLQuantizationType.F16
    assert types["blk.0.attn_q.bias"] == types["output_norm.weight"] == gguf.GGMLQuantizationType.F32
    with torch.no_grad():
        assert (ref(PROMPT).logits - _load(path)(PROMPT).logits).abs().max().item() < 1e-4
