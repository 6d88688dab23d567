"""The door of `specula run`, `serve` and `compare`: a command's arguments parsed once into what
the engine takes, the reply engine's spec (app.engine.session: a PairSpec for Specula's own loop
here, a ServerSpec for llama-server started here or a server at a URL) and GenSettings. Nothing
below app.cli sees an argparse.Namespace; a flag out of range or in conflict is one line, exit 2.

`--engine llama-server` runs llama.cpp's own server and speculation, started here on 127.0.0.1
with the model, draft and --spec-type given (every llama.cpp type, also those Specula's own loop
does not run: draft-mtp, draft-eagle3, draft-dflash, draft-dspark)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from app.cli.flags import backend_kwargs
from app.cli.spec_args import IMPLEMENTED, NOT_IMPLEMENTED, UsageError, spec_choice
from app.hub.builtin import resolve_model_arg

if TYPE_CHECKING:
    from app.engine.pair_loader import PairSpec
    from app.engine.session import ServerSpec
    from app.engine.settings import GenSettings

SPECULA, LLAMA_SERVER = "specula", "llama-server"
ENGINES = (SPECULA, LLAMA_SERVER)
SERVER_ONLY = tuple(t for t in NOT_IMPLEMENTED if t not in IMPLEMENTED)
MAX_DRAFT = 1024  # far past any useful draft; 2**31 made the schedule allocate until the OOM killer came


def add_engine_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--engine", choices=ENGINES, default=None,
                        help="what runs the reply: specula (its own loop in this process, the default) or "
                             "llama-server (llama.cpp's own server and speculation, started here on 127.0.0.1; "
                             f"the default for a --spec-type only it runs: {', '.join(SERVER_ONLY)})")


def add_server_flags(parser: argparse.ArgumentParser, key_flag: str = "--api-key-file") -> None:
    """--server, --server-api and the remote's key file (`key_flag`: serve's own --api-key-file
    is its listening key, so serve names the remote's --server-api-key-file)."""
    parser.add_argument("--server", metavar="URL", default=None,
                        help="a server already running (here or elsewhere) answers instead: its URL, e.g. "
                             "http://127.0.0.1:8080 (https is verified): llama-server, or any speaking OpenAI's "
                             "API (vLLM, SGLang, Ollama, LM Studio, specula serve); -m then only names the model")
    parser.add_argument("--server-api", choices=("auto", "llama-server", "openai"), default="auto",
                        help="with --server: how to speak to it (default auto: llama-server's own API where it "
                             "answers /props as llama-server, else OpenAI's)")
    parser.add_argument(key_flag, dest="server_key_file", metavar="FILE", default=None,
                        help="with --server: a file holding its API key (read, never printed or logged)")
    parser.set_defaults(server_key_flag=key_flag)  # named in a key file's one-line errors


MAX_KEY_FILE_BYTES = 64 * 1024  # a key is a line; a larger file is not a key file


def read_api_key(path: str | None, flag: str = "--api-key-file") -> str | None:
    """The key in `path` (its first line), one line (exit 2) where it cannot be read: not a
    regular file (a folder, a FIFO, a device), too large, or not UTF-8."""
    from app.common.atomic import read_capped

    if not path:
        return None
    try:
        text = read_capped(path, MAX_KEY_FILE_BYTES, what="a key file").decode("utf-8")
    except (OSError, ValueError) as exc:  # UnicodeDecodeError is a ValueError
        why = "not UTF-8 text" if isinstance(exc, UnicodeDecodeError) else getattr(exc, "strerror", None) or exc
        raise UsageError(f"{flag}: cannot read {path}: {why}") from None
    key = text.strip().splitlines()[0].strip() if text.strip() else ""
    if not key or any(not c.isprintable() or c.isspace() for c in key):
        raise UsageError(f"{flag}: {path} holds no key on its first line")
    return key


def check_server_url(url: str) -> str:
    from app.engine.llama_server.spec import check_url

    try:
        return check_url(url)
    except ValueError as exc:
        raise UsageError(f"--server: {exc}") from None


def add_rpc_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rpc", metavar="HOST:PORT[,...]", default=None,
                        help="split the main model across llama.cpp RPC workers (specula rpc-worker) as llama.cpp's "
                             "--rpc does; runs on llama-server, so that a worker that goes away stops only it")


def engine_of(args: argparse.Namespace) -> str:
    """The engine the flags ask for: llama-server for a type only it runs and for --rpc (a lost
    RPC worker aborts the llama.cpp process that uses it: a child, never Specula)."""
    server_only = [t for t in (getattr(args, "spec_type", None) or ()) if t in SERVER_ONLY]
    needs = (f"--spec-type {server_only[0]}" if server_only else "--rpc" if getattr(args, "rpc", None)
             else "--server" if getattr(args, "server", None) else None)
    if args.engine == SPECULA and needs:
        raise UsageError(f"{needs} runs only on llama-server (--engine llama-server)")
    return args.engine or (LLAMA_SERVER if needs else SPECULA)


def rpc_endpoints(value: str) -> list[str]:
    """HOST:PORT,... checked (one line, exit 2, for anything else)."""
    from app.engine.llama_server.spec import check_rpc_endpoints

    try:
        return list(check_rpc_endpoints(value))
    except ValueError as exc:
        raise UsageError(f"--rpc {exc}" if str(exc).startswith("needs") else f"--rpc: {exc}") from None


# run's speculative values that llama-server takes under the same name, where not left at the default.
_SAME_NAME = ("--spec-ngram-mod-n-match", "--spec-ngram-mod-n-min", "--spec-ngram-mod-n-max",
              *(f"--spec-{kind}-{part}" for kind in ("ngram-map-k", "ngram-map-k4v")
                for part in ("size-n", "size-m", "min-hits")))
_FORWARDED = (("draft_max", "--spec-draft-n-max"), ("draft_min", "--spec-draft-n-min"),
              ("draft_p_min", "--spec-draft-p-min"), *((flag[2:].replace("-", "_"), flag) for flag in _SAME_NAME))


def server_engine(args: argparse.Namespace):
    """The engine run's flags ask for: a server at --server's URL, else llama-server started
    here with llama-server's own names for run's flags, and llama.cpp's defaults for the
    speculative values run leaves at Specula's (a ceiling of 64 for our measured length is not
    llama.cpp's fixed length)."""
    from app.cli.spec_args import add_spec_flags
    from app.engine.llama_server.spec import ServerEngine

    if getattr(args, "server", None):  # a server someone else runs: its model, its speculation
        return ServerEngine(url=check_server_url(args.server), api_key=read_api_key(args.server_key_file,
                                                                                    args.server_key_flag),
                            api=getattr(args, "server_api", "auto"), model_name=args.model)
    types = tuple(t for t in (args.spec_type or ()) if t != "none") + (("ngram-simple",) if args.lookup else ())
    defaults = argparse.ArgumentParser()
    add_spec_flags(defaults)
    values = []
    for dest, flag in _FORWARDED:
        value = getattr(args, dest, None)
        if value is not None and value != defaults.get_default(dest):
            values.append((flag, str(value)))
    return ServerEngine(
        spec_types=tuple(dict.fromkeys(types)),
        draft=resolve_model_arg(args.model_draft) if args.model_draft else None,
        rpc=tuple(rpc_endpoints(args.rpc)) if getattr(args, "rpc", None) else (),
        threads=args.threads or 0, ctx_size=args.ctx_size or 0, n_gpu_layers=args.n_gpu_layers,
        n_gpu_layers_draft=args.n_gpu_layers_draft, ctx_size_draft=args.ctx_size_draft or 0,
        flash_attn=args.flash_attn, spec_values=tuple(values))


def settings_from_args(args: argparse.Namespace) -> GenSettings:
    """The flags' reply length, sampling and drafting in the engine's one settings shape (its
    decode_settings checks what the engine refuses); a flag out of range is one line, exit 2."""
    from app.engine.settings import GenSettings

    for name in ("n_predict", "draft_max"):
        if getattr(args, name, 1) < 1:
            raise SystemExit(f"specula: error: --{name.replace('_', '-')} must be at least 1")
    if getattr(args, "draft_max", 1) > MAX_DRAFT:  # the draft-length schedule sizes tables by it
        raise SystemExit(f"specula: error: --spec-draft-n-max must be at most {MAX_DRAFT}")
    return GenSettings(
        max_tokens=args.n_predict, temperature=args.temp, top_k=args.top_k, top_p=args.top_p,
        min_p=args.min_p, seed=args.seed, draft_max=args.draft_max, draft_min=args.draft_min,
        draft_p_min=args.draft_p_min, adaptive_draft=not getattr(args, "draft_fixed", False),
    )


def pair_spec(args: argparse.Namespace) -> PairSpec:
    """The flags parsed once into the engine's PairSpec; the drafting flags are checked together
    here (one line, exit 2)."""
    from app.engine.drafting.factory import MapParams, ModParams
    from app.engine.pair_loader import PairSpec

    choice = spec_choice(args)
    return PairSpec(
        resolve_model_arg(args.model), resolve_model_arg(choice.draft_model) if choice.draft_model else None,
        ngram=choice.ngram, mod=ModParams(*choice.mod), map_k=MapParams(*choice.map_k),
        map_k4v=MapParams(*choice.map_k4v), cache_file=choice.cache_file,
        draft_ctx=getattr(args, "ctx_size_draft", 0) or getattr(args, "ctx_size", 0) or None, device=args.device, dtype=args.dtype,
        n_gpu_layers=args.n_gpu_layers, n_gpu_layers_draft=getattr(args, "n_gpu_layers_draft", None),
        **backend_kwargs(args),
    )


def engine_spec(args: argparse.Namespace) -> "PairSpec | ServerSpec":
    """The reply engine the flags ask for, parsed once: Specula's own loop here (PairSpec), or
    llama-server started here or the server at --server (ServerSpec)."""
    from app.engine.session import ServerSpec

    if not args.model and not getattr(args, "server", None):
        raise UsageError("-m/--model is required (a GGUF file or a built-in name), unless --server URL names "
                         "a server, which has its own model")
    if engine_of(args) == SPECULA:
        return pair_spec(args)
    engine = server_engine(args)
    return ServerSpec(engine, None if engine.url else resolve_model_arg(args.model), check=False)


def local_options(args: argparse.Namespace):
    """The main model's context (-c) for Specula's own loop; llama-server takes it as its -c."""
    from app.engine.session import LocalOptions

    return LocalOptions(n_ctx=getattr(args, "ctx_size", 0) or None)


