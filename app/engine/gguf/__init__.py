"""GGUF files: the header reader and its checks (no weights read), and derived files."""
