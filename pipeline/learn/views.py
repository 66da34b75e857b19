"""Training views: the context swap of expert iteration (docs/ALGORITHMS.md#the-context-swap).

A row of the advantages table holds a completion sampled under `sampling_messages`. Its training
row keeps the completion token ids and their sampling logprobs verbatim (never re-tokenized, never
recomputed) and rebuilds only the context: `strategy.training_messages(sampling_messages, turn,
agent_id)`, rendered with the same chat template (`encode_prompt`). Where the strategy leaves the
messages unchanged, the stored `prompt_ids` are reused as they are (no re-render).

A row enters the view when it is active, has a reward, its strategy trains that (turn, agent),
its sample weight is > 0 and (by default) its advantage is not zero. Rows whose training prompt +
completion exceed `ViewConfig.max_length` are dropped and counted in `ViewStats`, never truncated.
The input checks and row filters are `pipeline.learn.view_filters`, the stratified and balanced
weights `pipeline.learn.view_weights`, the Verifier's relabelled verdicts and replay
`pipeline.learn.verdicts` and `pipeline.learn.verifier_replay`.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field
from typing import Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.config import ViewConfig
from pipeline.errors import DataError
from pipeline.learn.view_filters import check_finite, check_lengths, rows_to_keep, step_ids_of, view_input
from pipeline.learn.view_weights import balance_weights, stratified_weights
from pipeline.models.chat import encode_prompt
from schemas import TRAINING_VIEW, to_arrow, validate

__all__ = ["ViewStats", "STATS_METADATA_KEY", "build_training_view", "view_hash", "to_dataset", "check_view"]

log = logging.getLogger(__name__)

STATS_METADATA_KEY = b"maxit.view_stats"


@dataclass(frozen=True)
class ViewStats:
    """What happened to the input rows (each input row is counted under exactly one reason)."""

    n_input: int = 0
    """Rows of the advantages table given."""
    n_rows: int = 0
    """Rows in the view."""
    n_inactive: int = 0
    """Dropped: inactive."""
    n_null_reward: int = 0
    """Dropped: no reward."""
    n_other_policy: int = 0
    """Dropped: policy not in `ViewConfig.policy_ids`."""
    n_not_trainable: int = 0
    """Dropped: the strategy does not train this (turn, agent) (e.g. feedback's skipped first attempt)."""
    n_zero_weight: int = 0
    """Dropped: sample_weight <= 0."""
    n_zero_advantage: int = 0
    """Dropped: zero advantage (with `drop_zero_advantage`)."""
    n_below_min_reward: int = 0
    """Dropped: reward below `min_reward`."""
    n_too_long: int = 0
    """Dropped: training prompt + completion longer than `max_length` (never truncated)."""
    n_context_swapped: int = 0
    """Rows of the view whose training prompt differs from the sampling prompt."""
    n_rerendered: int = 0
    """Rows whose training context was rendered anew (the others reuse `prompt_ids`)."""
    n_relabeled: int = 0
    """Verifier rows trained on the right verdict instead of their wrong one (`relabel_verdicts`)."""
    by_strategy: Mapping[str, int] = field(default_factory=dict)
    """Rows of the view per strategy."""


def build_training_view(
    advantages, strategies: Mapping[str, object], tokenizer, config: ViewConfig = ViewConfig()
) -> tuple[pa.Table, ViewStats]:
    """The training view of an advantages table (pyarrow or Polars) and what was dropped.

    `strategies` maps a strategy id (the `strategy` column) to its Strategy object. The view has
    the `training_view` schema, rows in input order; its `ViewStats` are also kept in the schema
    metadata (key `maxit.view_stats`)."""
    table, n_relabeled = view_input(advantages, strategies, config)
    keep, sampled, counts = rows_to_keep(table, strategies, config)
    contexts = _training_contexts(table, keep, strategies, tokenizer, config)
    keep &= ~contexts.too_long
    weight = table.column("sample_weight").to_numpy(zero_copy_only=False).astype(np.float64)
    if config.strategy_weights is not None:
        weight = stratified_weights(table, weight, keep, sampled, config.strategy_weights)
    kept = table.filter(pa.array(keep))
    view = _view_table(kept, contexts, weight[keep])
    if config.balance_verdicts:
        view, info = balance_weights(view, kept.column("verdict").to_pylist())
        log.info("verifier verdict balance: %s", {str(k): f"{n} rows x {sc:.3f}" for k, (n, sc) in info.items()})
    by_strategy: dict[str, int] = {}
    for s in view.column("strategy").to_pylist():
        by_strategy[s] = by_strategy.get(s, 0) + 1
    stats = ViewStats(
        n_input=table.num_rows,
        n_rows=view.num_rows,
        n_too_long=int(contexts.too_long.sum()),
        n_context_swapped=int(sum(contexts.swapped)),
        n_rerendered=contexts.n_rerendered,
        n_relabeled=n_relabeled,
        by_strategy=by_strategy,
        **counts,
    )
    meta = {STATS_METADATA_KEY: json.dumps(asdict(stats)).encode()}
    view = view.replace_schema_metadata(meta)
    validate(view, TRAINING_VIEW)
    log.info("training view: %s", stats)
    return view, stats


@dataclass(frozen=True)
class _Contexts:
    """The training contexts of the kept rows (`_training_contexts`)."""

    train_prompts: list[list[int]]
    """Training prompt ids of each kept row that fits `max_length`, in table order."""
    swapped: list[bool]
    """Per such row: its training prompt differs from the sampling prompt."""
    n_rerendered: int
    """Rows whose training context was rendered anew."""
    too_long: np.ndarray
    """Per input row: dropped because training prompt + completion exceed `max_length`."""


def _training_contexts(table: pa.Table, keep: np.ndarray, strategies: Mapping[str, object], tokenizer, config: ViewConfig) -> _Contexts:
    """The context swap: each kept row's training context rebuilt through its strategy (the
    stored `prompt_ids` reused where the messages are unchanged), rows then too long dropped."""
    strat_col = table.column("strategy").to_pylist()
    turns = table.column("turn").to_numpy(zero_copy_only=False)
    agents = table.column("agent_id").to_pylist()
    messages_col = table.column("sampling_messages")
    prompt_col = table.column("prompt_ids")
    step_ids = table.column("step_id").to_pylist()
    n_completion = pc.list_value_length(table.column("completion_ids")).to_numpy(zero_copy_only=False)
    train_prompts: list[list[int]] = []
    swapped: list[bool] = []
    n_rerendered = 0
    too_long = np.zeros(table.num_rows, dtype=bool)
    for i in np.flatnonzero(keep):
        i, step_id = int(i), step_ids[int(i)]
        sampling = messages_col[i].as_py()
        try:
            training = strategies[strat_col[i]].training_messages(sampling, int(turns[i]), agents[i])
        except DataError as err:
            raise DataError(f"training context of step_id {step_id!r} (strategy {strat_col[i]!r}): {err}") from None
        stored = prompt_col[i].as_py()
        ids, rerendered = _training_prompt(training, sampling, stored, tokenizer, config, step_id)
        n_rerendered += rerendered
        if config.max_length is not None and len(ids) + int(n_completion[i]) > config.max_length:
            too_long[i] = True
            continue
        train_prompts.append(ids)
        swapped.append(ids != stored)
    if too_long.any():
        log.warning(
            "training view: dropped %d row(s) longer than max_length=%d (step_id %s)",
            int(too_long.sum()), config.max_length, step_ids_of(table, too_long),
        )
    return _Contexts(train_prompts=train_prompts, swapped=swapped, n_rerendered=n_rerendered, too_long=too_long)


def _training_prompt(training, sampling, stored: list[int], tokenizer, config: ViewConfig, step_id) -> tuple[list[int], bool]:
    """(the prompt ids of the `training` messages, whether they were rendered anew): the stored
    sampling prompt when the messages are the sampling ones (checked by rendering them under
    `check_identity_render`), else the messages rendered with the chat template."""
    if [(m["role"], m["content"]) for m in training] != [(m["role"], m["content"]) for m in sampling]:
        return encode_prompt(tokenizer, training), True
    if config.check_identity_render and encode_prompt(tokenizer, training) != stored:
        raise DataError(
            f"re-rendering the sampling messages of step_id {step_id!r} gives "
            f"prompt ids that differ from 'prompt_ids': the tokenizer or chat template is not the sampling one"
        )
    return stored, False


def _view_table(kept: pa.Table, contexts: _Contexts, weight: np.ndarray) -> pa.Table:
    """The view's columns of the `kept` rows, their training prompts and sample weights."""
    view = pa.table(
        {
            "step_id": kept.column("step_id"),
            "policy_id": kept.column("policy_id"),
            "agent_id": kept.column("agent_id"),
            "strategy": kept.column("strategy"),
            "train_prompt_ids": pa.array(contexts.train_prompts, type=pa.list_(pa.int32())),
            "completion_ids": kept.column("completion_ids").cast(pa.list_(pa.int32())),
            "sampling_logprobs": kept.column("completion_logprobs").cast(pa.list_(pa.float32())),
            "advantage": kept.column("advantage"),
            "sample_weight": pa.array(weight, type=pa.float64()),
            "reward": kept.column("reward"),
            "context_swapped": pa.array(contexts.swapped, type=pa.bool_()),
            "round": kept.column("round"),
            "turn": kept.column("turn"),
            "temperature": kept.column("temperature"),
        }
    )
    return view.cast(TRAINING_VIEW.schema)


def check_view(view) -> pa.Table:
    """Validate a training view (schema, and ids/logprobs lengths per row); return it as Arrow."""
    table = to_arrow(view)
    validate(table, TRAINING_VIEW)
    check_lengths(table.combine_chunks(), "completion_ids", "sampling_logprobs")
    for col in ("advantage", "sample_weight"):
        check_finite(table, col)
    lengths = pc.list_value_length(table.column("train_prompt_ids")).to_numpy(zero_copy_only=False)
    if (lengths == 0).any():
        raise DataError(f"'train_prompt_ids' is empty in step_id {step_ids_of(table, lengths == 0)}")
    return table


def to_dataset(view):
    """A `datasets.Dataset` over the view's Arrow table (no copy through Python objects)."""
    from datasets import Dataset
    from datasets.table import InMemoryTable

    table = to_arrow(view)
    return Dataset(InMemoryTable(table.replace_schema_metadata(None)))


def view_hash(view) -> str:
    """A content hash of a view's rows (its `training_view` columns, rows ordered by step_id),
    independent of row order, chunking and extra columns: the `data hash` of a checkpoint."""
    import hashlib

    table = to_arrow(view).select([f.name for f in TRAINING_VIEW.schema]).combine_chunks()
    table = table.take(pc.sort_indices(table, sort_keys=[("step_id", "ascending")]))
    h = hashlib.blake2b(digest_size=16)
    h.update(str(table.num_rows).encode())
    for f in TRAINING_VIEW.schema:
        col = table.column(f.name)
        h.update(f.name.encode() + b"\x00")
        if pa.types.is_list(col.type) or pa.types.is_large_list(col.type):
            h.update(pc.list_value_length(col).to_numpy(zero_copy_only=False).astype(np.int64).tobytes())
            dtype = np.int64 if pa.types.is_integer(col.type.value_type) else np.float64
            h.update(pc.list_flatten(col).to_numpy(zero_copy_only=False).astype(dtype).tobytes())
        elif pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
            h.update("\x00".join(col.to_pylist()).encode())
        else:
            h.update(np.asarray(col.is_null().to_numpy(zero_copy_only=False), dtype=bool).tobytes())
            h.update(col.cast(pa.float64()).fill_null(0.0).to_numpy(zero_copy_only=False).tobytes())
    return h.hexdigest()
