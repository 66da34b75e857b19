"""One training run of one policy, step by step: `train_policy(view, policy_id, init_dir,
out_dir, config)` and `train_from_files` (the same on a view stored as Parquet).

A run is six steps, each its own function, called in this order by `train_policy`:
`select_policy_rows` (the policy's rows, too-long rows dropped, temperature and round checked,
hashed), `load_policy_model` + `add_lora` + `load_reference` (the models), `training_arguments`
(TrainConfig -> `transformers.TrainingArguments`), `run_trainer` (one `MaxitTrainer` run ->
`TrainerRun`), `checkpoint_meta` + `save_checkpoint` (the checkpoint folder), `train_result`.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

import pyarrow as pa
import torch

from pipeline.config.train import LoraSettings, TrainConfig
from pipeline.errors import ConfigError, DataError
from pipeline.learn.loss_diagnostics import LossDiagnostics
from pipeline.learn.trainer import resident
from pipeline.learn.trainer.checkpoint import OPTIMIZER_STATE, checkpoint_meta, checkpoint_metrics, load_optimizer_state, save_checkpoint
from pipeline.learn.trainer.forward import autocast_context, completion_logps
from pipeline.learn.trainer.run import TrainerRun, run_trainer, training_arguments
from pipeline.learn.trainer.ranks import init_ranks, is_main
from pipeline.learn.trainer.memory import autocast_dtype_of, logit_elements, max_train_length, sized_for, train_dtype
from pipeline.learn.trainer.rows import PolicyRows, collate, select_policy_rows, table_trainable, view_temperature
from pipeline.models import adapter_base
from pipeline.store import atomic_dir

__all__ = [
    "TrainResult",
    "set_threads",
    "load_policy_model",
    "add_lora",
    "load_reference",
    "with_old_logprobs",
    "visit_range",
    "train_result",
    "train_policy",
    "train_from_files",
    "shard_model",
    "full_state_dict",
]

log = logging.getLogger(__name__)


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
    rows_skipped: int = 0
    """Row visits left out of the forward and backward passes because their loss is exactly 0
    (`TrainConfig.skip_zero_rows`), over all epochs; the diagnostics do not count them."""
    padding_fraction: float = 0.0
    """Share of the token positions of the forward passes that were padding."""
    dtype: str = "float32"
    """Precision training ran in ("bfloat16": bf16 autocast over float32 weights)."""


def set_threads(n: int | None = None) -> int:
    """Use `n` CPU threads (None = the cores this process may run on) for torch and OpenMP."""
    if n is None:
        n = _cores()
    os.environ["OMP_NUM_THREADS"] = str(n)
    os.environ["MKL_NUM_THREADS"] = str(n)
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
    return n


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
    PPO, and p_old of the staleness corrections' behaviour weight p_old / q), computed without gradients in micro-batches of `config.micro_batch_size`, in the
    precision training runs in (`train_dtype`). With `config.skip_zero_rows`, rows whose loss is
    0 (`trainable_rows`) are not forwarded: their anchor, never used, is their sampling logprobs."""
    rows = table.select(["step_id", "train_prompt_ids", "completion_ids", "sampling_logprobs", "advantage", "sample_weight", "strategy", "agent_id"]).to_pylist()
    trainable = table_trainable(table, config.loss) if config.skip_zero_rows else [True] * len(rows)
    out: list[list[float]] = [list(r["sampling_logprobs"]) for r in rows]
    todo = [i for i, t in enumerate(trainable) if t]
    autocast = autocast_dtype_of(train_dtype(config, model))
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for i in range(0, len(todo), config.micro_batch_size):
                chunk = todo[i : i + config.micro_batch_size]
                batch = collate([rows[j] for j in chunk], pad_id)
                with autocast_context(autocast, batch["prompt_ids"].device):
                    logp = completion_logps(model, batch, config.temperature, logit_elements(config.logits_chunk_mb), config.share_prefix)
                logp = logp.float()
                for k, j in enumerate(chunk):
                    out[j] = logp[k, : len(rows[j]["completion_ids"])].tolist()
    finally:
        model.train(was_training)
    return table.append_column("old_logprobs", pa.array(out, type=pa.list_(pa.float32())))


def visit_range(step_ids: Sequence[str], rows_seen: Mapping[str, int]) -> tuple[int, int]:
    """(fewest, most) times any of `step_ids` was trained on; (0, 0) without rows."""
    counts = [rows_seen.get(sid, 0) for sid in step_ids]
    return min(counts, default=0), max(counts, default=0)


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
        rows_skipped=run.rows_skipped,
        padding_fraction=run.padding_fraction,
        dtype=run.dtype,
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
    fsdp: str = "off",
) -> TrainResult:
    """Train `policy_id` on its rows of `view` (pyarrow or Polars, `training_view` schema),
    starting from the HF model directory `init_dir`, and write the checkpoint to `out_dir`
    atomically. A policy without rows gets its parent's weights written unchanged (steps=0).
    `callbacks` are `transformers.TrainerCallback`s added to the run. Run by torchrun on several
    ranks (`pipeline.learn.trainer.ranks`), each trains its share of every minibatch, the same
    update as one process's, and rank 0 alone writes; `fsdp` (not "off"): FSDP2 shards the model
    over the ranks (`shard_model`)."""
    init_dir, out_dir = Path(init_dir), Path(out_dir)
    if init_dir.resolve() == out_dir.resolve():
        raise ValueError(f"out_dir must differ from init_dir ({init_dir}): the parent checkpoint is kept")
    ranks = init_ranks()
    if fsdp != "off" and config.optimizer_state == "carry":
        raise ConfigError(f"--fsdp {fsdp}: --optimizer-state carry is not supported with FSDP (its state is sharded); use --optimizer-state fresh or --fsdp off")
    set_threads(config.num_threads if config.num_threads or ranks == 1 else max(1, _cores() // ranks))
    # a persistent trainer (`resident.keep_models`) holds the weights it saved last round: one
    # process, a full model, and equal to init_dir's tensors bit for bit, else loaded from disk
    alone = ranks == 1 and fsdp == "off" and config.lora is None
    kept = resident.take(init_dir) if alone else None
    tokenizer, model = kept or load_policy_model(init_dir, config.lora)
    rows = select_policy_rows(
        view, policy_id, max_length=max_train_length(config, model.config), temperature=config.temperature, round_=round_
    )
    config = sized_for(config, rows.table, model)
    ref_model = load_reference(init_dir) if config.loss.beta > 0 and rows.table.num_rows else None
    pad_id = _pad_id(tokenizer)
    table = rows.table
    if config.loss.needs_old_logp and table.num_rows:  # the proximal anchor, a staleness correction
        table = with_old_logprobs(model, table, config, pad_id)
    carry = config.optimizer_state == "carry"
    parent_state = init_dir / OPTIMIZER_STATE if carry and (init_dir / OPTIMIZER_STATE).is_file() else None
    model = shard_model(model, fsdp) if ranks > 1 else model
    with atomic_dir(out_dir) if is_main() else tempfile.TemporaryDirectory(prefix="maxit-rank-") as tmp:
        tmp = Path(tmp)
        run = TrainerRun(model=model, dtype=config.dtype)
        if table.num_rows:
            args = training_arguments(config, tmp / "logs", use_cuda=torch.cuda.is_available())
            log.info("policy %s: training %d rows in %s", policy_id, table.num_rows, config.dtype)
            run = run_trainer(
                model, tokenizer, table, args, config.loss, config.temperature, pad_id=pad_id, ref_model=ref_model, callbacks=callbacks,
                max_logit_elements=logit_elements(config.logits_chunk_mb), dtype=config.dtype,
                skip_zero_rows=config.skip_zero_rows, sort_by_length=config.sort_by_length, share_prefix=config.share_prefix,
                optimizer_state=(load_optimizer_state(parent_state), str(parent_state)) if parent_state else None, keep_optimizer_state=carry,
                group_minibatches=config.group_minibatches, minibatch_size=config.minibatch_size, fsdp=fsdp != "off",
            )
            if run.rows_skipped:
                log.info("policy %s: %d row visits skipped (loss exactly 0); padding %.1f%%", policy_id, run.rows_skipped, 100 * run.padding_fraction)
        visits = visit_range(table.column("step_id").to_pylist(), run.rows_seen)
        if visits[0] != visits[1]:
            log.warning("policy %s: rows were trained on unevenly (%d to %d times)", policy_id, *visits)
        state = full_state_dict(run.model) if fsdp != "off" and ranks > 1 else None  # every rank takes part
        if is_main():
            meta = checkpoint_meta(policy_id, init_dir, rows, config, checkpoint_metrics(run, rows.n_dropped_too_long))
            lora_base = (adapter_base(init_dir) or init_dir) if config.lora is not None else None
            save_checkpoint(tmp, run.model, tokenizer, meta, lora_base=lora_base, state_dict=state)
            if run.optimizer_state is not None:
                torch.save(run.optimizer_state, tmp / OPTIMIZER_STATE)
            elif parent_state is not None:  # nothing trained: the parent's state goes on unchanged
                shutil.copyfile(parent_state, tmp / OPTIMIZER_STATE)
    if alone:  # saved (renamed into place): the next round may start from these weights
        resident.keep(out_dir, tokenizer, run.model)
    return train_result(policy_id, init_dir, out_dir, rows, run, visits)


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - non-Linux
        return os.cpu_count() or 1


def shard_model(model, fsdp: str):
    """`model` ready for the ranks' training loop: on a CUDA GPU on this rank's device; with
    `fsdp` "full_shard" / "shard_grad_op" / "hybrid_shard", FSDP2 (`fully_shard`) on each
    decoder layer and on the whole (parameters resharded after each forward, or kept gathered until
    the backward: shard_grad_op; hybrid_shard: shards within a machine, replicas across machines).
    The Trainer is told not to wrap it in DDP: the ranks sum their gradients themselves."""
    if torch.cuda.is_available():
        model = model.to(torch.device("cuda", torch.cuda.current_device()))
    if fsdp != "off":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        from transformers.modeling_layers import GradientCheckpointingLayer

        size, local = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1")))
        device = "cuda" if torch.cuda.is_available() else "cpu"
        shape = (size // local, local) if fsdp == "hybrid_shard" else (size,)
        mesh = init_device_mesh(device, shape)
        reshard = fsdp != "shard_grad_op"
        for layer in [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]:
            fully_shard(layer, mesh=mesh, reshard_after_forward=reshard)
        fully_shard(model, mesh=mesh, reshard_after_forward=reshard)
    # the Trainer's switch for "this model reduces its own gradients": no DDP wrapper (peft: its base model)
    (model.get_base_model() if hasattr(model, "get_base_model") else model)._is_distributed_loading_by_transformers = True
    return model


def full_state_dict(model) -> Mapping[str, Any]:
    """The whole (unsharded) state dict of an FSDP2 `model`, on CPU; a collective: every rank calls it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def train_from_files(
    view_path: str | Path,
    policy_id: str,
    init_dir: str | Path,
    out_dir: str | Path,
    config: TrainConfig = TrainConfig(),
    *,
    round_: int | None = None,
    temperature_from_view: bool = False,
    fsdp: str = "off",
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
    return train_policy(view, policy_id, init_dir, out_dir, config, round_=round_, fsdp=fsdp)
