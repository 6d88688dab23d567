"""Specula's engine: GGUF inspection and loading, drafters, sampling and the speculative loop.

Headless by design: no Qt here (an import-linter contract in pyproject.toml enforces it).
"""
