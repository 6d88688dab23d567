"""A header's facts as people read them: sizes in bytes, and `specula inspect`'s summary."""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.engine.gguf.info import dtype_name

if TYPE_CHECKING:
    from app.engine.gguf.info import GGUFInfo


def format_bytes(n: float) -> str:
    if n < 1024:
        return f"{int(n)} B"
    for unit in ("KiB", "MiB", "GiB"):
        n /= 1024
        if n < 1024 or unit == "GiB":
            return f"{n:.2f} {unit}" if unit == "GiB" else f"{n:.1f} {unit}"
    raise AssertionError("unreachable")


def _fmt_count(n: int) -> str:
    for div, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= div:
            return f"{n / div:.2f}{unit}" if unit == "B" else f"{n / div:.1f}{unit}"
    return str(n)


def _params_text(info: GGUFInfo) -> str:
    """'1.54B (1,543,714,304)', and what was left out where the file stores a tied output again."""
    text = f"{_fmt_count(info.n_params)} ({info.n_params:,})"
    if info.tied_output:
        text += (f"; the output layer repeats the token embeddings (tied, as the size label says): "
                 f"counted once, {_fmt_count(info.n_params + info.tied_output)} with both copies")
    return text


def format_info(info: GGUFInfo, dtype: str = "bfloat16", title: str | None = None) -> str:
    """Human-readable multi-line summary for `specula inspect`. `title`: the model's name as the
    library shows it (the hub's display_name); the header's own general.name is labelled as such."""
    def yn(v: bool | None) -> str:
        return "unset" if v is None else "yes" if v else "no"

    dt = dtype_name(dtype)
    kv = info.kv_bytes_per_token(dtype)
    types = ", ".join(f"{t}×{n}" for t, n in info.tensor_types.items())
    rows = [
        *([("model", title)] if title else []),
        ("file", f"{info.path.name} ({format_bytes(info.file_size)}, GGUF v{info.version})"),
        ("architecture", info.architecture),
        ("general.name", info.name or "-"),
        ("size label", info.size_label or "-"),
        ("parameters", _params_text(info)),
        ("file type", info.file_type or "-"),
        ("tensors", f"{len(info.tensors)} ({types})" if types else "0"),
        ("context length", f"{info.context_length:,}"),
        ("layers", str(info.n_layers)),
        ("embedding", str(info.n_embd)),
        ("heads", f"{info.n_head} (KV {info.n_head_kv}, head dim {info.head_dim})"),
        ("vocabulary", f"{info.vocab_size:,} tokens ({info.vocab_type or 'unknown type'})"),
        ("BOS / EOS", f"{info.bos_token_id} / {info.eos_token_id} "
                      f"(add BOS: {yn(info.add_bos_token)}, add EOS: {yn(info.add_eos_token)})"),
        ("chat template", "yes" if info.has_chat_template else "no"),
        (f"weights ({dt})", format_bytes(info.memory_bytes(dtype))),
        (f"KV cache ({dt})", f"{format_bytes(kv)} per token, "
                             f"{format_bytes(kv * info.context_length)} at full context"),
    ]
    width = max(len(k) for k, _ in rows) + 1
    return "\n".join(f"{k + ':':<{width}} {v}" for k, v in rows)
