"""What GGUF file names say: quantization, split parts, parameter counts.

Names follow llama.cpp's conventions: `Model-7B-Instruct-Q4_K_M.gguf`, `model.Q8_0.gguf`,
`model-q4_0.gguf`, unsloth's `UD-Q4_K_XL`, and `gguf-split` parts `...-00001-of-00003.gguf`.
A split model is one model: its first part names it and its parts are downloaded together.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

SPLIT_RE = re.compile(r"^(?P<stem>.+)-(?P<index>\d{5})-of-(?P<count>\d{5})\.gguf$", re.IGNORECASE)
_QUANT_TOKEN = re.compile(
    r"^(?:I?Q\d+(?:_[A-Z0-9]+)*|TQ\d+_\d+|BF16|F16|FP16|F32|FP32|MXFP4(?:_MOE)?)$", re.IGNORECASE)
_SIZE_RE = re.compile(r"(?<![A-Za-z0-9.])(\d+(?:\.\d+)?)\s*([BMK])(?![A-Za-z])", re.IGNORECASE)
_UNITS = {"K": 1e3, "M": 1e6, "B": 1e9}
# Projectors of vision models ship as GGUF too, but they are not language models.
_NOT_A_MODEL = re.compile(r"(^|/)(mmproj|imatrix)[^/]*$", re.IGNORECASE)


@dataclass(frozen=True)
class SplitName:
    first: str  # the repo path of part 1
    index: int  # 1-based
    count: int

    def parts(self) -> list[str]:
        stem = self.first[: -len("-00001-of-00000.gguf")]
        return [f"{stem}-{i:05d}-of-{self.count:05d}.gguf" for i in range(1, self.count + 1)]


def split_name(path: str) -> SplitName | None:
    """The split facts of a `-0000i-of-0000N.gguf` part, else None."""
    m = SPLIT_RE.match(path)
    if m is None or int(m["count"]) < 1 or not 1 <= int(m["index"]) <= int(m["count"]):
        return None
    count = int(m["count"])
    return SplitName(f"{m['stem']}-00001-of-{count:05d}.gguf", int(m["index"]), count)


def is_gguf(path: str) -> bool:
    return path.lower().endswith(".gguf")


def is_model_file(path: str) -> bool:
    """A GGUF language model (not a vision projector or an importance matrix)."""
    return is_gguf(path) and _NOT_A_MODEL.search(path) is None


def quant_label(path: str) -> str | None:
    """The quantization a file name states (upper case, e.g. "Q4_K_M", "UD-Q4_K_XL"), or None."""
    name = path.rsplit("/", 1)[-1]
    split = split_name(name)
    if split is not None:
        stem = split.first[: -len("-00001-of-00000.gguf")]
    else:
        stem = name[: -len(".gguf")] if is_gguf(name) else name
    tokens = re.split(r"[-.]", stem)
    for i in range(len(tokens) - 1, -1, -1):
        if _QUANT_TOKEN.match(tokens[i]):
            label = tokens[i].upper()
            if i > 0 and tokens[i - 1].upper() == "UD":
                label = "UD-" + label
            return label
    # Some repos keep each quantization in a folder: Q4_K_M/Model-Q4_K_M-00001-of-00002.gguf.
    folder = path.rsplit("/", 1)[0] if "/" in path else ""
    last = folder.rsplit("/", 1)[-1]
    return last.upper() if last and _QUANT_TOKEN.match(last) else None


def params_from_name(name: str) -> int | None:
    """A parameter count stated in a repo or file name ("Llama-3.2-1B" -> 1e9), else None.
    Mixture-of-experts names ("8x7B", "30B-A3B") give the total, which is what memory needs."""
    found = None
    for m in _SIZE_RE.finditer(name.replace("_", "-")):
        start = m.start()
        if start > 0 and name[start - 1] in "xX":  # "8x7B": the 7B is per expert
            continue
        value = float(m[1]) * _UNITS[m[2].upper()]
        if m[2].upper() == "K" or value < 1e6:  # "4K" context, "Q4_K": not a size
            continue
        found = max(found or 0, int(value))
    return found


# Rough bits per weight, only to order quantizations from small to large where sizes are unknown.
_QUANT_ORDER = ("IQ1", "Q1", "TQ1", "IQ2", "Q2", "TQ2", "IQ3", "Q3", "IQ4", "Q4", "MXFP4", "Q5", "Q6",
                "Q8", "BF16", "F16", "FP16", "F32", "FP32")


def quant_rank(label: str | None) -> int:
    """Smaller = fewer bits per weight; unknown labels sort last."""
    if not label:
        return len(_QUANT_ORDER)
    bare = label.removeprefix("UD-")
    for rank, prefix in enumerate(_QUANT_ORDER):
        if bare.startswith(prefix):
            return rank
    return len(_QUANT_ORDER)


def model_title(repo_id: str, path: str, file_type: str | None = None) -> str:
    """How the window names a downloaded model: its repository and quantization,
    "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF (Q4_1)" - never a cache path, never the file's
    internal general.name. The quantization is the file name's, else the header's file type;
    with neither, the file's name stands in."""
    quant = quant_label(path) or file_type
    return f"{repo_id} ({quant})" if quant else f"{repo_id} ({path.rsplit('/', 1)[-1]})"



def file_title(name: str) -> str:
    """A file's model as Specula names it where no repository or built-in title is known: its
    file name (which usually states the model and quantization) without ".gguf"; never the
    header's general.name, which is often cryptic ("Smollm2 135M 8k Lc100K Mix1 Ep2") and the
    same for every quantization."""
    return name[: -len(".gguf")] if name.lower().endswith(".gguf") else name
