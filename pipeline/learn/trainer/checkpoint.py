"""The checkpoint folder a run writes: the model (or its LoRA adapter), the tokenizer,
`maxit_checkpoint.json` (`CheckpointMeta`: the rows, the resolved config, the metrics) and, under
`TrainConfig.optimizer_state` "carry", the optimizer state the next round starts from.
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import torch

from pipeline.config.train import TrainConfig
from pipeline.errors import DataError
from pipeline.learn.trainer.run import TrainerRun
from pipeline.learn.trainer.rows import PolicyRows
from pipeline.store import atomic_write_text, jsonable

__all__ = [
    "CHECKPOINT_META",
    "OPTIMIZER_STATE",
    "CheckpointMeta",
    "read_checkpoint_meta",
    "checkpoint_metrics",
    "checkpoint_meta",
    "load_optimizer_state",
    "save_checkpoint",
]


CHECKPOINT_META = "maxit_checkpoint.json"


OPTIMIZER_STATE = "optimizer.pt"
"""The AdamW state a checkpoint carries to the next round under `TrainConfig.optimizer_state` "carry"."""


@dataclass(frozen=True)
class CheckpointMeta:
    """What `maxit_checkpoint.json` in a checkpoint folder records."""

    round: int | None
    """Round whose rows trained it (None when the view has no `round` column and none was given)."""
    policy_id: str
    """Policy trained."""
    parent: str
    """Checkpoint the run started from."""
    data_hash: str
    """`pipeline.learn.views.view_hash` of the rows trained on."""
    n_rows: int
    """Rows trained on (per epoch)."""
    metrics: Mapping[str, float]
    """Final metrics (loss, ratio diagnostics, throughput)."""
    config: Mapping[str, Any]
    """The TrainConfig, as JSON."""
    created: str
    """UTC time the checkpoint was written (ISO 8601)."""


def read_checkpoint_meta(checkpoint_dir: str | Path) -> CheckpointMeta:
    """The `maxit_checkpoint.json` of a checkpoint written by `train_policy`."""
    raw = json.loads((Path(checkpoint_dir) / CHECKPOINT_META).read_text())
    return CheckpointMeta(**raw)


def checkpoint_metrics(run: TrainerRun, n_dropped_too_long: int) -> dict[str, float]:
    """The metrics `maxit_checkpoint.json` records: loss, steps, throughput, rows dropped and the
    run's ratio diagnostics (`LossDiagnostics.as_metrics`)."""
    return {
        "mean_loss": run.mean_loss,
        "steps": float(run.steps),
        "train_seconds": run.seconds,
        "completion_tokens": float(run.completion_tokens),
        "tokens_per_second": run.tokens_per_second,
        "n_dropped_too_long": float(n_dropped_too_long),
        "rows_skipped": float(run.rows_skipped),
        "padding_fraction": run.padding_fraction,
        "bf16": float(run.dtype == "bfloat16"),
        **run.diagnostics.as_metrics(),
    }


def checkpoint_meta(policy_id: str, init_dir: Path, rows: PolicyRows, config: TrainConfig, metrics: Mapping[str, float]) -> CheckpointMeta:
    """The `CheckpointMeta` of a run on `rows` from `init_dir`, stamped with the current UTC time."""
    return CheckpointMeta(
        round=rows.round,
        policy_id=policy_id,
        parent=str(init_dir),
        data_hash=rows.data_hash,
        n_rows=rows.table.num_rows,
        metrics=metrics,
        config=jsonable(config),
        created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    )


def load_optimizer_state(path: Path) -> Mapping[str, Any]:
    """The optimizer state dict in `path` (`OPTIMIZER_STATE`); a file torch cannot read is a
    `DataError` naming it."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - torch raises many kinds on a damaged file
        raise DataError(f"{path}: not a readable optimizer state ({type(e).__name__}: {e})") from None


def save_checkpoint(
    directory: Path, model, tokenizer, meta: CheckpointMeta, *, lora_base: Path | None = None, state_dict: Mapping[str, Any] | None = None
) -> None:
    """Write `model`, `tokenizer` and `meta` (as `CHECKPOINT_META`) into `directory`, and remove
    its `logs` folder when no logger wrote there. With `lora_base`, `model` is a peft model and
    only its adapter is written (a LoRA checkpoint: a few MB, no copy of the base), with
    `lora_base` as its base model folder. `state_dict`: the weights to write instead of the
    model's own (those of a model sharded over ranks, gathered: `full_state_dict`)."""
    if lora_base is not None:
        for config in model.peft_config.values():
            config.base_model_name_or_path = str(Path(lora_base).resolve())
    model.save_pretrained(directory, state_dict=state_dict)
    tokenizer.save_pretrained(directory)
    with contextlib.suppress(OSError):
        (directory / "logs").rmdir()  # only when empty
    atomic_write_text(directory / CHECKPOINT_META, json.dumps(jsonable(meta), indent=2, sort_keys=True))
