"""The loader on tiny real GGUF files: the Llama 3.1 rope fix, one-line errors for bad files,
progress and cancel, and the device plan (resolve_plan / apply_plan)."""

from __future__ import annotations


import pytest
import torch
from transformers import AutoModelForCausalLM
from transformers import modeling_gguf_pytorch_utils as gguf_utils

from app.engine.backends.torch import device as device_module
from app.engine.backends.torch.device import DevicePlan, apply_plan, resolve_plan
from app.engine.errors import (
    DeviceError,
    InsufficientMemoryError,
    LoadCancelled,
    ModelFileError,
    SpeculaError,
    UnsupportedModelError,
)
from app.engine.loader import load_model
from tests.conftest import TINY_MODELS
from tests.header_gguf import write_gguf
from tests.tiny_gguf import VOCAB_SIZE, build_hf_model

# A fixed sequence of 40 ids spread over the whole vocabulary: positions up to 39 reach the
# low-frequency rotary components that the llama3 scaling changes.
SEQUENCE = [(i * 37 + 11) % VOCAB_SIZE for i in range(40)]


@torch.inference_mode()
def logits(model: torch.nn.Module) -> torch.Tensor:
    return model(torch.tensor([SEQUENCE])).logits[0].float()


# ---------------------------------------------------------------------------------------------
# Llama 3.1 rope scaling (rope_freqs.weight), which transformers' GGUF loader drops


def test_llama3_rope_matches_reference_and_plain_transformers_does_not(tiny_paths, tiny_loaded):
    path = tiny_paths["llama3-rope"]
    loaded = tiny_loaded("llama3-rope")  # load_model(path, device="cpu", dtype="float32")
    assert loaded.rope_fix is not None
    assert loaded.plan.dtype == torch.float32

    reference = logits(build_hf_model(TINY_MODELS["llama3-rope"]))
    ours = logits(loaded.model)
    assert (ours - reference).abs().max().item() < 1e-4

    # Control: transformers alone loads the same file with plain RoPE, and the test can see it.
    plain = AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32, local_files_only=True
    ).eval()
    assert (logits(plain) - reference).abs().max().item() > 1e-2


def test_no_rope_fix_on_a_plain_llama(tiny_loaded):
    assert tiny_loaded("llama-f32").rope_fix is None


# ---------------------------------------------------------------------------------------------
# Bad files: the right SpeculaError subclass, one line, naming the file


def assert_one_line_naming(error: BaseException, name: str) -> str:
    message = str(error)
    assert "\n" not in message, message
    assert name in message, message
    return message


def test_text_file_is_not_a_gguf(tmp_path):
    path = tmp_path / "notes.gguf"
    path.write_text("These are my notes, not a model.\n" * 20)
    with pytest.raises(ModelFileError) as caught:
        load_model(path)
    assert_one_line_naming(caught.value, "notes.gguf")


def test_truncated_file(tiny_paths, tmp_path):
    data = tiny_paths["llama-f32"].read_bytes()
    path = tmp_path / "half.gguf"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelFileError) as caught:
        load_model(path)
    message = assert_one_line_naming(caught.value, "half.gguf")
    assert "truncated" in message


def test_missing_file(tmp_path):
    with pytest.raises(ModelFileError) as caught:
        load_model(tmp_path / "nowhere.gguf")
    assert_one_line_naming(caught.value, "nowhere.gguf")


def test_an_architecture_llama_cpp_cannot_run_is_one_line_with_its_cause(tmp_path):
    from tests.llama_support import require_llama_cpp

    require_llama_cpp()
    path = write_gguf(tmp_path / "rnn.gguf", arch="rwkv6")  # without the keys rwkv6 needs
    with pytest.raises(ModelFileError) as caught:
        load_model(path, backend="llama.cpp")
    message = assert_one_line_naming(caught.value, "rnn.gguf")
    assert "llama.cpp could not load it" in message and "rwkv6.wkv.head_size" in message


def test_unsupported_architecture_names_the_supported_ones(tmp_path):
    path = write_gguf(tmp_path / "rnn.gguf", arch="rwkv6")
    with pytest.raises(UnsupportedModelError) as caught:
        load_model(path, backend="torch")
    message = assert_one_line_naming(caught.value, "rnn.gguf")
    assert "rwkv6" in message
    assert "llama" in message and "qwen2" in message
    assert "general" not in message and "tokenizer" not in message  # not architectures


def test_insufficient_memory(tiny_paths, monkeypatch):
    monkeypatch.setenv("SPECULA_MEMORY_LIMIT", "1K")
    with pytest.raises(InsufficientMemoryError) as caught:
        load_model(tiny_paths["llama-f32"], device="cpu", dtype="float32")
    message = assert_one_line_naming(caught.value, "llama-f32.gguf")
    assert "1.0 KiB" in message  # the limit as set, not rounded to "0.0 GiB"


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a CUDA GPU")
@pytest.mark.parametrize("kwargs", [{"n_gpu_layers": 5}, {"device": "cuda"}], ids=["ngl", "cuda"])
def test_gpu_asked_for_where_there_is_none(tiny_paths, kwargs):
    with pytest.raises(DeviceError) as caught:
        load_model(tiny_paths["llama-f32"], backend="torch", **kwargs)
    message = str(caught.value)
    assert "\n" not in message
    assert "CUDA" in message


@pytest.mark.parametrize("cls", [ModelFileError, UnsupportedModelError, InsufficientMemoryError, DeviceError,
                                 LoadCancelled])
def test_each_load_error_reaches_a_user_as_one_line(cls, monkeypatch, capsys):
    """Every error a load raises is a SpeculaError, which the command line turns into one line
    and an exit code, never a traceback."""
    from app.cli import main, run

    def failing(args):
        raise cls("the model could not be loaded: a reason")

    assert issubclass(cls, SpeculaError)
    monkeypatch.setattr(run, "cmd_run", failing)
    code = main(["run", "-m", "any.gguf", "-p", "hi"])
    err = capsys.readouterr().err
    assert code != 0 and err == "specula: error: the model could not be loaded: a reason\n"


# ---------------------------------------------------------------------------------------------
# Progress and cancel


def test_progress_reports_increasing_fractions(tiny_paths):
    reports: list[tuple[str, float]] = []
    loaded = load_model(
        tiny_paths["qwen2-f32"], device="cpu", dtype="float32",
        progress=lambda stage, fraction: reports.append((stage, fraction)),
    )
    assert loaded.model is not None
    stages = [stage for stage, _ in reports]
    fractions = [fraction for _, fraction in reports]
    assert stages[0] == "reading header" and stages[-1] == "placing on device"
    assert "building tokenizer" in stages
    weights = [f for s, f in reports if s == "reading weights"]
    assert len(weights) >= len(loaded.info.tensors) - 1  # one report per tensor
    assert all(0.0 <= f <= 1.0 for f in fractions)
    assert fractions == sorted(fractions), reports
    assert fractions[-1] == 1.0
    # Stages come in order, each once.
    order = list(dict.fromkeys(stages))
    assert order == ["reading header", "building tokenizer", "reading weights", "placing on device"]


def _cancel_after(first_stage: str | None):
    """progress, cancel: cancel() turns True once a report of first_stage (any when None) came."""
    seen: list[str] = []

    def progress(stage: str, fraction: float) -> None:
        seen.append(stage)

    def cancel() -> bool:
        return any(first_stage is None or stage == first_stage for stage in seen)

    return progress, cancel, seen


@pytest.mark.parametrize("first_stage", [None, "reading weights"], ids=["first-report", "mid-weights"])
def test_cancel_then_a_normal_load_works(tiny_paths, first_stage):
    original_tqdm = gguf_utils.tqdm
    progress, cancel, seen = _cancel_after(first_stage)
    with pytest.raises(LoadCancelled):
        load_model(tiny_paths["llama-q8"], device="cpu", dtype="float32", progress=progress, cancel=cancel)
    assert seen and "placing on device" not in seen
    if first_stage == "reading weights":
        assert seen.count("reading weights") == 1  # stopped at the next tensor
    assert gguf_utils.tqdm is original_tqdm  # the progress hook is removed again

    loaded = load_model(tiny_paths["llama-q8"], device="cpu", dtype="float32", cancel=lambda: False)
    assert loaded.info.vocab_size == VOCAB_SIZE
    assert torch.isfinite(logits(loaded.model)).all()


# ---------------------------------------------------------------------------------------------
# Device plan


def test_auto_dtype_on_cpu_is_never_read_from_a_cpu_flag():
    # The torch fallback's auto on the CPU is float32, whatever the CPU's flags say.
    plan = resolve_plan(4, device="cpu")
    assert plan == DevicePlan(gpu=None, dtype=torch.float32, n_gpu_layers=0, n_layers=4)


@pytest.mark.parametrize("name,dtype", [
    ("float32", torch.float32), ("f32", torch.float32),
    ("bfloat16", torch.bfloat16), ("bf16", torch.bfloat16),
    ("float16", torch.float16), ("f16", torch.float16),
])
def test_explicit_dtypes(name, dtype):
    plan = resolve_plan(3, device="cpu", dtype=name)
    assert plan.dtype == dtype
    assert plan.dtype_name == str(dtype).removeprefix("torch.")


def test_ngl_zero_runs_on_cpu():
    for device in ("auto", "cpu"):
        plan = resolve_plan(6, device=device, dtype="float32", n_gpu_layers=0)
        assert plan.n_gpu_layers == 0
        assert plan.input_device == "cpu"
        assert not plan.all_on_gpu
        assert plan.describe() == "CPU, float32"


def test_ngl_zero_auto_dtype_is_the_cpu_one():
    # Even where there is a GPU, -ngl 0 computes on the CPU, so auto is the CPU's (measured later).
    assert resolve_plan(6, n_gpu_layers=0).dtype == torch.float32


@pytest.mark.parametrize("kwargs", [
    {"device": "tpu"},
    {"dtype": "int4"},
    {"device": "cpu", "n_gpu_layers": 3},
], ids=["device", "dtype", "cpu-with-ngl"])
def test_invalid_choices_raise_device_error(kwargs):
    with pytest.raises(DeviceError) as caught:
        resolve_plan(4, **kwargs)
    assert "\n" not in str(caught.value)


def test_apply_plan_without_gpu_returns_the_model_unchanged():
    model = torch.nn.Linear(3, 2)
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    for plan in (
        DevicePlan(gpu=None, dtype=torch.float32, n_gpu_layers=0, n_layers=2),
        DevicePlan(gpu="cuda", dtype=torch.float32, n_gpu_layers=0, n_layers=2),  # -ngl 0
    ):
        assert apply_plan(model, plan) is model
        assert all(p.device.type == "cpu" for p in model.parameters())
        assert all(torch.equal(before[n], t) for n, t in model.state_dict().items())


def test_gpu_layers_on_a_cpu_only_llama_cpp_run_on_the_cpu(tiny_paths, caplog):
    """As llama.cpp itself: -ngl on a build without a GPU backend is a warning, not an error."""
    from tests.llama_support import require_llama_cpp

    require_llama_cpp()
    from app.engine.backends.llamacpp.lib import has_gpu

    if has_gpu():
        pytest.skip("this llama.cpp build has a GPU backend")
    loaded = load_model(tiny_paths["llama-q8"], n_gpu_layers=5, backend="llama.cpp")
    assert loaded.plan.n_gpu_layers == 0 and loaded.plan.describe().startswith("llama.cpp on CPU")
    assert "no GPU" in caplog.text and "-ngl 5" in caplog.text
