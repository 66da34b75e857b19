"""Train one policy on its rows of a training view and write its checkpoint.

`train_policy(view, policy_id, init_dir, out_dir, config)`: the rows of `policy_id` (each with its
training prompt, the sampled completion verbatim and the stored sampling logprobs) are batched by
`collate` (prompts left-padded, completions right-padded, so every completion ends the row and the
forward keeps only the last C+1 logits), scored by `completion_logps` at the sampling temperature,
and `pipeline.training.loss.compute_loss` is THE loss: importance ratios against the stored logprobs,
per-strategy sequence-ratio handling, sample weights, or the rejection-sampling loss.

A run is six steps, each its own function, called in this order by `train_policy`:
`select_policy_rows` (the policy's rows, too-long rows dropped, temperature and round checked,
hashed), `load_policy_model` + `add_lora` + `load_reference` (the models), `training_arguments`
(TrainConfig -> `transformers.TrainingArguments`), `run_trainer` (one `MaxitTrainer` run ->
`TrainerRun`), `checkpoint_meta` + `save_checkpoint` (the checkpoint folder), `train_result`.

The loop is a `transformers.Trainer` subclass (`MaxitTrainer`) whose `compute_loss` calls loss.py:
the Trainer brings the optimizer, schedule, gradient accumulation, bf16 autocast, accelerate
(multi-GPU/FSDP) and `report_to` logging. From TRL the trainer takes `selective_log_softmax` (the
log-softmax at the chosen tokens only, row by row, never the whole log-softmax over the
vocabulary). TRL's trainers are not subclassed: `SFTTrainer` has no per-row sample weights, and
`GRPOTrainer` generates its own completions and its `_compute_loss` has no sample weights,
per-strategy ratio handling or rs loss, and no context-swapped rows (scored under a training
prompt other than the sampling one); a test pins its GRPO loss to loss.py on a fixed batch.

The checkpoint (a full HF model directory + tokenizer + `maxit_checkpoint.json`) is built in a
temporary sibling and renamed into place (`pipeline.store.atomic_dir`): a crash leaves the
previous `out_dir` (or none) as it was.
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import math
import os
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

import pyarrow as pa
import pyarrow.compute as pc
import torch
from transformers import PrinterCallback, Trainer, TrainingArguments
from trl.trainer.utils import selective_log_softmax

from pipeline.errors import ConfigError, DataError
from pipeline.models import adapter_base
from pipeline.store import atomic_dir, atomic_write_text, jsonable
from pipeline.training.config import ACTIVATION_VALUES_PER_TOKEN, CHECKPOINTING_PARAMETERS, LoraSettings, LossConfig, TrainConfig
from pipeline.training.loss import LossBatch, LossDiagnostics, aggregation_count, compute_loss
from pipeline.views import check_view, to_dataset, view_hash

__all__ = [
    "TrainResult",
    "CheckpointMeta",
    "CHECKPOINT_META",
    "PolicyRows",
    "TrainerRun",
    "collate",
    "completion_logps",
    "batch_loss",
    "minibatch_count",
    "with_old_logprobs",
    "MaxitTrainer",
    "select_policy_rows",
    "max_train_length",
    "load_policy_model",
    "add_lora",
    "load_reference",
    "training_arguments",
    "run_trainer",
    "throughput",
    "visit_range",
    "checkpoint_metrics",
    "checkpoint_meta",
    "save_checkpoint",
    "train_result",
    "train_policy",
    "train_from_files",
    "read_checkpoint_meta",
    "view_temperature",
    "set_threads",
]

log = logging.getLogger(__name__)

CHECKPOINT_META = "maxit_checkpoint.json"


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
    """`pipeline.views.view_hash` of the rows trained on."""
    n_rows: int
    """Rows trained on (per epoch)."""
    metrics: Mapping[str, float]
    """Final metrics (loss, ratio diagnostics, throughput)."""
    config: Mapping[str, Any]
    """The TrainConfig, as JSON."""
    created: str
    """UTC time the checkpoint was written (ISO 8601)."""


@dataclass(frozen=True)
class TrainResult:
    """Outcome of `train_policy`."""

    policy_id: str
    """Policy trained."""
    checkpoint: Path
    """The checkpoint folder written (`out_dir`)."""
    parent: Path
    """The checkpoint training started from (`init_dir`)."""
    round: int | None
    """Round of the rows (see `CheckpointMeta.round`)."""
    data_hash: str
    """Hash of the rows trained on."""
    n_rows: int
    """Rows trained on (per epoch)."""
    n_dropped_too_long: int
    """Rows of the policy dropped because prompt + completion exceed the model's max length."""
    steps: int
    """Optimizer steps taken."""
    completion_tokens: int
    """Completion tokens processed over all epochs."""
    train_seconds: float
    """Wall time of the training loop."""
    tokens_per_second: float
    """completion_tokens / train_seconds."""
    mean_loss: float
    """Mean training loss over the run (NaN without steps)."""
    min_row_visits: int
    """Fewest times any row was trained on (= epochs when every row was seen every epoch)."""
    max_row_visits: int
    """Most times any row was trained on (= epochs)."""
    diagnostics: LossDiagnostics = field(default_factory=LossDiagnostics)
    """Ratio diagnostics over every micro-batch of the run."""
    first_step_diagnostics: LossDiagnostics = field(default_factory=LossDiagnostics)
    """Ratio diagnostics of the first optimizer step's micro-batches, before any weight changed:
    the mean log ratio there is ~0 on rows whose context was kept, unless sampling and training
    disagree (temperature, template, numerics)."""


def set_threads(n: int | None = None) -> int:
    """Use `n` CPU threads (None = the cores this process may run on) for torch and OpenMP."""
    if n is None:
        try:
            n = len(os.sched_getaffinity(0))
        except AttributeError:  # pragma: no cover - non-Linux
            n = os.cpu_count() or 1
    os.environ["OMP_NUM_THREADS"] = str(n)
    os.environ["MKL_NUM_THREADS"] = str(n)
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
    return n


# ---------------------------------------------------------------------------------------------
# batches and the forward pass


def collate(rows: Sequence[Mapping[str, Any]], pad_token_id: int = 0) -> dict[str, Any]:
    """Batch view rows: prompts left-padded, completions right-padded, so `prompt_ids +
    completion_ids` of every row is contiguous and the completion ends each row."""
    b = len(rows)
    p_len = max(len(r["train_prompt_ids"]) for r in rows)
    c_len = max(len(r["completion_ids"]) for r in rows)
    prompt_ids = torch.full((b, p_len), pad_token_id, dtype=torch.long)
    prompt_mask = torch.zeros((b, p_len), dtype=torch.long)
    completion_ids = torch.full((b, c_len), pad_token_id, dtype=torch.long)
    completion_mask = torch.zeros((b, c_len), dtype=torch.float32)
    sampling_logprobs = torch.zeros((b, c_len), dtype=torch.float32)
    for i, r in enumerate(rows):
        p, c = r["train_prompt_ids"], r["completion_ids"]
        if len(r["sampling_logprobs"]) != len(c):
            raise DataError(f"step_id {r.get('step_id')!r}: 'completion_ids' and 'sampling_logprobs' differ in length")
        prompt_ids[i, p_len - len(p) :] = torch.as_tensor(p, dtype=torch.long)
        prompt_mask[i, p_len - len(p) :] = 1
        completion_ids[i, : len(c)] = torch.as_tensor(c, dtype=torch.long)
        completion_mask[i, : len(c)] = 1.0
        sampling_logprobs[i, : len(c)] = torch.as_tensor(r["sampling_logprobs"], dtype=torch.float32)
    reward = [r.get("reward") for r in rows]
    extra = {}
    if rows and "old_logprobs" in rows[0]:
        old_logp = torch.zeros((b, c_len), dtype=torch.float32)
        for i, r in enumerate(rows):
            old_logp[i, : len(r["old_logprobs"])] = torch.as_tensor(r["old_logprobs"], dtype=torch.float32)
        extra["old_logp"] = old_logp
    return {
        **extra,
        "prompt_ids": prompt_ids,
        "prompt_mask": prompt_mask,
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "sampling_logprobs": sampling_logprobs,
        "advantages": torch.tensor([float(r["advantage"]) for r in rows], dtype=torch.float32),
        "sample_weight": torch.tensor([float(r["sample_weight"]) for r in rows], dtype=torch.float32),
        "reward": torch.tensor([math.nan if x is None else float(x) for x in reward], dtype=torch.float32),
        "strategy": [r["strategy"] for r in rows],
        "agent": [r["agent_id"] for r in rows],
        "step_id": [r["step_id"] for r in rows],
    }


def logit_elements(mb: float) -> int | None:
    """`TrainConfig.logits_chunk_mb` as a count of float32 logits (None: no budget)."""
    return int(mb * 2**20 / 4) if mb > 0 else None


def _head_logps(head, hidden: torch.Tensor, completion_ids: torch.Tensor, temperature: float) -> torch.Tensor:
    return selective_log_softmax(head(hidden).float(), completion_ids, temperature)


def _plain_head(model) -> bool:
    """True when the logits are the output projection of the last hidden state and nothing more
    (no logit scaling or soft-capping), so projecting a slice of it is exact."""
    cfg = model.config
    return not any(getattr(cfg, name, None) for name in ("final_logit_softcapping", "logit_scale", "logits_scaling"))


def completion_logps(model, batch: Mapping[str, Any], temperature: float, max_logit_elements: int | None = None) -> torch.Tensor:
    """(B, C) log p(completion token | training prompt, earlier completion tokens) at `temperature`
    (0 on padding). Only the C positions that predict completion tokens are projected to the
    vocabulary, and the log-softmax is taken at the completion tokens only (TRL's
    `selective_log_softmax`). When B x C x vocabulary exceeds `max_logit_elements`, the projection
    runs a few rows at a time, each chunk under activation checkpointing (its logits are
    recomputed in the backward pass instead of kept), so peak memory holds one chunk's logits."""
    prompt_ids, completion_ids = batch["prompt_ids"], batch["completion_ids"]
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
    attention_mask = torch.cat([batch["prompt_mask"], batch["completion_mask"].to(batch["prompt_mask"].dtype)], dim=1)
    # positions count real tokens only, so a left-padded row sees the positions it had unpadded
    position_ids = (attention_mask.cumsum(1) - 1).clamp(min=0)
    b, c = completion_ids.shape
    if max_logit_elements is None or not _plain_head(model) or b * c * int(model.config.vocab_size) <= max_logit_elements:
        logits = model(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, logits_to_keep=c + 1, use_cache=False
        ).logits
        # position t predicts completion token t; TRL's selective_log_softmax divides by the
        # temperature and takes logit - logsumexp at the chosen token, one row at a time
        logps = selective_log_softmax(logits[:, :-1, :].float(), completion_ids, temperature)
        return logps * batch["completion_mask"]
    hidden = model.get_decoder()(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
    ).last_hidden_state[:, -(c + 1) : -1, :]
    head = model.get_output_embeddings()
    rows = max(1, max_logit_elements // (c * int(model.config.vocab_size)))
    parts = []
    for i in range(0, b, rows):
        args = (head, hidden[i : i + rows], completion_ids[i : i + rows], temperature)
        if torch.is_grad_enabled():
            parts.append(torch.utils.checkpoint.checkpoint(_head_logps, *args, use_reentrant=False))
        else:
            parts.append(_head_logps(*args))
    return torch.cat(parts) * batch["completion_mask"]


def batch_loss(
    model,
    batch: Mapping[str, Any],
    loss_config: LossConfig,
    temperature: float,
    ref_model=None,
    denominator: float | None = None,
    max_logit_elements: int | None = None,
):
    """The loss.py loss of one collated batch under `model` (a `LossOutput`). `denominator`: the
    aggregation count of the whole minibatch the batch belongs to (`minibatch_count`);
    `max_logit_elements`: see `completion_logps`."""
    logp = completion_logps(model, batch, temperature, max_logit_elements)
    ref_logp = None
    if loss_config.beta > 0:
        if ref_model is None:
            raise ValueError("LossConfig.beta > 0 needs a reference model")
        with torch.no_grad():
            ref_logp = completion_logps(ref_model, batch, temperature, max_logit_elements)
    return compute_loss(
        LossBatch(
            logp=logp,
            logq=batch["sampling_logprobs"],
            mask=batch["completion_mask"],
            advantage=batch["advantages"],
            sample_weight=batch["sample_weight"],
            reward=batch["reward"],
            strategy=batch["strategy"],
            agent=batch["agent"],
            ref_logp=ref_logp,
            old_logp=batch.get("old_logp"),
        ),
        loss_config,
        denominator=denominator,
    )


def minibatch_count(batches: Sequence[Mapping[str, Any]], loss_config: LossConfig) -> float:
    """What the loss of a minibatch made of `batches` (its micro-batches) divides by: its
    completion tokens for "token-mean", its rows otherwise; for the "rs" loss only the rows it
    trains (reward >= threshold). Each micro-batch's loss is its share of that one mean."""
    total = 0.0
    for batch in batches:
        rows = None
        if loss_config.kind == "rs":
            reward = batch["reward"]
            rows = (~torch.isnan(reward) & (reward >= loss_config.rs_threshold)).to(batch["completion_mask"].dtype)
        total += aggregation_count(batch["completion_mask"], loss_config.aggregation, rows)
    return total


# ---------------------------------------------------------------------------------------------
# the Trainer


class MaxitTrainer(Trainer):
    """`transformers.Trainer` whose loss is `pipeline.training.loss.compute_loss` on view rows."""

    # compute_loss divides by the whole minibatch's count (`minibatch_count`): each micro-batch's
    # loss is its share of one token mean, so the Trainer must not divide by the accumulation steps
    loss_is_scaled_for_ga = True

    def __init__(self, *args, loss_config: LossConfig, temperature: float, ref_model=None, max_logit_elements: int | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.loss_config = loss_config
        self.max_logit_elements = max_logit_elements
        self.temperature = temperature
        self.ref_model = ref_model
        self.run_diagnostics = LossDiagnostics()
        self.first_step_diagnostics = LossDiagnostics()
        self._log_diagnostics = LossDiagnostics()
        self.completion_tokens = 0
        self.rows_seen: dict[str, int] = {}
        self.loss_sum = 0.0
        self.loss_count = 0

    def _get_num_items_in_batch(self, batch_samples, device):
        return minibatch_count(batch_samples, self.loss_config)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        denominator = None if num_items_in_batch is None else float(num_items_in_batch)
        out = batch_loss(
            model, inputs, self.loss_config, self.temperature, self.ref_model, denominator=denominator, max_logit_elements=self.max_logit_elements
        )
        if model.training:
            if self.state.global_step == 0:  # before any update: the ratios as sampled vs trained
                self.first_step_diagnostics = self.first_step_diagnostics.merge(out.diagnostics)
            self.run_diagnostics = self.run_diagnostics.merge(out.diagnostics)
            self._log_diagnostics = self._log_diagnostics.merge(out.diagnostics)
            self.completion_tokens += int(inputs["completion_mask"].sum().item())
            for sid in inputs["step_id"]:
                self.rows_seen[sid] = self.rows_seen.get(sid, 0) + 1
            self.loss_sum += float(out.loss.detach())
            self.loss_count += 1
        return (out.loss, None) if return_outputs else out.loss

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if "loss" in logs and self._log_diagnostics.overall.n_rows:
            overall = self._log_diagnostics.overall
            log.info(
                "step %d: loss %.4g, mean log ratio %.4g, clip %.3f, masked %.3f, ESS %.3f",
                self.state.global_step, logs["loss"], overall.mean_log_ratio, overall.clip_fraction,
                overall.masked_fraction, overall.ess_fraction,
            )
            logs = {**logs, **self._log_diagnostics.as_metrics()}
            self._log_diagnostics = LossDiagnostics()
        super().log(logs, start_time)


# ---------------------------------------------------------------------------------------------
# one run, step by step


def read_checkpoint_meta(checkpoint_dir: str | Path) -> CheckpointMeta:
    """The `maxit_checkpoint.json` of a checkpoint written by `train_policy`."""
    raw = json.loads((Path(checkpoint_dir) / CHECKPOINT_META).read_text())
    return CheckpointMeta(**raw)


def view_temperature(view) -> float | None:
    """The sampling temperature of a view's rows (its `temperature` column), None when the view
    has no such column (e.g. the ground-truth baseline, whose rows were never sampled). Rows
    sampled at different temperatures are an error: one run trains at one temperature."""
    table = view if isinstance(view, pa.Table) else check_view(view)
    if "temperature" not in table.column_names or table.num_rows == 0:
        return None
    values = pc.unique(table.column("temperature")).to_pylist()
    if len(values) > 1:
        raise DataError(f"the view's rows were sampled at several temperatures {sorted(values)} (column 'temperature'); train them separately")
    return float(values[0])


def _check_temperature(table: pa.Table, temperature: float) -> None:
    """The stored logprobs are log q at the sampling temperature; p_train must be taken at the same
    one, or every importance ratio is off."""
    sampled = view_temperature(table)
    if sampled is not None and not math.isclose(sampled, temperature, rel_tol=1e-9):
        raise ConfigError(
            f"the view's rows were sampled at temperature {sampled} (column 'temperature') but training runs at "
            f"{temperature} (TrainConfig.temperature, `maxit train --temperature`); they must be equal"
        )


def _policy_rows(view, policy_id: str, max_length: int) -> tuple[pa.Table, int]:
    table = check_view(view)
    table = table.filter(pc.equal(table.column("policy_id"), policy_id))
    lengths = pc.add(pc.list_value_length(table.column("train_prompt_ids")), pc.list_value_length(table.column("completion_ids")))
    too_long = pc.greater(lengths, max_length)
    n_long = int(pc.sum(too_long).as_py() or 0)
    if n_long:
        ids = table.filter(too_long).column("step_id").to_pylist()
        log.warning("policy %s: dropped %d row(s) longer than %d tokens (step_id %s)", policy_id, n_long, max_length, ids[:10])
        table = table.filter(pc.invert(too_long))
    return table, n_long


def _round_of(table: pa.Table, round_: int | None) -> int | None:
    if round_ is not None:
        return int(round_)
    if "round" in table.column_names and table.num_rows:
        rounds = pc.unique(table.column("round")).to_pylist()
        if len(rounds) == 1:
            return int(rounds[0])
        raise DataError(f"training view holds rows of several rounds {sorted(rounds)}; pass round_ explicitly")
    return None


@dataclass(frozen=True)
class PolicyRows:
    """The rows one run trains on (`select_policy_rows`)."""

    table: pa.Table
    """The policy's rows of the view that fit in the max length, in view order."""
    n_dropped_too_long: int
    """Rows of the policy dropped because prompt + completion exceed the max length."""
    round: int | None
    """Round of the rows (see `CheckpointMeta.round`)."""
    data_hash: str
    """`pipeline.views.view_hash` of `table`."""


def select_policy_rows(view, policy_id: str, *, max_length: int, temperature: float, round_: int | None = None) -> PolicyRows:
    """The rows of `policy_id` in `view` (pyarrow or Polars, `training_view` schema, checked)
    whose prompt + completion fit in `max_length` tokens (the others dropped with a warning),
    after checking they were sampled at `temperature` (else ConfigError) and finding their round
    (`round_` when given, else the view's one `round`; several are a DataError)."""
    table, n_long = _policy_rows(view, policy_id, max_length)
    _check_temperature(table, temperature)
    return PolicyRows(table=table, n_dropped_too_long=n_long, round=_round_of(table, round_), data_hash=view_hash(table))


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


def sized_for(config: TrainConfig, table: pa.Table, model) -> TrainConfig:
    """`config` with its memory settings resolved for these rows and this model: the micro-batch
    size under `micro_batch_tokens` and `activation_mb` (the largest divisor of `minibatch_size`
    whose rows x longest row fit both budgets) and automatic gradient checkpointing (None: on above
    `CHECKPOINTING_PARAMETERS` parameters). The checkpoint's meta records the resolved values."""
    changes: dict[str, Any] = {}
    if table.num_rows:
        lengths = pc.add(pc.list_value_length(table.column("train_prompt_ids")), pc.list_value_length(table.column("completion_ids")))
        longest = max(1, pc.max(lengths).as_py())
        cap = config.micro_batch_size
        if config.micro_batch_tokens is not None:
            cap = min(cap, max(1, config.micro_batch_tokens // longest))
        per_token = activation_bytes_per_token(model)
        if config.activation_mb > 0 and per_token:
            cap = min(cap, max(1, int(config.activation_mb * 2**20) // (per_token * longest)))
        size = max(d for d in range(1, cap + 1) if config.minibatch_size % d == 0)
        if size != config.micro_batch_size:
            changes["micro_batch_size"] = size
    if config.gradient_checkpointing is None:
        n_params = sum(p.numel() for p in model.parameters())
        changes["gradient_checkpointing"] = n_params > CHECKPOINTING_PARAMETERS
    return replace(config, **changes) if changes else config


def load_policy_model(init_dir: Path, lora: LoraSettings | None = None):
    """(tokenizer, float32 model) of the local checkpoint `init_dir`, ready to train; nothing is
    ever downloaded. With `lora`, the model is a peft model whose adapter is trained: the adapter
    of `init_dir` when it is a LoRA checkpoint (so rounds continue one adapter on one base), else a
    fresh one on `init_dir`. Without `lora`, a LoRA checkpoint is loaded merged (full fine-tuning)."""
    from pipeline.models import adapter_base, load_model, load_tokenizer

    tokenizer = load_tokenizer(init_dir)
    base = adapter_base(init_dir)
    if lora is None or base is None:
        return tokenizer, add_lora(load_model(init_dir, dtype=torch.float32), lora)
    from peft import PeftModel

    model = PeftModel.from_pretrained(load_model(base, dtype=torch.float32), str(init_dir), is_trainable=True)
    return tokenizer, model


def add_lora(model, lora: LoraSettings | None):
    """`model` with fresh LoRA adapters (peft) as `lora` describes, or `model` itself when None."""
    if lora is None:
        return model
    from peft import LoraConfig, get_peft_model

    present = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    missing = sorted(set(lora.target_modules) - present)
    if len(missing) == len(lora.target_modules):
        raise ConfigError(
            f"LoRA target modules {list(lora.target_modules)}: none is a module of this model ({type(model).__name__}); "
            "set LoraSettings.target_modules to its linear layers' names"
        )
    return get_peft_model(
        model,
        LoraConfig(
            r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout, task_type="CAUSAL_LM",
            target_modules=[m for m in lora.target_modules if m in present],
        ),
    )


def load_reference(init_dir: Path):
    """The frozen reference model of the KL term (`LossConfig.beta`): `init_dir`'s model, in
    eval mode, without gradients."""
    from pipeline.models import load_model

    return load_model(init_dir, dtype=torch.float32).eval().requires_grad_(False)


def _pad_id(tokenizer) -> int:
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0


def with_old_logprobs(model, table: pa.Table, config: TrainConfig, pad_id: int) -> pa.Table:
    """`table` with an `old_logprobs` column: log p_old of every completion token under the
    training context, from `model` as it is before the update (the proximal anchor of decoupled
    PPO), computed without gradients in micro-batches of `config.micro_batch_size`."""
    rows = table.select(["step_id", "train_prompt_ids", "completion_ids", "sampling_logprobs", "advantage", "sample_weight", "strategy", "agent_id"]).to_pylist()
    was_training = model.training
    model.eval()
    out: list[list[float]] = []
    try:
        with torch.no_grad():
            for i in range(0, len(rows), config.micro_batch_size):
                chunk = rows[i : i + config.micro_batch_size]
                batch = collate(chunk, pad_id)
                logp = completion_logps(model, batch, config.temperature, logit_elements(config.logits_chunk_mb))
                out.extend(logp[j, : len(r["completion_ids"])].tolist() for j, r in enumerate(chunk))
    finally:
        model.train(was_training)
    return table.append_column("old_logprobs", pa.array(out, type=pa.list_(pa.float32())))


def training_arguments(config: TrainConfig, output_dir: str | Path, *, use_cuda: bool) -> TrainingArguments:
    """The `transformers.TrainingArguments` of a run under `config`, logging to `output_dir`:
    no intermediate checkpoints, no stdout progress, bf16 when `config.bf16` (default: on CUDA)."""
    return TrainingArguments(
        output_dir=str(output_dir),
        per_device_train_batch_size=config.micro_batch_size,
        gradient_accumulation_steps=config.grad_accum_steps,
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
        bf16=config.bf16 if config.bf16 is not None else use_cuda,
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
) -> TrainerRun:
    """Train `model` on the rows of `table` with a `MaxitTrainer` under `args`, the loss of
    `loss_config` at `temperature` (and `ref_model` for its KL term); `callbacks` are
    `transformers.TrainerCallback`s added to the run; `max_logit_elements`: see `completion_logps`."""
    if ref_model is not None and not args.use_cpu:
        ref_model = ref_model.to(args.device)
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
    )
    trainer.remove_callback(PrinterCallback)  # metrics go to `report_to` and to logging, not stdout
    # the Trainer runs gc.collect() when it starts; freezing the objects that exist now keeps
    # that from walking the whole heap of a long-lived process (a fixed ~0.3 s per run here)
    gc.freeze()
    try:
        t0 = time.perf_counter()
        trainer.train()
        seconds = time.perf_counter() - t0
    finally:
        gc.unfreeze()
    steps = trainer.state.global_step
    return TrainerRun(
        model=trainer.model,
        steps=steps,
        seconds=seconds,
        mean_loss=trainer.loss_sum / steps if steps else math.nan,
        completion_tokens=trainer.completion_tokens,
        tokens_per_second=throughput(trainer.completion_tokens, seconds),
        rows_seen=trainer.rows_seen,
        diagnostics=trainer.run_diagnostics,
        first_step_diagnostics=trainer.first_step_diagnostics,
    )


def visit_range(step_ids: Sequence[str], rows_seen: Mapping[str, int]) -> tuple[int, int]:
    """(fewest, most) times any of `step_ids` was trained on; (0, 0) without rows."""
    counts = [rows_seen.get(sid, 0) for sid in step_ids]
    return min(counts, default=0), max(counts, default=0)


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


def save_checkpoint(directory: Path, model, tokenizer, meta: CheckpointMeta, *, lora_base: Path | None = None) -> None:
    """Write `model`, `tokenizer` and `meta` (as `CHECKPOINT_META`) into `directory`, and remove
    its `logs` folder when no logger wrote there. With `lora_base`, `model` is a peft model and
    only its adapter is written (a LoRA checkpoint: a few MB, no copy of the base), with
    `lora_base` as its base model folder."""
    if lora_base is not None:
        for config in model.peft_config.values():
            config.base_model_name_or_path = str(Path(lora_base).resolve())
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    with contextlib.suppress(OSError):
        (directory / "logs").rmdir()  # only when empty
    atomic_write_text(directory / CHECKPOINT_META, json.dumps(jsonable(meta), indent=2, sort_keys=True))


def train_result(policy_id: str, init_dir: Path, out_dir: Path, rows: PolicyRows, run: TrainerRun, visits: tuple[int, int]) -> TrainResult:
    """The `TrainResult` of a run on `rows` written to `out_dir`; `visits`: `visit_range`."""
    return TrainResult(
        policy_id=policy_id,
        checkpoint=out_dir,
        parent=init_dir,
        round=rows.round,
        data_hash=rows.data_hash,
        n_rows=rows.table.num_rows,
        n_dropped_too_long=rows.n_dropped_too_long,
        steps=run.steps,
        completion_tokens=run.completion_tokens,
        train_seconds=run.seconds,
        tokens_per_second=run.tokens_per_second,
        mean_loss=run.mean_loss,
        min_row_visits=visits[0],
        max_row_visits=visits[1],
        diagnostics=run.diagnostics,
        first_step_diagnostics=run.first_step_diagnostics,
    )


def train_policy(
    view,
    policy_id: str,
    init_dir: str | Path,
    out_dir: str | Path,
    config: TrainConfig = TrainConfig(),
    *,
    round_: int | None = None,
    callbacks: Sequence[Any] = (),
) -> TrainResult:
    """Train `policy_id` on its rows of `view` (pyarrow or Polars, `training_view` schema),
    starting from the HF model directory `init_dir`, and write the checkpoint to `out_dir`
    atomically. A policy without rows gets its parent's weights written unchanged (steps=0).
    `callbacks` are `transformers.TrainerCallback`s added to the run."""
    init_dir, out_dir = Path(init_dir), Path(out_dir)
    if init_dir.resolve() == out_dir.resolve():
        raise ValueError(f"out_dir must differ from init_dir ({init_dir}): the parent checkpoint is kept")
    set_threads(config.num_threads)
    tokenizer, model = load_policy_model(init_dir, config.lora)
    rows = select_policy_rows(
        view, policy_id, max_length=max_train_length(config, model.config), temperature=config.temperature, round_=round_
    )
    config = sized_for(config, rows.table, model)
    ref_model = load_reference(init_dir) if config.loss.beta > 0 and rows.table.num_rows else None
    pad_id = _pad_id(tokenizer)
    table = rows.table
    if config.loss.anchor == "proximal" and config.loss.kind != "rs" and table.num_rows:
        table = with_old_logprobs(model, table, config, pad_id)
    with atomic_dir(out_dir) as tmp:
        run = TrainerRun(model=model)
        if table.num_rows:
            args = training_arguments(config, tmp / "logs", use_cuda=torch.cuda.is_available())
            run = run_trainer(
                model, tokenizer, table, args, config.loss, config.temperature, pad_id=pad_id, ref_model=ref_model, callbacks=callbacks,
                max_logit_elements=logit_elements(config.logits_chunk_mb),
            )
        visits = visit_range(table.column("step_id").to_pylist(), run.rows_seen)
        if visits[0] != visits[1]:
            log.warning("policy %s: rows were trained on unevenly (%d to %d times)", policy_id, *visits)
        meta = checkpoint_meta(policy_id, init_dir, rows, config, checkpoint_metrics(run, rows.n_dropped_too_long))
        lora_base = (adapter_base(init_dir) or init_dir) if config.lora is not None else None
        save_checkpoint(tmp, run.model, tokenizer, meta, lora_base=lora_base)
    return train_result(policy_id, init_dir, out_dir, rows, run, visits)


def train_from_files(
    view_path: str | Path,
    policy_id: str,
    init_dir: str | Path,
    out_dir: str | Path,
    config: TrainConfig = TrainConfig(),
    *,
    round_: int | None = None,
    temperature_from_view: bool = False,
) -> TrainResult:
    """`train_policy` on a training view stored as Parquet (what `maxit train --view ... --policy ...`
    calls). With `temperature_from_view`, training runs at the view's sampling temperature (its
    `temperature` column) instead of `config.temperature`, which stays for a view without one."""
    import pyarrow.parquet as pq

    view_path = Path(view_path)
    if not view_path.exists():
        raise FileNotFoundError(f"no training view at {view_path}")
    try:
        view = pq.read_table(view_path)
    except (pa.ArrowException, OSError) as err:  # e.g. a corrupt data page behind an intact footer
        reason = " ".join(str(err).split()) or type(err).__name__
        raise DataError(f"--view {view_path}: not a readable Parquet file (corrupt or truncated?): {reason}") from None
    present = sorted(set(view.column("policy_id").to_pylist())) if "policy_id" in view.column_names else []
    if policy_id not in present:
        raise ConfigError(f"--policy {policy_id!r}: the view {view_path} has no rows of that policy; its policies: {present}")
    if temperature_from_view:
        sampled = view_temperature(view)
        if sampled is not None:
            config = replace(config, temperature=sampled)
    return train_policy(view, policy_id, init_dir, out_dir, config, round_=round_)
