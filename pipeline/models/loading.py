"""Loading a local Hugging Face model folder (never from a hub): its tokenizer, which must have a
chat template, and its causal LM; a LoRA checkpoint (a peft adapter folder naming a local base
model) is loaded as its base with the adapter merged in."""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.errors import ConfigError

__all__ = ["load_tokenizer", "load_model", "adapter_base", "ADAPTER_CONFIG", "left_padded"]


def load_tokenizer(model_dir: str | Path):
    """The tokenizer of a local model dir (never downloads); it must have a chat template."""
    from transformers import AutoTokenizer

    model_dir = _local_dir(model_dir)
    tok = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    if not tok.chat_template:
        raise ConfigError(f"model_dir {model_dir} has no chat template; maxit renders every prompt with one")
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def load_model(model_dir: str | Path, dtype=None):
    """The causal LM of a local model dir (never downloads), in `dtype` (default float32), eval
    mode. A LoRA checkpoint is loaded as its base model with the adapter merged in."""
    import torch
    from transformers import AutoModelForCausalLM

    model_dir = _local_dir(model_dir)
    base = adapter_base(model_dir)
    model = AutoModelForCausalLM.from_pretrained(
        str(base or model_dir), dtype=dtype or torch.float32, local_files_only=True
    )
    if base is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(model_dir)).merge_and_unload()
    return model.eval()


ADAPTER_CONFIG = "adapter_config.json"
"""The file that makes a folder a LoRA checkpoint (peft's adapter config)."""


def adapter_base(model_dir: str | Path) -> Path | None:
    """The base model folder of a LoRA checkpoint (a folder with peft's `adapter_config.json`,
    whose `base_model_name_or_path` names a local model folder), or None for a full model."""
    path = Path(model_dir)
    config_file = path / ADAPTER_CONFIG
    if not config_file.is_file():
        return None
    try:
        base = json.loads(config_file.read_text(encoding="utf-8")).get("base_model_name_or_path")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ConfigError(f"LoRA checkpoint {path}: {ADAPTER_CONFIG} is not readable JSON ({err})") from None
    if not base:
        raise ConfigError(f"LoRA checkpoint {path}: {ADAPTER_CONFIG} names no base_model_name_or_path")
    base = Path(base)
    if not base.is_absolute():
        base = (path / base).resolve()
    if not (base / "config.json").is_file():
        raise ConfigError(f"LoRA checkpoint {path}: its base model folder {base} ({ADAPTER_CONFIG}'s base_model_name_or_path) has no config.json")
    return base


def _local_dir(model_dir: str | Path) -> Path:
    p = Path(model_dir)
    if not (p / "config.json").is_file() and not (p / ADAPTER_CONFIG).is_file():
        raise ConfigError(f"model_dir {str(model_dir)!r} is not a local model directory (no config.json)")
    return p


def left_padded(rows: list[list[int]], pad_id: int):
    """(input_ids, attention_mask) of token-id rows padded on the left to the longest, the batch
    a decoder-only `generate` call takes (its new tokens follow every row's last token)."""
    import torch

    L = max(len(r) for r in rows)
    ids = torch.full((len(rows), L), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for j, r in enumerate(rows):
        ids[j, L - len(r) :] = torch.tensor(r)
        mask[j, L - len(r) :] = 1
    return ids, mask
