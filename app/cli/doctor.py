"""`specula doctor`: llama.cpp's self-test run again now, whatever verdict is cached, and what this
installation has (llama.cpp's version, llama-server and rpc-server), one line each. The way back
after a self-test that failed for a reason that has gone (memory, a busy machine)."""

from __future__ import annotations

import argparse


def register(sub) -> None:
    doctor = sub.add_parser("doctor", help="run llama.cpp's self-test again and say what this installation has")
    doctor.set_defaults(func=cmd_doctor)


def cmd_doctor(args: argparse.Namespace) -> int:
    from app.engine.backends.llamacpp import lib as llamacpp_lib, probe as llamacpp_probe
    from app.engine.llama_server.programs import RPC_SERVER, SERVER, find_program, missing_reason

    problem = llamacpp_lib.import_problem()
    if problem is not None:
        print(f"llama.cpp: {problem}")
        return 1
    ok, why = llamacpp_probe.probe(fresh=True)
    print(f"llama.cpp {llamacpp_lib.version()}: self-test " + ("passed on this CPU" if ok else f"failed: {why}"))
    if llamacpp_probe.variants_note():
        print(llamacpp_probe.variants_note())
    for name in (SERVER, RPC_SERVER):
        found = find_program(name)
        print(f"{name}: {found}" if found else f"{name}: {missing_reason(name)}")
    return 0 if ok else 1
