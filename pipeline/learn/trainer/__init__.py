"""Train one policy on its rows of a training view and write its checkpoint.

`train_policy(view, policy_id, init_dir, out_dir, config)`: the rows of `policy_id` (each with its
training prompt, the sampled completion verbatim and the stored sampling logprobs) are batched by
`collate` (prompts left-padded, completions right-padded, so every completion ends the row and the
forward keeps only the last C+1 logits), scored by `completion_logps` at the sampling temperature,
and `pipeline.learn.loss.compute_loss` is THE loss: importance ratios against the stored logprobs,
per-strategy sequence-ratio handling, sample weights, or the rejection-sampling loss.

The parts, in the order a run uses them (each module's docstring says more):
- `rows`: the policy's rows of the view (`select_policy_rows`), batched (`collate`,
  `select_rows`), and which of them can move the weights (`trainable_rows`);
- `memory`: the run's micro-batch size, gradient checkpointing and precision, decided for these
  rows and this model (`sized_for`, `train_dtype`);
- `samplers`: the order rows reach the optimizer (minibatches sorted by length, prompt groups);
- `forward`: the forward pass (`completion_logps`), a shared prompt prefix computed once;
- `loop`: the `transformers.Trainer` subclass (`MaxitTrainer`, `batch_loss`, `minibatch_count`);
- `run`: one run of it (`training_arguments`, `run_trainer` -> `TrainerRun`);
- `checkpoint`: the checkpoint folder (`CheckpointMeta`, `save_checkpoint`, the optimizer state);
- `train`: one run, step by step (`train_policy`, `train_from_files`);
- `process`: the same run as its own process (`python -m pipeline.learn.trainer`: a view file,
  a TrainConfig as JSON, a checkpoint and a JSON result out; `train_in_subprocess`).

The loop is a `transformers.Trainer` subclass whose `compute_loss` calls loss.py: the Trainer
brings the optimizer, schedule, gradient accumulation, accelerate (multi-GPU/FSDP) and
`report_to` logging. From TRL the trainer takes `selective_log_softmax` (the log-softmax at the
chosen tokens only, row by row, never the whole log-softmax over the vocabulary). TRL's trainers
are not subclassed: `SFTTrainer` has no per-row sample weights, and `GRPOTrainer` generates its
own completions and its `_compute_loss` has no sample weights, per-strategy ratio handling or rs
loss, and no context-swapped rows (scored under a training prompt other than the sampling one); a
test pins its GRPO loss to loss.py on a fixed batch.

The checkpoint (a full HF model directory + tokenizer + `maxit_checkpoint.json`) is built in a
temporary sibling and renamed into place (`pipeline.store.atomic_dir`): a crash leaves the
previous `out_dir` (or none) as it was.
"""

from __future__ import annotations

from pipeline.learn.trainer.checkpoint import (
    CHECKPOINT_META,
    OPTIMIZER_STATE,
    CheckpointMeta,
    checkpoint_meta,
    checkpoint_metrics,
    load_optimizer_state,
    read_checkpoint_meta,
    save_checkpoint,
)
from pipeline.learn.trainer.forward import common_prefix, completion_logps, shared_prefix_length
from pipeline.learn.trainer.loop import MaxitTrainer, batch_loss, minibatch_count
from pipeline.learn.trainer.memory import activation_bytes_per_token, common_prompt_prefix, logit_elements, max_train_length, sized_for, train_dtype
from pipeline.learn.trainer.process import config_from_dict, config_to_json, result_from_json, result_to_json, train_in_subprocess
from pipeline.learn.trainer.rows import PolicyRows, collate, padding_fraction, select_policy_rows, select_rows, trainable_rows, view_temperature
from pipeline.learn.trainer.run import TrainerRun, run_trainer, throughput, training_arguments
from pipeline.learn.trainer.samplers import GroupShuffleSampler, MinibatchSortedSampler, prefix_groups, prompt_groups, row_sort_keys
from pipeline.learn.trainer.train import (
    TrainResult,
    add_lora,
    load_policy_model,
    load_reference,
    set_threads,
    train_from_files,
    train_policy,
    train_result,
    visit_range,
    with_old_logprobs,
)

__all__ = [
    "TrainResult",
    "CheckpointMeta",
    "CHECKPOINT_META",
    "OPTIMIZER_STATE",
    "PolicyRows",
    "TrainerRun",
    "collate",
    "select_rows",
    "trainable_rows",
    "MinibatchSortedSampler",
    "GroupShuffleSampler",
    "prompt_groups",
    "prefix_groups",
    "row_sort_keys",
    "padding_fraction",
    "train_dtype",
    "completion_logps",
    "common_prefix",
    "shared_prefix_length",
    "batch_loss",
    "minibatch_count",
    "with_old_logprobs",
    "MaxitTrainer",
    "select_policy_rows",
    "max_train_length",
    "activation_bytes_per_token",
    "common_prompt_prefix",
    "logit_elements",
    "sized_for",
    "load_policy_model",
    "add_lora",
    "load_reference",
    "training_arguments",
    "run_trainer",
    "throughput",
    "visit_range",
    "checkpoint_metrics",
    "checkpoint_meta",
    "load_optimizer_state",
    "save_checkpoint",
    "train_result",
    "train_policy",
    "train_from_files",
    "read_checkpoint_meta",
    "view_temperature",
    "set_threads",
    "config_to_json",
    "config_from_dict",
    "result_to_json",
    "result_from_json",
    "train_in_subprocess",
]
