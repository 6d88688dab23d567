"""Specula's engine: GGUF files run on a backend, with the speculation on top.

- `loader` loads a file on the backend chosen for it; `seam` is what the loop drives;
- `loop/`: the speculative loop, the draft-length schedule, sampling, chat prompts, events;
- `drafting/`: the drafters, the kinds a user picks, whether a draft fits a main model;
- `backends/`: llama.cpp (the default) and torch (the fallback), and the choice between them;
- `gguf/`: the header reader and its checks, and files derived from a model.

Headless by design: no Qt here (an import-linter contract in pyproject.toml enforces it).
"""
