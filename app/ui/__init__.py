"""The desktop window: PySide6 + pyqtgraph views. Never imports torch or transformers (see pyproject)."""
