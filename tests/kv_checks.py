"""Checks shared by the tests of row-exact verifies."""

from __future__ import annotations

import torch


def verify_and_steps(kv, prompt: list[int], drafts: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(the logits of one verify of `drafts` after `prompt`, those of one-token steps over the
    same drafts), from the same KV cache rewound in between."""
    kv.feed(prompt)
    one_by_one = torch.stack([kv.feed([t])[0] for t in drafts])
    kv.rewind(len(prompt))
    return kv.feed(drafts, len(drafts)), one_by_one
