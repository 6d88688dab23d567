"""Int4 linears from a GGUF file's own integers: exact unpacking, the kernel's row independence,
and models loaded that way (tiny files written here, and the real demo files)."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from app.engine.cpu import layout, quantlinear, rowexact
from app.engine.fastload import _dequantize, _read
from app.engine.gguf_info import read_gguf_info
from app.engine.loader import load_model
from app.engine.cpu.quantlinear import Int4Linear, group_affine, group_integers, pack_linear, pack_passes
from tests.tiny_gguf import TinySpec, write_tiny_gguf

WRITABLE_TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"]
requires_int4 = pytest.mark.skipif(not quantlinear.int4_available(), reason="this torch has no CPU int4 kernel")


def _quantized(ggml_type: str, shape=(192, 128), seed=0) -> np.ndarray:
    values = np.random.default_rng(seed).standard_normal(shape).astype(np.float32) * 0.05
    values[3, :32] = 0.0  # a group whose scale is 0
    return gguf.quants.quantize(values, gguf.GGMLQuantizationType[ggml_type]).reshape(-1)


def _k_quant_blocks(ggml_type: str, shape=(192, 256), seed=0) -> np.ndarray:
    """Random Q5_K or Q6_K blocks (gguf-py cannot write these types): random integers and scales
    with small fp16 super-block factors, as a real file's."""
    block_bytes = {"Q5_K": 176, "Q6_K": 210}[ggml_type]
    rng = np.random.default_rng(seed)
    n_blocks = shape[0] * shape[1] // 256
    blocks = rng.integers(0, 256, (n_blocks, block_bytes), dtype=np.uint8)

    def factors() -> np.ndarray:
        return (np.abs(rng.standard_normal(n_blocks)) * 0.002).astype(np.float16).view(np.uint8).reshape(-1, 2)

    if ggml_type == "Q6_K":
        blocks[:, 208:210] = factors()  # d; the 16 int8 scales before it are random
    else:
        blocks[:, 0:2], blocks[:, 2:4] = factors(), factors()  # d, dmin
    return blocks.reshape(-1)


def _raw(ggml_type: str) -> tuple[np.ndarray, tuple[int, int]]:
    if ggml_type in ("Q5_K", "Q6_K"):
        return _k_quant_blocks(ggml_type), (192, 256)
    return _quantized(ggml_type), (192, 128)


def _reconstructed(raw: np.ndarray, ggml_type: str, shape) -> np.ndarray:
    if ggml_type == "Q6_K":
        values, scales = quantlinear.q6_k_values(raw)
        return (values.float().reshape(-1, 16) * scales.reshape(-1, 1)).reshape(shape).numpy()
    s, o = group_affine(raw, ggml_type)
    u = group_integers(raw, ggml_type).numpy().astype(np.float32)
    return (u * s[:, None] + o[:, None]).reshape(shape)


@pytest.mark.parametrize("ggml_type", [*WRITABLE_TYPES, "Q5_K", "Q6_K"])
def test_integers_and_scales_rebuild_ggufs_own_dequantization_exactly(ggml_type):
    raw, shape = _raw(ggml_type)
    expected = gguf.quants.dequantize(raw.reshape(shape[0], -1), gguf.GGMLQuantizationType[ggml_type])
    assert np.array_equal(_reconstructed(raw, ggml_type, shape), expected.reshape(shape))


@pytest.mark.parametrize("ggml_type", ["Q4_K", "Q6_K"])
def test_k_quant_tensors_of_the_real_gemma_file_rebuild_exactly(demo_path, ggml_type):
    info = read_gguf_info(demo_path("gemma3-270m"))
    tensors = [t for t in info.tensors if t.ggml_type == ggml_type][:3]
    assert tensors, f"the demo file has {ggml_type} tensors"
    with open(info.path, "rb") as handle:
        for tensor in tensors:
            raw = _read(handle, info, tensor.offset, tensor.n_bytes)
            expected = _dequantize(raw, ggml_type, tensor.shape).numpy()
            assert np.array_equal(_reconstructed(raw, ggml_type, tensor.shape), expected), tensor.name


@requires_int4
@pytest.mark.parametrize("ggml_type", ["Q4_1", "Q8_0", "Q6_K"])  # one, two and four passes
@pytest.mark.parametrize("with_bias", [False, True])
def test_the_rows_function_gives_forwards_bits(ggml_type, with_bias):
    raw, shape = _raw(ggml_type)
    bias = torch.nn.Parameter(torch.randn(192).to(torch.bfloat16), requires_grad=False) if with_bias else None
    linear = pack_linear(raw, ggml_type, shape, bias=bias)
    product = linear.rows_function()
    direct = linear.n_passes == 1 and not with_bias  # the kernel alone, with this module's buffers
    assert (getattr(product, "func", None) is torch._weight_int4pack_mm_for_cpu) == direct
    for n_rows in (1, 4, 17, 32):
        x = torch.randn(n_rows, shape[1], generator=torch.Generator().manual_seed(n_rows)).to(torch.bfloat16)
        with torch.inference_mode():
            assert torch.equal(product(x), linear(x))


@requires_int4
@pytest.mark.parametrize("ggml_type", [*WRITABLE_TYPES, "Q5_K", "Q6_K"])
def test_int4_linear_matches_the_dequantized_product_and_each_row_stands_alone(ggml_type):
    if not quantlinear.layout_is_known():
        pytest.skip("torch's int4 layout is not of the known form here: prompts keep the kernel")
    raw, shape = _raw(ggml_type)
    weights = _dequantize(raw, ggml_type, shape)
    bias = torch.nn.Parameter(torch.randn(192).to(torch.bfloat16), requires_grad=False)
    linear = pack_linear(raw, ggml_type, shape, bias=bias)
    assert linear.n_passes == quantlinear.INT4_PASSES[ggml_type]
    x = torch.randn(17, shape[1], generator=torch.Generator().manual_seed(1))
    expected = x @ weights.T + bias.float()
    got = linear(x).float()
    # Close to a bf16 product's error. The kernel holds each group's zero in bf16, a rounding
    # shared by the group's 32 weights rather than independent per weight, hence the margin.
    bf16_error = ((x.bfloat16() @ weights.bfloat16().T).float() + bias.float() - expected).abs().max()
    assert (got - expected).abs().max() <= 5 * bf16_error + 1e-3
    assert (got - expected).abs().max() <= 0.02 * expected.abs().max()
    # One row alone gives the very same bits as that row inside a 17-row product: a verify of
    # k+1 tokens agrees with one-token decoding in every linear.
    for i in (0, 5, 16):
        assert torch.equal(linear(x[i : i + 1]), got.bfloat16()[i : i + 1])


@requires_int4
@pytest.mark.parametrize("ggml_type", ["Q4_0", "Q5_0", "Q8_0", "Q5_K", "Q6_K"])
def test_prompts_take_one_product_of_the_dequantized_weights(ggml_type, monkeypatch):
    """From DEQUANTIZE_FROM_ROWS rows on (prompts), the weights are dequantized a chunk of rows at a
    time and multiplied in bf16: the file's weights, as the kernel holds them."""
    if not quantlinear.layout_is_known():
        pytest.skip("torch's int4 layout is not of the known form here: prompts keep the kernel")
    raw, shape = _raw(ggml_type)
    weights = _dequantize(raw, ggml_type, shape)
    bias = torch.nn.Parameter(torch.randn(192).to(torch.bfloat16), requires_grad=False)
    linear = pack_linear(raw, ggml_type, shape, bias=bias)
    dequantized = linear.dequantized()
    assert dequantized.dtype == torch.bfloat16
    # bf16 scales and zeros, as the kernel's: within a few bf16 roundings of each weight's group.
    assert (dequantized.float() - weights).abs().max() <= 0.01 * weights.abs().max()
    x = torch.randn(quantlinear.DEQUANTIZE_FROM_ROWS, shape[1], generator=torch.Generator().manual_seed(3))
    expected = x @ weights.T + bias.float()
    monkeypatch.setattr(quantlinear, "_DEQUANTIZE_CHUNK", 64 * shape[1])  # three chunks of 64 rows
    chunks = []
    dequantize = Int4Linear.dequantized
    monkeypatch.setattr(Int4Linear, "dequantized", lambda self, *rows: chunks.append(rows) or dequantize(self, *rows))
    got = linear(x).float()
    assert chunks == [(0, 64), (64, 128), (128, 192)]
    assert torch.allclose(got, torch.nn.functional.linear(x.bfloat16(), dequantized, bias).float(), rtol=0.02, atol=0.02)
    assert (got - expected).abs().max() <= 0.02 * expected.abs().max()
    # One row fewer still runs the kernel, which gives every row the bits of that row alone.
    fewer = linear(x[:-1])
    assert len(chunks) == 3 and torch.equal(fewer[:1], linear(x[:1]))


@requires_int4
def test_row_order_follows_the_models_rows():
    raw = _quantized("Q4_1", (64, 64))
    weights = _dequantize(raw, "Q4_1", (64, 64))
    order = np.random.default_rng(2).permutation(64)
    x = torch.randn(2, 64)
    assert torch.allclose(pack_linear(raw, "Q4_1", (64, 64), order)(x).float(), x @ weights[order].T, atol=0.05)


@requires_int4
def test_blocks_of_rows_packed_apart_are_the_rows_of_the_whole_matrix():
    # The loader writes a large head a block of rows at a time (multiples of 64 but the last).
    raw = _quantized("Q8_0", (272, 64))
    row_bytes = raw.size // 272
    whole = pack_passes(raw, "Q8_0", (272, 64))
    for first, n in ((0, 128), (128, 128), (256, 16)):
        block = pack_passes(raw[first * row_bytes : (first + n) * row_bytes], "Q8_0", (n, 64))
        for (packed, scales_zeros), (part, part_scales) in zip(whole, block):
            assert torch.equal(packed[first : first + n], part)
            assert torch.equal(scales_zeros[:, first : first + n], part_scales)


@pytest.fixture(scope="module")
def tiny_q4(tmp_path_factory):
    folder = tmp_path_factory.mktemp("q4")
    return {q: write_tiny_gguf(folder / f"{q}.gguf", TinySpec(arch="llama", qtype=q, seed=4)) for q in ("Q4_0", "Q5_0")}


@requires_int4
@pytest.mark.parametrize("qtype", ["Q4_0", "Q5_0"])
def test_a_bf16_cpu_load_keeps_the_layers_quantized_and_computes_the_same_logits(tiny_q4, qtype):
    packed = load_model(tiny_q4[qtype], device="cpu", dtype="bfloat16")
    reference = load_model(tiny_q4[qtype], device="cpu", dtype="float32")
    assert packed.plan.int4 and "int4" in packed.plan.describe()
    linears = [m for m in packed.model.model.layers.modules() if isinstance(m, (Int4Linear, torch.nn.Linear))]
    # Every layer matrix on the int4 kernel, but those this CPU computes for less as bf16 rows
    # (a measurement: Q5_0's two passes with torch's scalar kernels, not with AVX2's on a Zen 3).
    matrices = [t for t in read_gguf_info(tiny_q4[qtype]).tensors if t.name.startswith("blk.") and len(t.shape) == 2]
    in_rows = sum(rowexact.replaces_int4(t) for t in matrices)
    assert len(linears) == len(matrices) and sum(isinstance(m, Int4Linear) for m in linears) == len(matrices) - in_rows
    short = packed.tokenizer.encode("The quick brown fox jumps over the lazy dog.")
    long = packed.tokenizer.encode("The quick brown fox jumps over the lazy dog. " * 20)
    assert len(long) >= quantlinear.DEQUANTIZE_FROM_ROWS  # a prompt taking the dequantized product
    for ids in (short, long):
        with torch.inference_mode():
            got = packed.kv_model().feed(ids, len(ids))
            expected = reference.kv_model().feed(ids, len(ids))
        assert (got - expected).abs().max() < 0.1 * expected.abs().max()
        assert (got.argmax(-1) == expected.argmax(-1)).float().mean() >= 0.9


@requires_int4
def test_int4_can_be_turned_off(tiny_q4, monkeypatch):
    monkeypatch.setenv("SPECULA_INT4", "0")
    loaded = load_model(tiny_q4["Q4_0"], device="cpu", dtype="bfloat16")
    assert not loaded.plan.int4
    assert not any(isinstance(m, Int4Linear) for m in loaded.model.modules())


@requires_int4
def test_float32_loads_are_never_packed(tiny_q4):
    loaded = load_model(tiny_q4["Q4_0"], device="cpu", dtype="float32")
    assert not loaded.plan.int4
    assert not any(isinstance(m, Int4Linear) for m in loaded.model.modules())


@requires_int4
@pytest.mark.parametrize("name", ["smollm2-135m", "gemma3-270m"])
def test_the_memory_estimate_follows_what_an_int4_load_holds(demo_path, name):
    loaded = load_model(demo_path(name), device="cpu", dtype="bfloat16")
    held = sum(t.numel() * t.element_size() for t in [*loaded.model.parameters(), *loaded.model.buffers()])
    # The matrices this CPU keeps in bf16 are a measurement (rowexact.replaces_int4), which the
    # count follows; the estimate also counts the head's screening bound, built on a first verify.
    estimate = loaded.weights_bytes
    assert held <= estimate <= held * 1.1
    if name == "smollm2-135m":  # all layers Q4_1: well under half of a bf16 copy
        assert estimate < 0.65 * loaded.info.memory_bytes("bfloat16")


@requires_int4
@pytest.mark.parametrize("shape", [(64, 32), (256, 128), (128, 1536)])
def test_our_packing_writes_torchs_own_int4_layout(shape):
    packing = layout.learned()
    if packing is None:
        pytest.skip("the probe found no layout of the known form on this CPU: torch's converter is used")
    q = torch.randint(0, 16, shape, generator=torch.Generator().manual_seed(5), dtype=torch.uint8)
    packed = packing.pack(q)
    assert torch.equal(packed, torch._convert_weight_to_int4pack_for_cpu(q.to(torch.int32), 1))
    assert torch.equal(packing.unpack(packed, shape[1]), q)


@requires_int4
def test_the_layout_probe_finds_the_form_of_this_cpus_kernels():
    """AVX-512 packs blocks of 64 rows, AVX2 blocks of 32 split 16/16, torch's scalar kernels pair
    neighbouring rows; whichever this process runs, the probe finds a layout that reproduces it."""
    packing = layout.learned()
    capability = torch.backends.cpu.get_cpu_capability()
    if packing is None:
        pytest.skip(f"no layout of the known form under {capability}: the converter is used")
    assert layout.ROW_UNIT % packing.block_rows == 0
    assert sorted(packing.low + packing.high) == list(range(packing.block_rows))
    expected_blocks = {"AVX512": 64, "AVX2": 32, "DEFAULT": 32}.get(capability)
    if expected_blocks is not None:
        assert packing.block_rows == expected_blocks


@requires_int4
def test_the_no_int4_choice_dequantizes_every_weight(tiny_q4):
    loaded = load_model(tiny_q4["Q4_0"], device="cpu", dtype="bfloat16", int4=False)
    assert not loaded.plan.int4 and "int4" not in loaded.plan.describe()
    assert not any(isinstance(m, Int4Linear) for m in loaded.model.modules())


@requires_int4
def test_bench_measures_both_weight_forms_in_one_run(tiny_q4, capsys):
    from app.cli import main

    code = main(["bench", "-m", str(tiny_q4["Q5_0"]), "--dtype", "bfloat16", "-n", "8", "--prompts", "chat",
                 "--no-hf", "--no-llama-cpp", "--both-weights"])
    out = capsys.readouterr().out
    assert code == 0
    assert "int4 weights" in out.splitlines()[0] and "[plan]" in out.splitlines()[0]
    configs = [line[15:37].strip() for line in out.splitlines() if line.startswith("chat ")]
    assert configs == ["none", "lookup", "none [bf16]", "lookup [bf16]"]


@requires_int4
def test_bench_measures_every_plan_asked_for_side_by_side(tiny_q4, capsys):
    from app.cli import main

    code = main(["bench", "-m", str(tiny_q4["Q4_0"]), "--dtype", "bfloat16", "-n", "8", "--prompts", "chat",
                 "--no-hf", "--no-llama-cpp", "--plans", "float32,bf16,bf16-int4"])
    out = capsys.readouterr().out
    assert code == 0
    configs = [line[15:37].strip() for line in out.splitlines() if line.startswith("chat ")]
    # The main load is the int4 plan already: it is not run twice.
    assert configs == ["none", "lookup", "none [float32]", "lookup [float32]", "none [bf16]", "lookup [bf16]"]
    with pytest.raises(SystemExit, match="unknown plan 'int3'"):
        main(["bench", "-m", str(tiny_q4["Q4_0"]), "--backend", "torch", "--plans", "int3", "--no-hf", "--no-llama-cpp"])
