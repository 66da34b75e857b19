"""The Verifier's hindsight-labelled replay (`ViewConfig.verifier_replay`): its verdicts of this
round and earlier ones, each turned into a row of the right verdict, as training-view rows that
replace its own rows of a view.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.config import ViewConfig
from pipeline.errors import DataError
from pipeline.learn.verdicts import relabel_verdicts
from pipeline.learn.view_filters import INPUT_COLUMNS
from pipeline.learn.view_weights import balance_weights
from pipeline.learn.views import build_training_view
from schemas import TRAINING_VIEW, to_arrow, validate

__all__ = ["REPLAY_STRATEGY", "verifier_replay", "with_verifier_replay"]

REPLAY_STRATEGY = "replay"
"""Strategy id of the Verifier's replay rows in a training view (trained by their NLL)."""


def verifier_replay(tables, strategies: Mapping[str, object], tokenizer, config: ViewConfig = ViewConfig()) -> tuple[pa.Table, int]:
    """The Verifier's hindsight-labelled replay as training-view rows (see `ViewConfig.verifier_replay`).

    `tables`: advantages tables (pyarrow or Polars), newest first (this round's, then earlier
    rounds'). Every active Verifier call with a parsed verdict and a known local reward (was its
    verdict right?) becomes a row of the right verdict: its own completion where it was right,
    else the most common right completion of the other verdict (`relabel_verdicts`); one row per
    (policy, training prompt), the newest; "yes" and "no" rows balanced to equal total weight.
    The rows keep their step id (unique across rounds: it carries the round), round, turn and
    temperature, and get reward 1, advantage 1 and strategy `REPLAY_STRATEGY`. Returns (rows,
    number relabelled)."""
    columns = list(INPUT_COLUMNS) + ["verdict", "local_reward"]
    parts = []
    for t in tables:
        t = to_arrow(t)
        missing = [c for c in ("verdict", "local_reward") if c not in t.column_names]
        if missing:
            raise DataError(f"verifier_replay needs the {missing} column(s) of the advantages table")
        parts.append(t.select(columns).cast(pa.schema([t.schema.field(c) for c in columns])))
    if not parts:
        return TRAINING_VIEW.schema.empty_table(), 0
    table = pa.concat_tables(parts, promote_options="permissive").combine_chunks()
    verdict = table.column("verdict")
    local = table.column("local_reward")
    keep = pc.and_(
        pc.and_(pc.is_valid(verdict), pc.is_valid(local)),
        pc.fill_null(table.column("active"), False),
    )
    table = table.filter(keep)
    # the reward of a replay row is its verdict's own correctness, whatever the run mixed in
    table = table.set_column(table.schema.get_field_index("reward"), "reward", pc.cast(table.column("local_reward"), pa.float64()))
    table, n_relabeled = relabel_verdicts(table)
    right = pc.greater_equal(table.column("reward"), 1.0)
    table = table.filter(right)  # a verdict kind never right in the window has no completion to learn
    n = table.num_rows
    table = table.set_column(table.schema.get_field_index("advantage"), "advantage", pa.array(np.ones(n), pa.float64()))
    table = table.set_column(table.schema.get_field_index("sample_weight"), "sample_weight", pa.array(np.ones(n), pa.float64()))
    view, _ = build_training_view(
        table.drop_columns(["local_reward"]),
        strategies,
        tokenizer,
        ViewConfig(max_length=config.max_length, drop_zero_advantage=False, policy_ids=config.policy_ids),
    )
    verdict_of = dict(zip(table.column("step_id").to_pylist(), table.column("verdict").to_pylist()))
    # one row per (policy, training prompt): the first, i.e. the newest round's
    seen: set = set()
    first = []
    for i, (pid, ids) in enumerate(zip(view.column("policy_id").to_pylist(), view.column("train_prompt_ids").to_pylist())):
        key = (pid, tuple(ids))
        if key not in seen:
            seen.add(key)
            first.append(i)
    view = view.take(pa.array(first, pa.int64()))
    view = view.set_column(view.schema.get_field_index("strategy"), view.schema.field("strategy"), pa.array([REPLAY_STRATEGY] * view.num_rows, pa.string()))
    out = []
    for pid in sorted(set(view.column("policy_id").to_pylist())):
        part = view.filter(pc.equal(view.column("policy_id"), pid))
        part, _ = balance_weights(part, [verdict_of[s] for s in part.column("step_id").to_pylist()])
        out.append(part)
    view = pa.concat_tables(out) if out else view
    return view.replace_schema_metadata(None).cast(TRAINING_VIEW.schema), n_relabeled


def with_verifier_replay(view: pa.Table, replay: pa.Table, verifier_id: str) -> pa.Table:
    """`view` with its own Verifier rows replaced by the replay rows (same schema, metadata kept)."""
    meta = view.schema.metadata
    own = view.filter(pc.not_equal(view.column("agent_id"), verifier_id))
    out = pa.concat_tables([own.replace_schema_metadata(None), replay.cast(own.schema.remove_metadata())])
    out = out.replace_schema_metadata(meta)
    validate(out, TRAINING_VIEW)
    return out
