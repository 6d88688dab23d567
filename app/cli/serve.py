"""`specula serve`: llama-server's job, an OpenAI-compatible local server with speculative decoding.

    specula serve -m MAIN [-md DRAFT] [--spec-type ngram-simple,ngram-cache [-lcd FILE]]
                  [--host 127.0.0.1] [--port 8080] [--api-key KEY] [--cors-origin ORIGIN ...]
    specula serve --engine llama-server --spec-type ngram-mod -m MAIN [--rpc HOST:PORT,...]
    specula serve --server URL [--server-api-key-file F] -m NAME

On llama-server (started here) or a server at a URL the same routes and policy answer; the
replies come from that engine (app.engine.session: the server never asks which it holds).

The sampling flags (--temp 0.8, --top-k 40, ...) are the defaults of requests that do not set
them, as in llama-server. The server (Starlette, uvicorn, torch) is imported only by the command.
"""

from __future__ import annotations

import argparse
import sys

from app.cli.flags import add_model_flags, add_sampling_flags
from app.cli.request import (LLAMA_SERVER, add_engine_flag, add_rpc_flag, add_server_flags, engine_of, engine_spec,
                             local_options, read_api_key, settings_from_args)
from app.cli.spec_args import UsageError, spec_choice
from app.hub.builtin import BUILTIN_MODELS


def register(sub) -> None:
    serve = sub.add_parser("serve", help="an OpenAI-compatible HTTP server (chat and text completions)")
    add_model_flags(serve, server=True)
    add_engine_flag(serve)
    add_rpc_flag(serve)
    add_server_flags(serve, key_flag="--server-api-key-file")
    add_sampling_flags(serve, n_predict=-1, n_predict_help="tokens to generate when a request sets no "
                       "max_tokens (-1 = up to the end of the context, the default)")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; any other needs --api-key)")
    serve.add_argument("--port", type=int, default=8080, help="port to listen on (default 8080; 0 = any free port)")
    key = serve.add_mutually_exclusive_group()
    key.add_argument("--api-key", help="require this key (Authorization: Bearer KEY) on every endpoint but /health")
    key.add_argument("--api-key-file", help="read the API key from this file (keeps it out of the process list)")
    serve.add_argument("-a", "--alias", help="the model's name in the API (default: the file's stem or the built-in name)")
    serve.add_argument("--queue", type=int, default=8, help="requests that may wait while one generates; more get 503 (default 8)")
    serve.add_argument("--cors-origin", action="append", default=[], metavar="ORIGIN",
                       help="let web pages from ORIGIN (scheme://host[:port]) use the server, besides "
                       "this machine's loopback origins; repeatable; * allows every origin (see SECURITY.md)")
    serve.set_defaults(func=cmd_serve)


def api_key_from_args(args: argparse.Namespace) -> str | None:
    key = args.api_key
    if args.api_key_file:  # its first line, as run reads a key file
        try:
            key = read_api_key(args.api_key_file)
        except UsageError as exc:
            raise SystemExit(f"specula: error: {exc}") from None
    if key is not None and not key.strip():
        raise SystemExit("specula: error: the API key is empty")
    if key is not None and key != key.strip():
        # Clients' Authorization values lose such spaces on the way: the key could never match.
        raise SystemExit("specula: error: the API key starts or ends with whitespace; remove it (quoting?)")
    return key


def cors_origins_from_args(args: argparse.Namespace, api_key: str | None) -> tuple[str, ...]:
    from app.server.origin import check_any_origin_has_key, parse_allowed_origins

    try:
        origins = parse_allowed_origins(args.cors_origin)
        check_any_origin_has_key(origins, api_key)
    except ValueError as exc:
        raise SystemExit(f"specula: error: {exc}") from None
    return origins


def check_args(args: argparse.Namespace) -> None:
    if not 0 <= args.port <= 65535:
        raise SystemExit("specula: error: --port must be between 0 and 65535")
    if args.queue < 0:
        raise SystemExit("specula: error: --queue must be 0 or more")
    if args.n_predict == 0 or args.n_predict < -1:
        raise SystemExit("specula: error: -n must be -1 (up to the context) or at least 1")


def default_settings(args: argparse.Namespace):
    """The requests' defaults from the flags, checked (a NaN --temp is one line, before anything
    is bound or loaded, rather than a 500 on every request that leaves the field out)."""
    # settings_from_args wants n_predict >= 1; requests set their own.
    settings = settings_from_args(argparse.Namespace(**{**vars(args), "n_predict": max(1, args.n_predict)}))
    settings.decode_settings()  # checked now: a SpeculaError is the one line
    return settings


def open_served(args: argparse.Namespace, defaults):
    """(the served model, its session): the engine the flags name, opened now, before the ready
    line (loaded here, llama-server started, or the server at --server connected)."""
    from app.engine.reply_engine import open_session
    from app.server.model import ServedModel

    spec = engine_spec(args)
    at_url = bool(getattr(args, "server", None))  # -m then only names the model the server serves
    builtin = args.model if args.model in {m.key for m in BUILTIN_MODELS} else None
    session = open_session(spec, options=local_options(args))
    try:
        served = ServedModel.create(session, defaults, model_id=args.alias or builtin or (args.model if at_url else None),
                                    names=[builtin] if builtin else [],
                                    default_max_tokens=args.n_predict if args.n_predict > 0 else None)
    except BaseException:
        session.close()
        raise
    return served, session


def cmd_serve(args: argparse.Namespace) -> int:
    from app.server.app import ServerConfig, create_app
    from app.server.launch import ManagedServer, bind_socket, check_bind_allowed

    check_args(args)
    on_server = engine_of(args) == LLAMA_SERVER
    if not on_server:
        spec_choice(args)  # conflicting drafting flags: one line before the port is bound
    defaults = default_settings(args)
    api_key = api_key_from_args(args)
    origins = cors_origins_from_args(args, api_key)
    check_bind_allowed(args.host, api_key)
    sock = bind_socket(args.host, args.port)  # before the load: a busy port fails in a second
    session = None
    try:
        served, session = open_served(args, defaults)
        app = create_app(served, ServerConfig(api_key=api_key, max_waiting=args.queue, cors_origins=origins))

        def ready(url: str) -> None:
            key = "API key required" if api_key else "no API key"
            named = f" ({served.title})" if served.title not in ("", served.model_id) else ""
            print(f"specula: serving {served.model_id}{named} (drafter: {served.drafter_name}, context "
                  f"{served.n_ctx or 'not known'}, {key}) at {url}/v1; Ctrl-C stops", file=sys.stderr, flush=True)

        server = ManagedServer(app, sock, verbose=getattr(args, "verbose", False), on_ready=ready)
        try:
            server.run_here()
        except KeyboardInterrupt:
            pass  # uvicorn re-raises the Ctrl-C (SIGTERM, SIGHUP: app.cli) it has already handled by shutting down
    finally:
        sock.close()
        if session is not None:
            session.save_learned()  # what the requests taught the n-gram cache (-lcd)
            session.close()  # stops the llama-server started here
    print("specula: server stopped", file=sys.stderr)
    return 0
