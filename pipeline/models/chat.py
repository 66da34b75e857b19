"""Rendering chat messages to prompt token ids: the one place both sampling and training
contexts are built, so the two always use the same chat template."""

from __future__ import annotations

import hashlib
import json
from typing import Sequence

from pipeline.types import Message

__all__ = ["encode_prompt", "prompt_hash"]


def encode_prompt(tokenizer, messages: Sequence[Message]) -> list[int]:
    """Token ids of `messages` rendered with the tokenizer's chat template, ending with the
    generation prompt of the assistant turn."""
    ids = tokenizer.apply_chat_template(
        [{"role": m["role"], "content": m["content"]} for m in messages],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
    )
    if hasattr(ids, "tolist"):
        ids = ids.tolist()
    if isinstance(ids, dict) or (hasattr(ids, "keys") and "input_ids" in ids):
        ids = ids["input_ids"]
    return [int(i) for i in ids]


def prompt_hash(prompt_ids: Sequence[int]) -> str:
    """A stable short hash of a prompt's token ids (equal across the N candidates of a tree node)."""
    return hashlib.blake2b(json.dumps(list(map(int, prompt_ids))).encode(), digest_size=12).hexdigest()
