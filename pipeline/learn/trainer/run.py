"""One run of the training loop (`MaxitTrainer`, `pipeline.learn.trainer.loop`): its
`transformers.TrainingArguments` (`training_arguments`), the trainer built and trained on a
policy's rows (`run_trainer`), and what the run did, summed over the ranks (`TrainerRun`).
"""

from __future__ import annotations

import gc
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import pyarrow as pa
from transformers import PrinterCallback, TrainingArguments

from pipeline.config.loss import LossConfig

from pipeline.config.train import TrainConfig
from pipeline.learn.loss_diagnostics import LossDiagnostics
from pipeline.learn.trainer.loop import MaxitTrainer
from pipeline.learn.trainer.memory import autocast_dtype_of, train_dtype
from pipeline.learn.trainer.ranks import all_max, gather, rank_accumulation, world
from pipeline.learn.trainer.rows import collate, table_lengths, table_trainable
from pipeline.learn.trainer.samplers import prefix_groups, prompt_groups, row_sort_keys
from pipeline.learn.views import to_dataset

__all__ = ["training_arguments", "throughput", "TrainerRun", "run_trainer"]


def training_arguments(config: TrainConfig, output_dir: str | Path, *, use_cuda: bool) -> TrainingArguments:
    """The `transformers.TrainingArguments` of a run under `config`, logging to `output_dir`:
    no intermediate checkpoints, no stdout progress; accelerate's bf16 on a CUDA GPU when the run
    trains in bf16 (`train_dtype`; on a CPU the trainer's own autocast does it, `MaxitTrainer`).
    On several ranks each accumulates its share of a minibatch's micro-batches (`rank_accumulation`)."""
    return TrainingArguments(
        output_dir=str(output_dir),
        per_device_train_batch_size=config.micro_batch_size,
        gradient_accumulation_steps=rank_accumulation(config.grad_accum_steps, world()[1]),
        num_train_epochs=config.epochs,
        learning_rate=config.lr,
        weight_decay=config.weight_decay,
        max_grad_norm=config.max_grad_norm,
        lr_scheduler_type=config.lr_scheduler,
        warmup_steps=config.warmup_steps,
        logging_steps=config.logging_steps,
        save_strategy="no",
        report_to=config.report_to,
        seed=config.seed,
        data_seed=config.seed,
        use_cpu=not use_cuda,
        bf16=use_cuda and train_dtype(config, cuda=use_cuda) == "bfloat16",
        remove_unused_columns=False,
        gradient_checkpointing=bool(config.gradient_checkpointing),
        # non-reentrant: works when the inputs need no gradient (frozen embeddings under LoRA)
        gradient_checkpointing_kwargs={"use_reentrant": False} if config.gradient_checkpointing else None,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )


def throughput(completion_tokens: int, seconds: float) -> float:
    """Completion tokens per second of wall time (0 when no time was measured)."""
    return completion_tokens / seconds if seconds > 0 else 0.0


@dataclass(frozen=True)
class TrainerRun:
    """What one training loop did (`run_trainer`); `TrainerRun(model)` for a policy without rows."""

    model: Any
    """The model after the run (`Trainer.model`), or the untouched model when nothing ran."""
    steps: int = 0
    """Optimizer steps taken."""
    seconds: float = 0.0
    """Wall time of `Trainer.train`."""
    mean_loss: float = math.nan
    """Sum of the micro-batch losses / steps: each micro-batch's loss is its share of its
    minibatch's mean, so this is the mean minibatch loss (NaN without steps)."""
    completion_tokens: int = 0
    """Completion tokens processed over all epochs."""
    tokens_per_second: float = 0.0
    """`throughput(completion_tokens, seconds)`."""
    rows_seen: Mapping[str, int] = field(default_factory=dict)
    """step_id -> times the row was trained on."""
    diagnostics: LossDiagnostics = field(default_factory=LossDiagnostics)
    """Ratio diagnostics over every micro-batch of the run."""
    first_step_diagnostics: LossDiagnostics = field(default_factory=LossDiagnostics)
    """Ratio diagnostics of the first optimizer step's micro-batches (see `TrainResult`)."""
    rows_skipped: int = 0
    """Row visits left out of the forward passes (`TrainResult.rows_skipped`)."""
    micro_batches_skipped: int = 0
    """Micro-batches with no row to forward, whose forward and backward passes did not run."""
    padding_fraction: float = 0.0
    """Share of the forward passes' token positions that were padding."""
    dtype: str = "float32"
    """Precision of the run (`train_dtype`)."""
    optimizer_state: Mapping[str, Any] | None = None
    """The optimizer's state dict at the end of the run, when `run_trainer` was asked to keep it."""


def run_trainer(
    model,
    tokenizer,
    table: pa.Table,
    args: TrainingArguments,
    loss_config: LossConfig,
    temperature: float,
    *,
    pad_id: int,
    ref_model=None,
    callbacks: Sequence[Any] = (),
    max_logit_elements: int | None = None,
    dtype: str = "float32",
    skip_zero_rows: bool = False,
    sort_by_length: bool = False,
    share_prefix: int = 0,
    optimizer_state: tuple[Mapping[str, Any], str] | None = None,
    keep_optimizer_state: bool = False,
    group_minibatches: bool = False,
    minibatch_size: int | None = None,
    fsdp: bool = False,
) -> TrainerRun:
    """Train `model` on the rows of `table` with a `MaxitTrainer` under `args`, the loss of
    `loss_config` at `temperature` (and `ref_model` for its KL term); `callbacks` are
    `transformers.TrainerCallback`s added to the run; `max_logit_elements`: see `completion_logps`;
    `dtype` "bfloat16": forward passes under bf16 autocast; `skip_zero_rows`, `sort_by_length`,
    `share_prefix`: see `TrainConfig`; `optimizer_state`: (state dict, its file) the optimizer
    starts from; `keep_optimizer_state`: return the optimizer's final state dict;
    `group_minibatches`: see `TrainConfig`; `minibatch_size`: rows per optimizer step (None: the
    micro-batch size x the accumulation steps of `args`, one process's); `fsdp`: `model` is sharded
    by FSDP2 (`fully_shard`) over the ranks."""
    if ref_model is not None and not args.use_cpu:
        ref_model = ref_model.to(args.device)
    sort_keys = _sort_keys(table, loss_config, skip_zero_rows, share_prefix) if sort_by_length else None
    trainer = MaxitTrainer(
        model=model,
        args=args,
        train_dataset=to_dataset(table),
        data_collator=lambda rows: collate(rows, pad_id),
        processing_class=tokenizer,
        callbacks=list(callbacks),
        loss_config=loss_config,
        temperature=temperature,
        ref_model=ref_model,
        max_logit_elements=max_logit_elements,
        autocast_dtype=autocast_dtype_of(dtype),
        skip_zero_rows=skip_zero_rows,
        sort_keys=sort_keys,
        share_prefix=share_prefix,
        optimizer_state=optimizer_state,
        groups=prompt_groups(table) if group_minibatches else None,
        minibatch_size=minibatch_size,
        fsdp=fsdp,
    )
    trainer.remove_callback(PrinterCallback)  # metrics go to `report_to` and to logging, not stdout
    # the Trainer runs gc.collect() when it starts; freezing the objects that exist now keeps
    # that from walking the whole heap of a long-lived process, a fixed cost on every run
    # (docs/results/benchmarks.md, "Training")
    gc.freeze()
    try:
        t0 = time.perf_counter()
        trainer.train()
        seconds = time.perf_counter() - t0
    finally:
        gc.unfreeze()
    return _trainer_run(trainer, seconds, dtype, keep_optimizer_state)


def _sort_keys(table: pa.Table, loss_config: LossConfig, skip_zero_rows: bool, share_prefix: int) -> list[tuple]:
    """The `MinibatchSortedSampler` keys of the rows of `table` (`row_sort_keys`)."""
    return row_sort_keys(
        table_lengths(table), table_trainable(table, loss_config) if skip_zero_rows else None,
        prefix_groups(table, share_prefix) if share_prefix else None,
    )


def _trainer_run(trainer: MaxitTrainer, seconds: float, dtype: str, keep_optimizer_state: bool) -> TrainerRun:
    """What `trainer` did in its run of `seconds` (`TrainerRun`): on several ranks, what all of
    them did (counts summed, diagnostics merged, the slowest rank's seconds), on every rank."""
    steps = trainer.state.global_step
    mine = (
        trainer.loss_sum, trainer.completion_tokens, trainer.rows_seen, trainer.run_diagnostics, trainer.first_step_diagnostics,
        trainer.rows_skipped, trainer.micro_batches_skipped, trainer.real_positions, trainer.padded_positions,
    )
    ranks = gather(mine)
    loss_sum, tokens, _, diagnostics, first, skipped, micro_skipped, real, padded = ranks[0]
    rows_seen = dict(ranks[0][2])
    for r in ranks[1:]:
        loss_sum, tokens, skipped, micro_skipped, real, padded = (
            loss_sum + r[0], tokens + r[1], skipped + r[5], micro_skipped + r[6], real + r[7], padded + r[8],
        )
        diagnostics, first = diagnostics.merge(r[3]), first.merge(r[4])
        for sid, n in r[2].items():
            rows_seen[sid] = rows_seen.get(sid, 0) + n
    seconds = all_max(seconds)
    return TrainerRun(
        model=trainer.model,
        steps=steps,
        seconds=seconds,
        mean_loss=loss_sum / steps if steps else math.nan,
        completion_tokens=tokens,
        tokens_per_second=throughput(tokens, seconds),
        rows_seen=rows_seen,
        diagnostics=diagnostics,
        first_step_diagnostics=first,
        rows_skipped=skipped,
        micro_batches_skipped=micro_skipped,
        padding_fraction=1.0 - real / padded if padded else 0.0,
        dtype=dtype,
        optimizer_state=trainer.optimizer.state_dict() if keep_optimizer_state and trainer.optimizer is not None else None,
    )
