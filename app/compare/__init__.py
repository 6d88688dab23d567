"""Compare drafts side by side: run one main model with several drafters over a prompt set, headless (no Qt).

- prompts: the built-in prompts by category, the user's own text, prompt files (JSON lines or paragraphs)
- choices: --drafts names -> DraftChoice (a file, a built-in model, a hub file), and the configurations
- results: frozen data (CompareRequest, CompareRun, PromptResult holding the engine's RunSummary,
  RunSettings holding its GenSettings ...), JSON save/load (atomic)
- file_versions: older comparison files brought to today's shape on load
- runner: the run itself (imports torch; the window reaches it through app.worker.compare_task)
- summary: table rows, speedups, the verdict line, curves, deltas from an earlier run
- export: the text table and CSV
- memory: peak resident memory sampled while a configuration runs

Everything but `runner` is plain Python that imports neither torch nor Qt.
"""
