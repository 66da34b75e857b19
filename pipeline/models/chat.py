"""Rendering chat messages to prompt token ids: the one place both sampling and training
contexts are built, so the two always use the same chat template."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Sequence

from pipeline.errors import ConfigError
from pipeline.types import Message

__all__ = ["encode_prompt", "prompt_hash", "check_model_dir"]

# files that hold a tokenizer's vocabulary: the fast tokenizer's, or a slow one's (BPE, SentencePiece, WordPiece)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "spiece.model", "vocab.txt")
# where transformers looks for a chat template besides tokenizer_config.json's "chat_template" key
CHAT_TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")


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


def check_model_dir(model_dir: str | Path, flag: str = "--model-dir") -> Path:
    """Check, from its files alone (nothing is loaded), that `model_dir` is a local Hugging Face
    model folder maxit can sample from and train: `config.json`, a tokenizer and a chat template
    (every prompt is rendered with one). Raises `ConfigError` naming `flag`, the folder and what
    is missing."""
    path = Path(model_dir)
    if not path.is_dir():
        raise ConfigError(f"{flag} {path}: " + ("is a file, not a model folder" if path.exists() else "no such folder"))
    if not (path / "config.json").is_file():
        raise ConfigError(f"{flag} {path}: not a Hugging Face model folder (no config.json)")
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        raise ConfigError(f"{flag} {path}: the folder has no tokenizer (none of {', '.join(TOKENIZER_FILES)})")
    if not any((path / name).is_file() for name in CHAT_TEMPLATE_FILES) and not _config_has_template(path / "tokenizer_config.json"):
        raise ConfigError(
            f"{flag} {path}: the folder has no chat template (no {' or '.join(CHAT_TEMPLATE_FILES)}, no 'chat_template' in "
            "tokenizer_config.json); maxit renders every prompt with one"
        )
    return path


def _config_has_template(config_file: Path) -> bool:
    if not config_file.is_file():
        return False
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return isinstance(config, dict) and bool(config.get("chat_template"))
