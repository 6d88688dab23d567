"""The backend choice is spelled once (issue 49 item 5): app.engine.backends names auto, llama.cpp
and torch; the window's backend list, the offload estimate and the command line's --backend use
those names, so no code outside the backends tests a backend by a string of its own."""

from __future__ import annotations

import ast
from pathlib import Path

from app.engine.backends import AUTO, BACKEND_CHOICES, LLAMA_CPP, TORCH

APP = Path(__file__).resolve().parents[2] / "app"
BACKENDS = APP / "engine" / "backends"


def bare_backend_tests(path: Path) -> list[str]:
    """`x == "torch"`-style comparisons (== or !=) with a backend's name written out."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Compare) and any(isinstance(op, (ast.Eq, ast.NotEq)) for op in node.ops):
            for side in (node.left, *node.comparators):
                if isinstance(side, ast.Constant) and side.value in (LLAMA_CPP, TORCH):
                    found.append(f"{path.relative_to(APP.parent)}:{node.lineno}")
    return found


def test_no_backend_is_tested_by_a_bare_string_outside_the_backends():
    found = [hit for path in sorted(APP.rglob("*.py")) if BACKENDS not in path.parents
             for hit in bare_backend_tests(path)]
    assert found == []


def test_the_window_and_the_command_line_offer_the_backends_names():
    from app.cli import build_parser
    from app.ui.models.pair_picker import BACKEND_LABELS

    assert tuple(value for _, value in BACKEND_LABELS) == BACKEND_CHOICES == (AUTO, LLAMA_CPP, TORCH)
    parser = build_parser()
    for choice in BACKEND_CHOICES:
        assert parser.parse_args(["run", "-m", "x.gguf", "-p", "hi", "--backend", choice]).backend == choice
