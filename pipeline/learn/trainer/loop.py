"""The training loop: a `transformers.Trainer` subclass (`MaxitTrainer`) whose `compute_loss`
is `pipeline.learn.loss.compute_loss` on view rows (`batch_loss`), each minibatch divided by its
own count (`minibatch_count`). One run of it: `pipeline.learn.trainer.run`.

The Trainer brings the optimizer, schedule, gradient accumulation, accelerate (multi-GPU/FSDP)
and `report_to` logging. maxit adds: bf16 autocast of the forward passes where the run's
precision is bfloat16 (weights, optimizer and loss stay float32), rows whose loss is exactly 0 left
out of the forward pass (`trainable_rows`; the minibatch's denominator still counts them), each
minibatch's rows ordered by length before it is cut into micro-batches (`MinibatchSortedSampler`:
the same minibatches, less padding), and an optimizer state carried from the parent checkpoint.
"""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any, Mapping, Sequence

import torch
from torch.utils.data import RandomSampler
from transformers import Trainer

from pipeline.config.loss import LossConfig
from pipeline.errors import ConfigError
from pipeline.learn.loss import LossBatch, aggregation_count, compute_loss
from pipeline.learn.loss_diagnostics import LossDiagnostics
from pipeline.learn.trainer.forward import autocast_context, completion_logps
from pipeline.learn.trainer.ranks import EpochLoader, RankMicroBatches, StandInRows, all_sum, gather, sum_gradients, world
from pipeline.learn.trainer.rows import select_rows, trainable_rows
from pipeline.learn.trainer.samplers import GroupShuffleSampler, MinibatchSortedSampler

__all__ = ["batch_loss", "minibatch_count", "MaxitTrainer"]

log = logging.getLogger(__name__)


def batch_loss(
    model,
    batch: Mapping[str, Any],
    loss_config: LossConfig,
    temperature: float,
    ref_model=None,
    denominator: float | None = None,
    max_logit_elements: int | None = None,
    autocast_dtype: torch.dtype | None = None,
    share_prefix: int = 0,
):
    """The loss.py loss of one collated batch under `model` (a `LossOutput`). `denominator`: the
    aggregation count of the whole minibatch the batch belongs to (`minibatch_count`);
    `max_logit_elements`, `share_prefix`: see `completion_logps`; `autocast_dtype` torch.bfloat16:
    the forward passes run under bf16 autocast, the logprobs and the loss stay float32."""
    device = batch["prompt_ids"].device
    with autocast_context(autocast_dtype, device):
        logp = completion_logps(model, batch, temperature, max_logit_elements, share_prefix)
        ref_logp = None
        if loss_config.beta > 0:
            if ref_model is None:
                raise ValueError("LossConfig.beta > 0 needs a reference model")
            with torch.no_grad():
                ref_logp = completion_logps(ref_model, batch, temperature, max_logit_elements, share_prefix).float()
    # the ratios, clip and aggregation in float32, whatever precision the forward ran in
    logp = logp.float()
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


class MaxitTrainer(Trainer):
    """`transformers.Trainer` whose loss is `pipeline.learn.loss.compute_loss` on view rows.

    `autocast_dtype` torch.bfloat16: forward passes under bf16 autocast. `skip_zero_rows`: rows
    whose loss is exactly 0 (`trainable_rows`) are left out of each micro-batch's forward pass
    (the minibatch's denominator, counted on all its rows, is unchanged). `sort_keys`: one key per
    row of the dataset; each minibatch's rows are ordered by it before they are cut into
    micro-batches (`MinibatchSortedSampler`)."""

    # compute_loss divides by the whole minibatch's count (`minibatch_count`): each micro-batch's
    # loss is its share of one token mean, so the Trainer must not divide by the accumulation steps
    loss_is_scaled_for_ga = True

    def __init__(
        self,
        *args,
        loss_config: LossConfig,
        temperature: float,
        ref_model=None,
        max_logit_elements: int | None = None,
        autocast_dtype: torch.dtype | None = None,
        skip_zero_rows: bool = False,
        sort_keys: Sequence[Any] | None = None,
        share_prefix: int = 0,
        optimizer_state: tuple[Mapping[str, Any], str] | None = None,
        groups: Sequence[Any] | None = None,
        minibatch_size: int | None = None,
        fsdp: bool = False,
        **kwargs,
    ):
        super().__init__(*args, **kwargs)
        self.minibatch_size = minibatch_size or self.args.train_batch_size * self.args.gradient_accumulation_steps
        self.fsdp = fsdp
        self.optimizer_state = optimizer_state
        self.groups = groups
        self.share_prefix = share_prefix
        self.loss_config = loss_config
        self.max_logit_elements = max_logit_elements
        self.temperature = temperature
        self.ref_model = ref_model
        self.autocast_dtype = autocast_dtype
        self.skip_zero_rows = skip_zero_rows
        self.sort_keys = sort_keys
        self.run_diagnostics = LossDiagnostics()
        self.first_step_diagnostics = LossDiagnostics()
        self._log_diagnostics = LossDiagnostics()
        self.completion_tokens = 0
        self.rows_seen: dict[str, int] = {}
        self.rows_skipped = 0
        self.micro_batches_skipped = 0
        self.real_positions = 0
        self.padded_positions = 0
        self.loss_sum = 0.0
        self.loss_count = 0

    def _get_train_sampler(self, train_dataset=None):
        sampler = super()._get_train_sampler(train_dataset)
        if type(sampler) is not RandomSampler:
            return sampler
        return self._row_order(sampler, self.args.train_batch_size * self.args.gradient_accumulation_steps, seedable=False)

    def _row_order(self, sampler: RandomSampler, minibatch: int, *, seedable: bool):
        """The order one process trains the rows in, for minibatches of `minibatch` rows; the
        Trainer's shuffle `sampler` as accelerate reseeds it (`seedable`: here already)."""
        if self.groups is not None:
            grouped = GroupShuffleSampler(self.groups, self.args.data_seed if self.args.data_seed is not None else self.args.seed)
            return grouped if self.sort_keys is None else MinibatchSortedSampler(grouped, self.sort_keys, minibatch)
        if self.sort_keys is None and not seedable:
            return sampler
        if self.args.accelerator_config.use_seedable_sampler:
            # the shuffle accelerate would have put in its place (`prepare_data_loader`), so the
            # minibatches hold the rows they hold unsorted
            from accelerate.data_loader import SeedableRandomSampler

            sampler = SeedableRandomSampler(
                data_source=sampler.data_source, replacement=sampler.replacement, num_samples=sampler._num_samples,
                generator=sampler.generator, data_seed=self.args.data_seed,
            )
        return sampler if self.sort_keys is None else MinibatchSortedSampler(sampler, self.sort_keys, minibatch)

    def get_train_dataloader(self):
        """One process: the Trainer's. Several (`ranks`): this rank's share of the micro-batches one
        process would run (`RankMicroBatches`), stand-ins where a minibatch has none left for it."""
        rank, ranks = world()
        if ranks == 1:
            return super().get_train_dataloader()
        order = self._row_order(RandomSampler(self.train_dataset), self.minibatch_size, seedable=True)
        batches = RankMicroBatches(order, len(self.train_dataset), self.minibatch_size, self.args.per_device_train_batch_size, rank, ranks)
        collate_rows = self.data_collator

        def collate_fn(rows):
            return {**collate_rows(rows), "stand_in": all(r.get("stand_in", False) for r in rows)}

        return EpochLoader(StandInRows(self.train_dataset), batch_sampler=batches, collate_fn=collate_fn, num_workers=0)

    def _sync_replicated_trainable_parameters(self, model) -> None:
        """Nothing: with several ranks `training_step` sums the gradients itself (FSDP: its
        reduce-scatter), once per optimizer step."""

    def training_step(self, model, inputs, num_items_in_batch=None):
        loss = super().training_step(model, inputs, num_items_in_batch)
        if world()[1] > 1 and not self.fsdp and self.accelerator.sync_gradients:
            sum_gradients([p for p in model.parameters() if p.requires_grad])
        return loss

    def create_optimizer(self, model=None):
        """The Trainer's optimizer; with `optimizer_state` (a state dict and the file it came from)
        its moments and step counts continue from that state, under this run's hyperparameters."""
        optimizer = super().create_optimizer(model)
        if self.optimizer_state is not None:
            state, source = self.optimizer_state
            groups = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
            try:
                optimizer.load_state_dict(state)
            except (ValueError, KeyError, RuntimeError) as e:
                raise ConfigError(f"{source}: the optimizer state does not fit this model's trainable parameters ({e})") from None
            for group in optimizer.param_groups:  # load_state_dict counts the tensors, not their shapes
                for param in group["params"]:
                    moment = optimizer.state.get(param, {}).get("exp_avg")
                    if moment is not None and moment.shape != param.shape:
                        raise ConfigError(
                            f"{source}: the optimizer state does not fit this model's trainable parameters "
                            f"(a moment of shape {tuple(moment.shape)} for a parameter of shape {tuple(param.shape)})"
                        )
            for group, own in zip(optimizer.param_groups, groups):
                # the parent's moments, this run's learning rate, betas and decay; no "initial_lr"
                # of the parent's scheduler either, which this run's scheduler would keep
                for key in [k for k in group if k != "params" and k not in own]:
                    del group[key]
                group.update(own)
        return optimizer

    def _get_num_items_in_batch(self, batch_samples, device):
        # the minibatch's count over every rank's share of it (its stand-ins count nothing)
        return all_sum(minibatch_count([b for b in batch_samples if not b.get("stand_in", False)], self.loss_config))

    def _rows_to_train(self, inputs) -> tuple[Mapping[str, Any], bool]:
        """(the micro-batch to forward, whether it is only a stand-in of rows whose loss is 0);
        the micro-batch is None when none of its rows needs a forward pass."""
        keep = trainable_rows(inputs["advantages"].tolist(), inputs["sample_weight"].tolist(), inputs["reward"].tolist(), inputs["strategy"], self.loss_config)
        skipped = len(keep) - sum(keep)
        if not skipped:
            return inputs, False
        self.rows_skipped += skipped
        index = [i for i, k in enumerate(keep) if k]
        if index:
            return select_rows(inputs, index), False
        if not self.fsdp:
            return None, True  # nothing to forward: `compute_loss` returns a zero that reaches every weight
        # FSDP: every rank runs each forward and backward pass (their all-gathers and reduce-scatters),
        # so the shortest row alone is forwarded (its gradient is exactly 0)
        lengths = inputs["prompt_mask"].sum(1) + inputs["completion_mask"].sum(1)
        return select_rows(inputs, [int(lengths.argmin())]), True

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        denominator = None if num_items_in_batch is None else float(num_items_in_batch)
        inputs = dict(inputs)
        # a rank's slot with no micro-batch of this minibatch left (`RankMicroBatches`): loss 0
        stand_in = bool(inputs.pop("stand_in", False))
        ranks = world()[1]
        if ranks > 1:  # gradients are summed by `training_step` (FSDP: by its hooks), not by a DDP wrapper
            model = self.accelerator.unwrap_model(model)
        batch, zero_rows = inputs, stand_in
        if self.skip_zero_rows and model.training and not stand_in:
            batch, zero_rows = self._rows_to_train(inputs)
        if batch is None or (stand_in and not self.fsdp):
            if not stand_in:
                self.micro_batches_skipped += 1
            # no row of this micro-batch can move the weights: a zero with a gradient (of zeros) for
            # every trainable weight, so the optimizer step sees the same gradients as if the rows
            # had been forwarded, without the forward and backward passes through the model
            out = SimpleNamespace(loss=sum(p.sum() for p in model.parameters() if p.requires_grad) * 0.0)
            batch = select_rows(inputs, [])
        else:
            out = batch_loss(
                model, batch, self.loss_config, self.temperature, self.ref_model, denominator=denominator,
                max_logit_elements=self.max_logit_elements, autocast_dtype=self.autocast_dtype, share_prefix=self.share_prefix,
            )
        if model.training and not stand_in:
            self._record(inputs, batch, out, zero_rows)
        loss = out.loss * 0.0 if stand_in else out.loss
        if self.fsdp:  # FSDP's reduce-scatter averages the ranks' gradients; each rank's loss is its share of the sum
            loss = loss * ranks
        return (loss, None) if return_outputs else loss

    def _record(self, inputs, batch, out, zero_rows: bool) -> None:
        """The bookkeeping of one trained micro-batch (`inputs`, of which `batch` was forwarded)."""
        if not zero_rows:  # (a row forwarded only so that FSDP's collectives run counts as none)
            if self.state.global_step == 0:  # before any update: the ratios as sampled vs trained
                self.first_step_diagnostics = self.first_step_diagnostics.merge(out.diagnostics)
            self.run_diagnostics = self.run_diagnostics.merge(out.diagnostics)
            self._log_diagnostics = self._log_diagnostics.merge(out.diagnostics)
            b = batch["prompt_ids"].shape[0]
            self.real_positions += int(batch["prompt_mask"].sum().item() + batch["completion_mask"].sum().item())
            self.padded_positions += b * (batch["prompt_ids"].shape[1] + batch["completion_ids"].shape[1])
        self.completion_tokens += int(inputs["completion_mask"].sum().item())
        for sid in inputs["step_id"]:
            self.rows_seen[sid] = self.rows_seen.get(sid, 0) + 1
        self.loss_sum += float(out.loss.detach())
        self.loss_count += 1

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        ranks = world()[1]
        if "loss" in logs and ranks > 1:  # every rank logs at the same steps: what all of them saw
            merged = LossDiagnostics()
            for diagnostics in gather(self._log_diagnostics):
                merged = merged.merge(diagnostics)
            self._log_diagnostics = merged
            if not self.fsdp:  # the Trainer logs the ranks' mean of their shares of the loss: their sum
                logs = {**logs, "loss": logs["loss"] * ranks}
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
