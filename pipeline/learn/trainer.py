"""Train one policy on its rows of a training view and write its checkpoint.

`train_policy(view, policy_id, init_dir, out_dir, config)`: the rows of `policy_id` (each with its
training prompt, the sampled completion verbatim and the stored sampling logprobs) are batched by
`collate` (prompts left-padded, completions right-padded, so every completion ends the row and the
forward keeps only the last C+1 logits), scored by `completion_logps` at the sampling temperature,
and `pipeline.learn.loss.compute_loss` is THE loss: importance ratios against the stored logprobs,
per-strategy sequence-ratio handling, sample weights, or the rejection-sampling loss.

A run is six steps, each its own function, called in this order by `train_policy`:
`select_policy_rows` (the policy's rows, too-long rows dropped, temperature and round checked,
hashed), `load_policy_model` + `add_lora` + `load_reference` (the models), `training_arguments`
(TrainConfig -> `transformers.TrainingArguments`), `run_trainer` (one `MaxitTrainer` run ->
`TrainerRun`), `checkpoint_meta` + `save_checkpoint` (the checkpoint folder), `train_result`.

The loop is a `transformers.Trainer` subclass (`MaxitTrainer`) whose `compute_loss` calls loss.py:
the Trainer brings the optimizer, schedule, gradient accumulation, accelerate (multi-GPU/FSDP)
and `report_to` logging. maxit adds: bf16 autocast of the forward passes where the run's
precision is bfloat16 (`train_dtype`: "auto" picks it on a GPU and for real models on a CPU
with native bf16; weights, optimizer and loss stay float32), rows whose loss is exactly 0 left
out of the forward pass (`trainable_rows`; the minibatch's denominator still counts them), and
each minibatch's rows ordered by length before it is cut into micro-batches
(`MinibatchSortedSampler`: the same minibatches, less padding). From TRL the trainer takes `selective_log_softmax` (the
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
from collections import Counter
import gc
import json
import logging
import math
import os
import random
import shutil
import time
from types import SimpleNamespace
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

import pyarrow as pa
import pyarrow.compute as pc
import torch
from torch.utils.data import RandomSampler, Sampler
from transformers import PrinterCallback, Trainer, TrainingArguments
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer
from transformers.modeling_layers import GradientCheckpointingLayer
from trl.trainer.utils import selective_log_softmax

from pipeline.engines.config import resolve_dtype
from pipeline.errors import ConfigError, DataError
from pipeline.models import adapter_base
from pipeline.store import atomic_dir, atomic_write_text, jsonable
from pipeline.config.train import ACTIVATION_VALUES_PER_TOKEN, CHECKPOINTING_PARAMETERS, LoraSettings, LossConfig, TrainConfig
from pipeline.learn.loss import LossBatch, LossDiagnostics, aggregation_count, compute_loss
from pipeline.learn.views import check_view, to_dataset, view_hash

__all__ = [
    "TrainResult",
    "CheckpointMeta",
    "CHECKPOINT_META",
    "PolicyRows",
    "TrainerRun",
    "collate",
    "select_rows",
    "trainable_rows",
    "MinibatchSortedSampler",
    "padding_fraction",
    "train_dtype",
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


_PROMPT_FIELDS = ("prompt_ids", "prompt_mask")
_COMPLETION_FIELDS = ("completion_ids", "completion_mask", "sampling_logprobs", "old_logp")


def select_rows(batch: Mapping[str, Any], index: Sequence[int]) -> dict[str, Any]:
    """The rows `index` of a `collate`d batch, as `collate` batches those rows alone: every
    per-row field taken at them, and the padding no kept row needs trimmed (the prompts' left
    columns, the completions' right columns)."""
    index = [int(i) for i in index]
    out: dict[str, Any] = {}
    for key, value in batch.items():
        if isinstance(value, torch.Tensor):
            out[key] = value[torch.as_tensor(index, dtype=torch.long, device=value.device)]
        else:
            out[key] = [value[i] for i in index]
    p_len = int(out["prompt_mask"].sum(1).max()) if index else 0
    c_len = int(out["completion_mask"].sum(1).max()) if index else 0
    for key in _PROMPT_FIELDS:
        if key in out:
            out[key] = out[key][:, out[key].shape[1] - p_len :]
    for key in _COMPLETION_FIELDS:
        if key in out:
            out[key] = out[key][:, :c_len]
    return out


def _is_nan(x) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def trainable_rows(
    advantage: Sequence[float], sample_weight: Sequence[float], reward: Sequence[float | None], strategy: Sequence[str], loss: LossConfig
) -> list[bool]:
    """Per row, whether its loss under `loss` can be nonzero (False: the loss and its gradient are
    exactly 0 whatever the policy, so the row need not be forwarded; it still counts in its
    minibatch's denominator). "ppo" / "is" / "exit": False when the weighted advantage A w is 0 (A
    after `negative_weight`: with 0, every negative row), unless the KL term (beta > 0) or the NLL
    of `sft_strategies` trains the row. "rs": False below the reward threshold (or without a
    reward), and at weight 0 without a KL term."""
    out = []
    for a, w, r, st in zip(advantage, sample_weight, reward, strategy):
        a, w = float(a), float(w)
        if loss.kind == "rs":
            passed = not _is_nan(r) and float(r) >= loss.rs_threshold
            out.append(passed and (w != 0.0 or loss.beta > 0))
        elif loss.beta > 0 or st in loss.sft_strategies:
            out.append(True)
        else:
            a = a * loss.negative_weight if a < 0 else a
            out.append(a * w != 0.0)  # NaN stays trained (and shows in the loss)
    return out


def _table_trainable(table: pa.Table, loss: LossConfig) -> list[bool]:
    reward = table.column("reward").to_pylist() if "reward" in table.column_names else [None] * table.num_rows
    return trainable_rows(
        table.column("advantage").to_pylist(), table.column("sample_weight").to_pylist(), reward, table.column("strategy").to_pylist(), loss
    )


def _table_lengths(table: pa.Table) -> list[tuple[int, int]]:
    """(prompt tokens, completion tokens) of every row of a view table."""
    return list(
        zip(pc.list_value_length(table.column("train_prompt_ids")).to_pylist(), pc.list_value_length(table.column("completion_ids")).to_pylist())
    )


class MinibatchSortedSampler(Sampler[int]):
    """The rows in `inner`'s order (the Trainer's seeded shuffle), cut into minibatches of
    `minibatch_size` rows, each reordered by `keys[row]` (ascending, stable) before the
    DataLoader cuts it into micro-batches. Every minibatch holds the rows it held under `inner`,
    so the optimizer steps (their rows, denominators and gradients) are the same; rows of similar
    length share a micro-batch, so less of it is padding. `set_epoch` reaches `inner`."""

    def __init__(self, inner: Sampler[int], keys: Sequence[Any], minibatch_size: int):
        self.inner = inner
        self.keys = list(keys)
        self.minibatch_size = int(minibatch_size)

    def __iter__(self):
        order = list(self.inner)
        for start in range(0, len(order), self.minibatch_size):
            yield from sorted(order[start : start + self.minibatch_size], key=self.keys.__getitem__)

    def __len__(self) -> int:
        return len(self.inner)

    def set_epoch(self, epoch: int) -> None:
        if hasattr(self.inner, "set_epoch"):
            self.inner.set_epoch(epoch)


class GroupShuffleSampler(Sampler[int]):
    """Every epoch, the groups of rows (`groups[row]`, one id per group) in a seeded random order,
    the rows of each group side by side (shuffled among themselves), so that minibatches cut from
    the order hold whole groups where the sizes allow (a group of 4 rows, minibatches of 8: two
    groups each). Each epoch (`set_epoch`, or each new iteration) draws another order from `seed`."""

    def __init__(self, groups: Sequence[Any], seed: int):
        self.members: dict[Any, list[int]] = {}
        for row, g in enumerate(groups):
            self.members.setdefault(g, []).append(row)
        self.n = len(groups)
        self.seed = seed
        self.epoch = 0

    def __iter__(self):
        rng = random.Random(f"{self.seed}:{self.epoch}")
        self.epoch += 1
        keys = list(self.members)
        rng.shuffle(keys)
        for key in keys:
            rows = list(self.members[key])
            rng.shuffle(rows)
            yield from rows

    def __len__(self) -> int:
        return self.n

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch


def prompt_groups(table: pa.Table) -> list[int]:
    """A group id per row of `table`: rows with the same turn and the same training prompt (the
    samples of one problem, tree siblings of one node) share one. Rows whose prompts differ (later
    turns of different trajectories, each Verifier call) are groups of one."""
    keys = [(t, tuple(p)) for t, p in zip(table.column("turn").to_pylist(), table.column("train_prompt_ids").to_pylist())]
    ids: dict[tuple, int] = {}
    return [ids.setdefault(k, len(ids)) for k in keys]


def row_sort_keys(
    lengths: Sequence[tuple[int, int]], trainable: Sequence[bool] | None = None, groups: Sequence[int] | None = None
) -> list[tuple]:
    """The `MinibatchSortedSampler` key of each row: the rows to train first (those
    `trainable_rows` leaves out gather in the last micro-batches), then by `groups` (rows whose
    prompts begin alike side by side, so a micro-batch shares their prefix: `prefix_groups`), then
    the longest (prompt + completion) first, ties by completion length."""
    trainable = [True] * len(lengths) if trainable is None else trainable
    groups = [0] * len(lengths) if groups is None else groups
    return [(not t, g, -(p + c), -c) for (p, c), t, g in zip(lengths, trainable, groups)]


def prefix_groups(table: pa.Table, tokens: int) -> list[int]:
    """A group id per row of `table`: rows whose training prompts begin with the same `tokens`
    tokens share one (the largest group first), so sorting by it puts a task's rows that share a
    system prompt and worked examples into the same micro-batches (an agent's rows apart from
    another agent's). Prompts of `tokens` tokens or fewer, which can share no such prefix, are one
    group."""
    heads = [tuple(p[:tokens]) if len(p) > tokens else () for p in table.column("train_prompt_ids").to_pylist()]
    sizes = Counter(heads)
    rank = {h: i for i, h in enumerate(sorted(sizes, key=lambda h: (-sizes[h], h)))}
    return [rank[h] for h in heads]


def padding_fraction(lengths: Sequence[tuple[int, int]], order: Sequence[int], micro_batch_size: int) -> float:
    """Share of padding in the micro-batches of `micro_batch_size` rows taken in `order` from rows
    of (prompt, completion) `lengths`, batched as `collate` pads them (prompts to the longest
    prompt, completions to the longest completion)."""
    real = padded = 0
    for start in range(0, len(order), micro_batch_size):
        rows = [lengths[i] for i in order[start : start + micro_batch_size]]
        real += sum(p + c for p, c in rows)
        padded += len(rows) * (max(p for p, _ in rows) + max(c for _, c in rows))
    return 1.0 - real / padded if padded else 0.0


def _precision(dtype: torch.dtype | None, device: torch.device):
    """bf16 autocast on `device` when `dtype` is bfloat16 (float32 weights, bf16 matmuls), else nothing."""
    if dtype is None or dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


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


def common_prefix(prompts: Sequence[Sequence[int]]) -> int:
    """How many tokens all of `prompts` (two or more) begin with, at most the shortest less one
    token: each row keeps its last prompt token, whose logit predicts its first completion token."""
    if len(prompts) < 2:
        return 0
    first, width = prompts[0], min(len(p) for p in prompts) - 1
    n = 0
    while n < width and all(p[n] == first[n] for p in prompts):
        n += 1
    return n


def shared_prefix_length(batch: Mapping[str, Any]) -> int:
    """`common_prefix` of the training prompts of a `collate`d batch (left-padded)."""
    prompt_ids, p_len = batch["prompt_ids"], batch["prompt_ids"].shape[1]
    return common_prefix([prompt_ids[i, p_len - int(n) :].tolist() for i, n in enumerate(batch["prompt_mask"].sum(1).tolist())])


class _PrefixLayer(DynamicLayer):
    """One layer's keys and values of the shared prefix, the same for every row (an expanded
    view, so the backward pass sums the rows' gradients into the one prefix pass). `update` never
    stores: it returns the prefix's states followed by the new tokens', so a layer recomputed under
    gradient checkpointing reads exactly what it read the first time."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, rows: int):
        super().__init__()
        self.lazy_initialization(keys, values)
        self.keys = keys.expand(rows, *keys.shape[1:])
        self.values = values.expand(rows, *values.shape[1:])

    def update(self, key_states, value_states, *args, **kwargs):
        return torch.cat([self.keys, key_states], dim=-2), torch.cat([self.values, value_states], dim=-2)


def _checkpointed_layers(model) -> list:
    return [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]


@contextlib.contextmanager
def _layers_flag(layers: Sequence[Any], name: str, value: bool):
    """Set the attribute `name` on every layer of `layers` for the duration (instance attributes,
    removed again, so the class's value is back afterwards)."""
    had = [(layer, name in vars(layer), getattr(layer, name)) for layer in layers]
    for layer in layers:
        setattr(layer, name, value)
    try:
        yield
    finally:
        for layer, own, old in had:
            if own:
                setattr(layer, name, old)
            else:
                delattr(layer, name)


def _model_inputs(model, batch: Mapping[str, Any], share_prefix: int) -> tuple[dict[str, Any], contextlib.AbstractContextManager]:
    """The forward pass's inputs for `batch` (ids, attention mask, positions; with a shared prefix
    the prefix's cache too) and the context the forward runs in. With `share_prefix` > 0 and at least
    that many tokens common to every row's prompt (`shared_prefix_length`), the prefix runs once, as
    one row, and the rows run only their own tokens on top of its keys and values: the same
    logprobs and gradients as the full rows, with the prefix's tokens processed once instead of once
    per row (rows of one task share its system prompt and worked examples)."""
    prompt_ids, completion_ids = batch["prompt_ids"], batch["completion_ids"]
    prompt_mask = batch["prompt_mask"]
    attention_mask = torch.cat([prompt_mask, batch["completion_mask"].to(prompt_mask.dtype)], dim=1)
    # positions count real tokens only, so a left-padded row sees the positions it had unpadded
    position_ids = (attention_mask.cumsum(1) - 1).clamp(min=0)
    prefix = shared_prefix_length(batch) if share_prefix > 0 else 0
    cache = DynamicCache(config=model.config) if prefix >= max(share_prefix, 1) else None
    # only plain attention layers share: a sliding window or a recurrent state keeps other states
    if cache is None or not cache.layers or any(type(layer) is not DynamicLayer for layer in cache.layers):
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
        return dict(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False), contextlib.nullcontext()
    b, p_len = prompt_ids.shape
    first = p_len - int(prompt_mask[0].sum())
    prefix_ids = prompt_ids[:1, first : first + prefix]
    layers = _checkpointed_layers(model)
    # the prefix is one row: its activations are kept (no checkpointing, which would drop the cache)
    with _layers_flag(layers, "gradient_checkpointing", False):
        model.get_decoder()(
            input_ids=prefix_ids, attention_mask=torch.ones_like(prefix_ids), position_ids=torch.arange(prefix, device=prefix_ids.device)[None],
            past_key_values=cache, use_cache=True,
        )
    shared = Cache(layers=[_PrefixLayer(layer.keys, layer.values, b) for layer in cache.layers])
    # each row without its first `prefix` prompt tokens: the prompt columns after them, masked
    # where the row's own tokens had not begun; the prefix's columns stay in the mask and positions
    rest_mask = prompt_mask[:, prefix:].clone()
    for i, n in enumerate(prompt_mask.sum(1).tolist()):
        rest_mask[i, : rest_mask.shape[1] - (int(n) - prefix)] = 0
    full_mask = torch.cat([torch.ones(b, prefix, dtype=prompt_mask.dtype, device=prompt_mask.device), rest_mask, attention_mask[:, p_len:]], dim=1)
    input_ids = torch.cat([torch.where(rest_mask.bool(), prompt_ids[:, prefix:], prompt_ids[:, :1]), completion_ids], dim=1)
    inputs = dict(
        input_ids=input_ids, attention_mask=full_mask, position_ids=position_ids[:, prefix:], past_key_values=shared, use_cache=False,
    )
    # the layers only read `shared`, so gradient checkpointing may keep it for the recompute
    return inputs, _layers_flag(layers, "_can_checkpoint_with_cache", True)


def completion_logps(
    model, batch: Mapping[str, Any], temperature: float, max_logit_elements: int | None = None, share_prefix: int = 0
) -> torch.Tensor:
    """(B, C) log p(completion token | training prompt, earlier completion tokens) at `temperature`
    (0 on padding). Only the C positions that predict completion tokens are projected to the
    vocabulary, and the log-softmax is taken at the completion tokens only (TRL's
    `selective_log_softmax`). When B x C x vocabulary exceeds `max_logit_elements`, the projection
    runs a few rows at a time, each chunk under activation checkpointing (its logits are
    recomputed in the backward pass instead of kept), so peak memory holds one chunk's logits.
    `share_prefix` > 0: a prompt prefix of at least that many tokens common to all rows is
    computed once (`_model_inputs`)."""
    completion_ids = batch["completion_ids"]
    inputs, context = _model_inputs(model, batch, share_prefix)
    b, c = completion_ids.shape
    if max_logit_elements is None or not _plain_head(model) or b * c * int(model.config.vocab_size) <= max_logit_elements:
        with context:
            logits = model(**inputs, logits_to_keep=c + 1).logits
        # position t predicts completion token t; TRL's selective_log_softmax divides by the
        # temperature and takes logit - logsumexp at the chosen token, one row at a time
        logps = selective_log_softmax(logits[:, :-1, :].float(), completion_ids, temperature)
        return logps * batch["completion_mask"]
    with context:
        hidden = model.get_decoder()(**inputs).last_hidden_state[:, -(c + 1) : -1, :]
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
    autocast_dtype: torch.dtype | None = None,
    share_prefix: int = 0,
):
    """The loss.py loss of one collated batch under `model` (a `LossOutput`). `denominator`: the
    aggregation count of the whole minibatch the batch belongs to (`minibatch_count`);
    `max_logit_elements`, `share_prefix`: see `completion_logps`; `autocast_dtype` torch.bfloat16:
    the forward passes run under bf16 autocast, the logprobs and the loss stay float32."""
    device = batch["prompt_ids"].device
    with _precision(autocast_dtype, device):
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


# ---------------------------------------------------------------------------------------------
# the Trainer


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
        **kwargs,
    ):
        super().__init__(*args, **kwargs)
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
        if type(sampler) is not RandomSampler or self.args.world_size > 1:
            return sampler
        minibatch = self.args.train_batch_size * self.args.gradient_accumulation_steps
        if self.groups is not None:
            grouped = GroupShuffleSampler(self.groups, self.args.data_seed if self.args.data_seed is not None else self.args.seed)
            return grouped if self.sort_keys is None else MinibatchSortedSampler(grouped, self.sort_keys, minibatch)
        if self.sort_keys is None:
            return sampler
        if self.args.accelerator_config.use_seedable_sampler:
            # the shuffle accelerate would have put in its place (`prepare_data_loader`), so the
            # minibatches hold the rows they hold unsorted
            from accelerate.data_loader import SeedableRandomSampler

            sampler = SeedableRandomSampler(
                data_source=sampler.data_source, replacement=sampler.replacement, num_samples=sampler._num_samples,
                generator=sampler.generator, data_seed=self.args.data_seed,
            )
        return MinibatchSortedSampler(sampler, self.sort_keys, minibatch)

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
        return minibatch_count(batch_samples, self.loss_config)

    def _rows_to_train(self, inputs) -> tuple[Mapping[str, Any], bool]:
        """(the micro-batch to forward, whether it is only a stand-in of rows whose loss is 0);
        the micro-batch is None when none of its rows needs a forward pass (one process)."""
        keep = trainable_rows(inputs["advantages"].tolist(), inputs["sample_weight"].tolist(), inputs["reward"].tolist(), inputs["strategy"], self.loss_config)
        skipped = len(keep) - sum(keep)
        if not skipped:
            return inputs, False
        self.rows_skipped += skipped
        index = [i for i, k in enumerate(keep) if k]
        if index:
            return select_rows(inputs, index), False
        if self.args.world_size == 1:
            return None, True  # nothing to forward: `compute_loss` returns a zero that reaches every weight
        # several processes: the shortest row alone is forwarded (its gradient is exactly 0), so
        # every process runs the forward and backward passes its gradient sync hooks into
        lengths = inputs["prompt_mask"].sum(1) + inputs["completion_mask"].sum(1)
        return select_rows(inputs, [int(lengths.argmin())]), True

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        denominator = None if num_items_in_batch is None else float(num_items_in_batch)
        batch, stand_in = inputs, False
        if self.skip_zero_rows and model.training:
            batch, stand_in = self._rows_to_train(inputs)
        if batch is None:
            self.micro_batches_skipped += 1
            # no row of this micro-batch can move the weights: a zero with a gradient (of zeros) for
            # every trainable weight, so the optimizer step sees the same gradients as if the rows
            # had been forwarded, without the forward and backward passes through the model
            zero = sum(p.sum() for p in model.parameters() if p.requires_grad) * 0.0
            out = SimpleNamespace(loss=zero)
            batch = select_rows(inputs, [])
        else:
            out = batch_loss(
                model, batch, self.loss_config, self.temperature, self.ref_model, denominator=denominator,
                max_logit_elements=self.max_logit_elements, autocast_dtype=self.autocast_dtype, share_prefix=self.share_prefix,
            )
        if model.training:
            if not stand_in:
                if self.state.global_step == 0:  # before any update: the ratios as sampled vs trained
                    self.first_step_diagnostics = self.first_step_diagnostics.merge(out.diagnostics)
                self.run_diagnostics = self.run_diagnostics.merge(out.diagnostics)
                self._log_diagnostics = self._log_diagnostics.merge(out.diagnostics)
            self.completion_tokens += int(inputs["completion_mask"].sum().item())
            b = batch["prompt_ids"].shape[0]
            self.real_positions += int(batch["prompt_mask"].sum().item() + batch["completion_mask"].sum().item())
            self.padded_positions += b * (batch["prompt_ids"].shape[1] + batch["completion_ids"].shape[1])
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
    """`pipeline.learn.views.view_hash` of `table`."""


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


def _autocast_dtype(dtype: str) -> torch.dtype | None:
    return torch.bfloat16 if dtype == "bfloat16" else None


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
    PPO), computed without gradients in micro-batches of `config.micro_batch_size`, in the
    precision training runs in (`train_dtype`). With `config.skip_zero_rows`, rows whose loss is
    0 (`trainable_rows`) are not forwarded: their anchor, never used, is their sampling logprobs."""
    rows = table.select(["step_id", "train_prompt_ids", "completion_ids", "sampling_logprobs", "advantage", "sample_weight", "strategy", "agent_id"]).to_pylist()
    trainable = _table_trainable(table, config.loss) if config.skip_zero_rows else [True] * len(rows)
    out: list[list[float]] = [list(r["sampling_logprobs"]) for r in rows]
    todo = [i for i, t in enumerate(trainable) if t]
    autocast = _autocast_dtype(train_dtype(config, model))
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for i in range(0, len(todo), config.micro_batch_size):
                chunk = todo[i : i + config.micro_batch_size]
                batch = collate([rows[j] for j in chunk], pad_id)
                with _precision(autocast, batch["prompt_ids"].device):
                    logp = completion_logps(model, batch, config.temperature, logit_elements(config.logits_chunk_mb), config.share_prefix)
                logp = logp.float()
                for k, j in enumerate(chunk):
                    out[j] = logp[k, : len(rows[j]["completion_ids"])].tolist()
    finally:
        model.train(was_training)
    return table.append_column("old_logprobs", pa.array(out, type=pa.list_(pa.float32())))


def training_arguments(config: TrainConfig, output_dir: str | Path, *, use_cuda: bool) -> TrainingArguments:
    """The `transformers.TrainingArguments` of a run under `config`, logging to `output_dir`:
    no intermediate checkpoints, no stdout progress; accelerate's bf16 on a CUDA GPU when the run
    trains in bf16 (`train_dtype`; on a CPU the trainer's own autocast does it, `MaxitTrainer`)."""
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
) -> TrainerRun:
    """Train `model` on the rows of `table` with a `MaxitTrainer` under `args`, the loss of
    `loss_config` at `temperature` (and `ref_model` for its KL term); `callbacks` are
    `transformers.TrainerCallback`s added to the run; `max_logit_elements`: see `completion_logps`;
    `dtype` "bfloat16": forward passes under bf16 autocast; `skip_zero_rows`, `sort_by_length`,
    `share_prefix`: see `TrainConfig`; `optimizer_state`: (state dict, its file) the optimizer
    starts from; `keep_optimizer_state`: return the optimizer's final state dict;
    `group_minibatches`: see `TrainConfig`."""
    if ref_model is not None and not args.use_cpu:
        ref_model = ref_model.to(args.device)
    sort_keys = None
    if sort_by_length:
        sort_keys = row_sort_keys(
            _table_lengths(table), _table_trainable(table, loss_config) if skip_zero_rows else None,
            prefix_groups(table, share_prefix) if share_prefix else None,
        )
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
        autocast_dtype=_autocast_dtype(dtype),
        skip_zero_rows=skip_zero_rows,
        sort_keys=sort_keys,
        share_prefix=share_prefix,
        optimizer_state=optimizer_state,
        groups=prompt_groups(table) if group_minibatches else None,
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
        rows_skipped=trainer.rows_skipped,
        micro_batches_skipped=trainer.micro_batches_skipped,
        padding_fraction=1.0 - trainer.real_positions / trainer.padded_positions if trainer.padded_positions else 0.0,
        dtype=dtype,
        optimizer_state=trainer.optimizer.state_dict() if keep_optimizer_state and trainer.optimizer is not None else None,
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
    carry = config.optimizer_state == "carry"
    parent_state = init_dir / OPTIMIZER_STATE if carry and (init_dir / OPTIMIZER_STATE).is_file() else None
    with atomic_dir(out_dir) as tmp:
        run = TrainerRun(model=model, dtype=config.dtype)
        if table.num_rows:
            args = training_arguments(config, tmp / "logs", use_cuda=torch.cuda.is_available())
            log.info("policy %s: training %d rows in %s", policy_id, table.num_rows, config.dtype)
            run = run_trainer(
                model, tokenizer, table, args, config.loss, config.temperature, pad_id=pad_id, ref_model=ref_model, callbacks=callbacks,
                max_logit_elements=logit_elements(config.logits_chunk_mb), dtype=config.dtype,
                skip_zero_rows=config.skip_zero_rows, sort_by_length=config.sort_by_length, share_prefix=config.share_prefix,
                optimizer_state=(load_optimizer_state(parent_state), str(parent_state)) if parent_state else None, keep_optimizer_state=carry,
                group_minibatches=config.group_minibatches,
            )
            if run.rows_skipped:
                log.info("policy %s: %d row visits skipped (loss exactly 0); padding %.1f%%", policy_id, run.rows_skipped, 100 * run.padding_fraction)
        visits = visit_range(table.column("step_id").to_pylist(), run.rows_seen)
        if visits[0] != visits[1]:
            log.warning("policy %s: rows were trained on unevenly (%d to %d times)", policy_id, *visits)
        meta = checkpoint_meta(policy_id, init_dir, rows, config, checkpoint_metrics(run, rows.n_dropped_too_long))
        lora_base = (adapter_base(init_dir) or init_dir) if config.lora is not None else None
        save_checkpoint(tmp, run.model, tokenizer, meta, lora_base=lora_base)
        if run.optimizer_state is not None:
            torch.save(run.optimizer_state, tmp / OPTIMIZER_STATE)
        elif parent_state is not None:  # nothing trained: the parent's state goes on unchanged
            shutil.copyfile(parent_state, tmp / OPTIMIZER_STATE)
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
