"""One name for a model everywhere: the window's library, `specula inspect`, `specula hub info`
and the server's /v1/models name a file the same way.

A built-in model by its title ("SmolLM2 135M Instruct (Q4_1)"), a file of the Hugging Face cache
by its repository and quantization ("HuggingFaceTB/SmolLM2-135M-Instruct-GGUF (Q4_1)"), any other
file by its file name without ".gguf". Never the header's general.name: it is often cryptic
("Smollm2 135M 8k Lc100K Mix1 Ep2") and the same for every quantization of a model.
"""

from __future__ import annotations

from pathlib import Path

from app.hub.builtin import title_of_path
from app.hub.names import file_title, model_title

_REPO_FOLDER_PREFIX = "models--"  # huggingface_hub's folder of a model repository: models--owner--name


def display_name(path: Path, file_type: str | None = None) -> str:
    """How Specula names the model in the GGUF file at `path` (file_type: the header's, which
    names the quantization where the file name does not)."""
    path = Path(path)
    builtin = title_of_path(path)
    if builtin is not None:
        return builtin
    cached = cache_repo_file(path)
    if cached is not None:
        return model_title(*cached, file_type)
    return file_title(path.name)


def cache_repo_file(path: Path) -> tuple[str, str] | None:
    """(repo id, file path in the repo) of a file in a Hugging Face cache's snapshots, else None."""
    parts = Path(path).parts
    for i in range(len(parts) - 3, 0, -1):
        if parts[i] == "snapshots" and parts[i - 1].startswith(_REPO_FOLDER_PREFIX):
            repo_id = parts[i - 1][len(_REPO_FOLDER_PREFIX):].replace("--", "/")
            return repo_id, "/".join(parts[i + 2:])
    return None
