"""The layering rule of docs/architecture.md (Layers), enforced by import-linter's contracts in pyproject.toml."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_import_contracts_hold():
    lint = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run([str(lint)], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "broken" not in result.stdout.lower().replace("0 broken", "")


def test_the_window_takes_byte_sizes_from_its_own_format_module():
    """One definition of format_bytes (app.engine.gguf.format, which engine, hub and CLI share); the
    window's files take it, with the rest of their text formats, from app.ui.common.format and never
    reach into the engine for it (issue 49 item 7)."""
    import ast

    from app.engine.gguf import format as gguf_format
    from app.ui.common import format as ui_format

    assert ui_format.format_bytes is gguf_format.format_bytes
    reaching = []
    for path in sorted((ROOT / "app" / "ui").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module in ("app.engine.gguf.info", "app.engine.gguf.format"):
                if any(alias.name == "format_bytes" for alias in node.names) and path.name != "format.py":
                    reaching.append(str(path.relative_to(ROOT)))
    assert reaching == []
