"""Specula: local GGUF language models with speculative decoding."""

__version__ = "0.1.0"
APP_NAME = "Specula"
