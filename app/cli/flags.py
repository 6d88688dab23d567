"""The flags several commands share (the model, the backend, sampling), kept apart from
app.cli's parser so that each command imports them without importing the package that imports
every command."""

from __future__ import annotations

import argparse

from app.engine.settings import GenSettings
from app.hub.builtin import BUILTIN_NAMES


def add_model_flags(parser: argparse.ArgumentParser, draft: bool = True, server: bool = False) -> None:
    # With --server the server names its model: -m there only picks one of several it serves.
    parser.add_argument("-m", "--model", required=not server,
                        help=f"main model: a GGUF file or a built-in name ({BUILTIN_NAMES})"
                             + ("; with --server, optional: which of the server's models to ask" if server else ""))
    parser.add_argument("-c", "--ctx-size", type=int, default=0, help="context size of the main model (0 = the model's own)")
    parser.add_argument("-ngl", "--n-gpu-layers", type=int, default=None, help="layers of the main model computed on the GPU (99 = all; default: all when there is a GPU)")
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda", "mps"], help="where to run (default auto)")
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"], help="torch backend: weight dtype once loaded (auto: on a GPU bf16 or f16, on the CPU float32; any other value means torch)")
    add_backend_flags(parser)
    if draft:
        from app.cli.spec_args import add_spec_flags

        add_spec_flags(parser, server)


def add_backend_flags(parser: argparse.ArgumentParser) -> None:
    """--backend and llama.cpp's own run-time flags (its names and defaults)."""
    from app.engine.backends import AUTO, BACKEND_CHOICES

    parser.add_argument("--backend", default=AUTO, choices=BACKEND_CHOICES, help="what runs the model (default auto: llama.cpp where it runs here, else torch, saying why)")
    parser.add_argument("-t", "--threads", type=int, default=0, help="llama.cpp: threads (default 0 = the physical cores, as llama.cpp)")
    parser.add_argument("-fa", "--flash-attn", default="auto", choices=["on", "off", "auto"], help="llama.cpp: flash attention (default auto, as llama.cpp)")
    parser.add_argument("--no-repack", action="store_true", help="llama.cpp: keep weights in the file's layout instead of its repacked CPU kernels' (as llama.cpp's --no-repack)")


def backend_kwargs(args: argparse.Namespace) -> dict:
    """load_model's backend and llama.cpp settings from the flags above (imports the engine)."""
    from app.engine.backends.llamacpp.kv import LlamaSettings

    flash = {"on": 1, "off": 0, "auto": -1}[getattr(args, "flash_attn", "auto")]
    return {"backend": getattr(args, "backend", "auto"),
            "llama": LlamaSettings(threads=max(0, getattr(args, "threads", 0)), flash_attn=flash,
                                   repack=not getattr(args, "no_repack", False))}


def add_sampling_flags(parser: argparse.ArgumentParser, temp: float | None = None, n_predict: int | None = None,
                       n_predict_help: str | None = None) -> None:
    """-n, --temp, --top-k, --top-p, --min-p and --seed, their defaults GenSettings()'s (the
    window's and `specula run`'s) unless a command gives its own temperature or length."""
    d = GenSettings()
    temp = d.temperature if temp is None else temp
    n_predict = d.max_tokens if n_predict is None else n_predict
    parser.add_argument("-n", "--n-predict", type=int, default=n_predict,
                        help=n_predict_help or f"most tokens to generate (default {n_predict})")
    parser.add_argument("--temp", type=float, default=temp, help=f"temperature; 0 = greedy (default {temp})")
    parser.add_argument("--top-k", type=int, default=d.top_k, help=f"keep the k most likely tokens (0 = off, default {d.top_k})")
    parser.add_argument("--top-p", type=float, default=d.top_p, help=f"keep the smallest set with this probability mass (1 = off, default {d.top_p})")
    parser.add_argument("--min-p", type=float, default=d.min_p, help=f"drop tokens below this fraction of the top probability (0 = off, default {d.min_p})")
    parser.add_argument("--seed", type=int, default=d.seed, help=f"random seed ({d.seed} = random)")
