"""`specula rpc-worker`: llama.cpp's rpc-server (built with Specula, same llama.cpp commit), a
worker that holds and computes part of a model for a llama.cpp on another machine
(`specula run --rpc HOST:PORT,...`). It binds 127.0.0.1 unless told otherwise; llama.cpp's RPC has
no authentication, so another address gets llama.cpp's own warning in one line."""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile

from app.engine.llama_server.spec import LOOPBACK_HOSTS, RPC_WARNING

WARNING = f"warning: {RPC_WARNING}"


def register(sub) -> None:
    worker = sub.add_parser("rpc-worker", help="hold and compute part of a model for llama.cpp elsewhere (llama.cpp's rpc-server)")
    worker.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; RPC has no authentication)")
    worker.add_argument("--port", type=int, default=50052, help="port (default 50052, as llama.cpp)")
    worker.add_argument("-t", "--threads", type=int, default=0, help="CPU threads (default: llama.cpp's, half the cores)")
    worker.add_argument("-c", "--cache", action="store_true", help="keep received tensors in a local file cache (llama.cpp's -c)")
    worker.set_defaults(func=cmd_rpc_worker)


def worker_command(args: argparse.Namespace, program: str) -> list[str]:
    cmd = [program, "-H", args.host, "-p", str(args.port)]
    if args.threads > 0:
        cmd += ["-t", str(args.threads)]
    if args.cache:
        cmd.append("-c")
    return cmd


def cmd_rpc_worker(args: argparse.Namespace) -> int:
    from app.engine.llama_server.programs import (RPC_SERVER, find_program, missing_reason, start_program,
                                                  telling_line)

    program = find_program(RPC_SERVER)
    if program is None:
        print(f"specula: error: {missing_reason(RPC_SERVER)}", file=sys.stderr)
        return 1
    if not 0 < args.port < 65536:
        print("specula: error: --port must be between 1 and 65535", file=sys.stderr)
        return 2
    if args.host not in LOOPBACK_HOSTS:
        print(f"specula: {WARNING}", file=sys.stderr)
    print(f"specula: RPC worker on {args.host}:{args.port} (Ctrl-C stops it)", file=sys.stderr, flush=True)
    with tempfile.TemporaryFile(prefix="specula-rpc-worker-") as log:
        worker = start_program(worker_command(args, str(program)), stdin=subprocess.DEVNULL, stdout=log,
                               stderr=subprocess.STDOUT)
        try:
            code = worker.wait()
        except KeyboardInterrupt:
            worker.terminate()
            worker.wait()
            return 0
        log.seek(0)
        lines = [line.strip() for line in log.read(1 << 20).decode("utf-8", "replace").splitlines() if line.strip()]
    # It serves until stopped: ending by itself is a failure, whatever its exit code (llama.cpp's
    # rpc-server exits 0 after "Failed to create server socket").
    why = telling_line(lines)
    if "server socket" in why:  # rpc-server says no more than that when it cannot bind
        why += f" (is port {args.port} in use, e.g. by another worker, or {args.host} not this machine's?)"
    print(f"specula: error: the RPC worker stopped (exit {code}): {why}", file=sys.stderr)
    return 1
