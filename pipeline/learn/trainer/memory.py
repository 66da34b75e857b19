"""Memory and precision of a run, decided for its rows and its model before it starts
(`sized_for`): the micro-batch size under the token and activation budgets, automatic gradient
checkpointing, the precision (`train_dtype`), the logits budget (`logit_elements`) and the longest
row trained on (`max_train_length`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import torch

from pipeline.config.train import ACTIVATION_VALUES_PER_TOKEN, CHECKPOINTING_PARAMETERS, TrainConfig
from pipeline.engines.config import resolve_dtype
from pipeline.learn.trainer.forward import common_prefix

__all__ = ["logit_elements", "max_train_length", "activation_bytes_per_token", "common_prompt_prefix", "sized_for", "train_dtype", "autocast_dtype_of"]


def logit_elements(mb: float) -> int | None:
    """`TrainConfig.logits_chunk_mb` as a count of float32 logits (None: no budget)."""
    return int(mb * 2**20 / 4) if mb > 0 else None


def max_train_length(config: TrainConfig, model_config) -> int:
    """Longest prompt + completion a run trains on: `config.max_length`, else the model's
    `max_position_embeddings`, else no limit (2**30)."""
    return config.max_length or int(getattr(model_config, "max_position_embeddings", 0) or 1 << 30)


def activation_bytes_per_token(model) -> int:
    """Estimated activation bytes a token keeps for the backward pass (`TrainConfig.activation_mb`):
    hidden_size x num_hidden_layers x `ACTIVATION_VALUES_PER_TOKEN` float32 values; 0 when the
    model's config does not say."""
    cfg = getattr(model, "config", None)
    hidden, layers = getattr(cfg, "hidden_size", None), getattr(cfg, "num_hidden_layers", None)
    if not isinstance(hidden, int) or not isinstance(layers, int):
        return 0
    return hidden * layers * ACTIVATION_VALUES_PER_TOKEN * 4


def common_prompt_prefix(table: pa.Table) -> int:
    """`common_prefix` of the training prompts of every row of a view table."""
    return common_prefix(table.column("train_prompt_ids").to_pylist())


def sized_for(config: TrainConfig, table: pa.Table, model) -> TrainConfig:
    """`config` with its memory settings resolved for these rows and this model: the micro-batch
    size under `micro_batch_tokens` and `activation_mb` (the largest divisor of `minibatch_size`
    whose rows x longest row fit both budgets, a prompt prefix all rows share counted once under
    `share_prefix`) and automatic gradient checkpointing (None: on above
    `CHECKPOINTING_PARAMETERS` parameters) and precision (`train_dtype`: "auto" decided for this
    model, `bf16` folded in). The checkpoint's meta records the resolved values."""
    changes: dict[str, Any] = {}
    dtype = train_dtype(config, model)
    if dtype != config.dtype:
        changes["dtype"] = dtype
    if table.num_rows:
        lengths = pc.add(pc.list_value_length(table.column("train_prompt_ids")), pc.list_value_length(table.column("completion_ids")))
        longest = max(1, pc.max(lengths).as_py())
        # a prefix every row shares runs once per micro-batch (`share_prefix`): it counts once
        common = common_prompt_prefix(table) if config.share_prefix else 0
        common = common if common >= config.share_prefix else 0

        def rows_within(tokens: int) -> int:
            return max(1, (tokens - common) // max(1, longest - common))

        cap = config.micro_batch_size
        if config.micro_batch_tokens is not None:
            cap = min(cap, rows_within(config.micro_batch_tokens))
        per_token = activation_bytes_per_token(model)
        if config.activation_mb > 0 and per_token:
            cap = min(cap, rows_within(int(config.activation_mb * 2**20) // per_token))
        size = max(d for d in range(1, cap + 1) if config.minibatch_size % d == 0)
        if size != config.micro_batch_size:
            changes["micro_batch_size"] = size
    if config.gradient_checkpointing is None:
        n_params = sum(p.numel() for p in model.parameters())
        changes["gradient_checkpointing"] = n_params > CHECKPOINTING_PARAMETERS
    return replace(config, **changes) if changes else config


def train_dtype(config: TrainConfig, model=None, *, cuda: bool | None = None) -> str:
    """The precision a run under `config` trains `model` in: "bfloat16" (bf16 autocast over
    float32 weights) or "float32". `config.bf16` wins when set; else `config.dtype`, "auto"
    decided by `pipeline.engines.config.resolve_dtype` for `model`'s parameter count (None: by the
    hardware alone); `cuda`: whether training runs on a CUDA GPU (None: detect)."""
    if config.bf16 is not None:
        return "bfloat16" if config.bf16 else "float32"
    n_params = sum(p.numel() for p in model.parameters()) if model is not None else None
    return resolve_dtype(config.dtype, n_params, cuda=cuda)


def autocast_dtype_of(dtype: str) -> torch.dtype | None:
    """The autocast dtype of a run in precision `dtype` (`train_dtype`): bf16, or None (float32)."""
    return torch.bfloat16 if dtype == "bfloat16" else None
