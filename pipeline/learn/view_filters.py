"""Which rows of an advantages table enter a training view (`pipeline.learn.views`): the
table checked as the view's input (its columns, token ids against their logprobs, finite values, a
strategy object for every strategy id), the Verifier's verdicts relabelled where asked, and the
filters that drop rows, each dropped row counted under the first reason that applies.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.config import ViewConfig
from pipeline.errors import ConfigError, DataError
from pipeline.learn.verdicts import relabel_verdicts
from schemas import ADVANTAGES, TableSchema, to_arrow, validate

__all__ = ["INPUT_COLUMNS", "VIEW_INPUT", "view_input", "rows_to_keep", "check_lengths", "check_finite", "check_reward_is_local", "step_ids_of"]

INPUT_COLUMNS = (
    "step_id",
    "round",
    "strategy",
    "agent_id",
    "policy_id",
    "turn",
    "active",
    "sampling_messages",
    "prompt_ids",
    "completion_ids",
    "completion_logprobs",
    "reward",
    "advantage",
    "sample_weight",
    "temperature",
)
VIEW_INPUT = TableSchema(
    "advantages (training-view input)",
    pa.schema([ADVANTAGES.schema.field(c) for c in INPUT_COLUMNS]),
    row_id="step_id",
    unique=("step_id",),
)


def step_ids_of(table: pa.Table, mask: np.ndarray, limit: int = 10) -> str:
    """The step ids of the rows in `mask` (the first `limit` of them), for an error message."""
    ids = [table.column("step_id")[int(i)].as_py() for i in np.flatnonzero(mask)[:limit]]
    more = f" and {int(mask.sum()) - limit} more" if int(mask.sum()) > limit else ""
    return ", ".join(repr(i) for i in ids) + more


def check_reward_is_local(table: pa.Table) -> None:
    if "local_reward" not in table.column_names:
        raise DataError("the 'rs' view needs the 'local_reward' column (each row's own correctness)")
    reward = table.column("reward").to_numpy(zero_copy_only=False).astype(np.float64)
    local = table.column("local_reward").to_numpy(zero_copy_only=False).astype(np.float64)
    differ = ~np.isnan(reward) & (reward != local)  # null rewards are dropped anyway
    if differ.any():
        raise ConfigError(
            f"the 'rs' loss keeps rows whose own action was right, but 'reward' differs from 'local_reward' in "
            f"{int(differ.sum())} row(s) (step_id {step_ids_of(table, differ)}): the advantages were computed with a global term "
            "mixed in; recompute them with --alpha 0 --local-weight 1 (maxit advantages)"
        )


def check_lengths(table: pa.Table, ids_col: str, lp_col: str) -> None:
    """Token ids and their logprobs must pair up; NaN logprobs are unusable."""
    n_ids = pc.list_value_length(table.column(ids_col)).to_numpy(zero_copy_only=False)
    n_lp = pc.list_value_length(table.column(lp_col)).to_numpy(zero_copy_only=False)
    bad = n_ids != n_lp
    if bad.any():
        raise DataError(f"{ids_col!r} and {lp_col!r} differ in length in {int(bad.sum())} row(s) (step_id {step_ids_of(table, bad)})")
    empty = n_ids == 0
    if empty.any():
        raise DataError(f"{ids_col!r} is empty in {int(empty.sum())} row(s) (step_id {step_ids_of(table, empty)})")
    flat = pc.list_flatten(table.column(lp_col)).to_numpy(zero_copy_only=False).astype(np.float64)
    if flat.size and not np.isfinite(flat).all():
        owner = np.repeat(np.arange(table.num_rows), n_lp)
        bad_rows = np.zeros(table.num_rows, dtype=bool)
        bad_rows[owner[~np.isfinite(flat)]] = True
        raise DataError(f"{lp_col!r} holds NaN/inf in {int(bad_rows.sum())} row(s) (step_id {step_ids_of(table, bad_rows)})")


def check_finite(table: pa.Table, col: str) -> None:
    """NaN or infinite values are an error naming the rows (a null, where allowed, is not NaN)."""
    column = table.column(col)
    v = column.to_numpy(zero_copy_only=False).astype(np.float64)
    null = np.asarray(column.is_null().to_numpy(zero_copy_only=False), dtype=bool)
    bad = ~np.isfinite(v) & ~null
    if bad.any():
        raise DataError(f"{col!r} is NaN or infinite in {int(bad.sum())} row(s) (step_id {step_ids_of(table, bad)})")


def view_input(advantages, strategies: Mapping[str, object], config: ViewConfig) -> tuple[pa.Table, int]:
    """The advantages table checked (schema, the columns `config` needs, token ids against their
    logprobs, finite values, a strategy object for every strategy id) and cut to the columns the
    view reads, the Verifier's verdicts relabelled under `relabel_verdicts`; and how many were."""
    table = to_arrow(advantages)
    validate(table, VIEW_INPUT)
    use_verdict = config.balance_verdicts or config.relabel_verdicts
    if use_verdict and "verdict" not in table.column_names:
        what = "balance_verdicts" if config.balance_verdicts else "relabel_verdicts"
        raise DataError(f"{what} needs the 'verdict' column (the Verifier's parsed verdicts, written by the rollouts)")
    if config.reward_is_local:
        check_reward_is_local(table)
    columns = list(INPUT_COLUMNS) + (["verdict"] if use_verdict else [])
    table = table.select(columns).combine_chunks()
    check_lengths(table, "completion_ids", "completion_logprobs")
    n_relabeled = 0
    if config.relabel_verdicts:
        table, n_relabeled = relabel_verdicts(table)
    for col in ("advantage", "sample_weight", "reward"):
        check_finite(table, col)
    strat_col = table.column("strategy").to_pylist()
    unknown = sorted(set(strat_col) - set(strategies))
    if unknown:
        bad = np.array([s in unknown for s in strat_col])
        raise ConfigError(f"no strategy object for strategy id(s) {unknown} (step_id {step_ids_of(table, bad)}); known: {sorted(strategies)}")
    return table, n_relabeled


def rows_to_keep(table: pa.Table, strategies: Mapping[str, object], config: ViewConfig) -> tuple[np.ndarray, np.ndarray, dict[str, int]]:
    """(the rows that enter the view before the length check, the rows the stratified weights
    count as sampled, the `ViewStats` count of each reason a row was dropped)."""
    n = table.num_rows
    strat_col = table.column("strategy").to_pylist()
    active = table.column("active").to_numpy(zero_copy_only=False).astype(bool)
    has_reward = ~np.asarray(table.column("reward").is_null().to_numpy(zero_copy_only=False), dtype=bool)
    turns = table.column("turn").to_numpy(zero_copy_only=False)
    agents = table.column("agent_id").to_pylist()
    policies = table.column("policy_id").to_pylist()
    weight = table.column("sample_weight").to_numpy(zero_copy_only=False)
    adv = table.column("advantage").to_numpy(zero_copy_only=False)

    in_policy = np.ones(n, dtype=bool) if config.policy_ids is None else np.array([p in config.policy_ids for p in policies], dtype=bool)
    trainable = np.array(
        [s not in config.drop_strategies and bool(strategies[s].trainable(int(t), a)) for s, t, a in zip(strat_col, turns, agents)], dtype=bool
    )
    nonzero = np.abs(adv) > config.zero_advantage_tol if config.drop_zero_advantage else np.ones(n, dtype=bool)

    # each dropped row is counted under the first reason that applies, in this order
    reasons = [
        ("n_inactive", active),
        ("n_null_reward", has_reward),
        ("n_other_policy", in_policy),
        ("n_not_trainable", trainable),
        ("n_zero_weight", weight > 0),
        ("n_zero_advantage", nonzero),
    ]
    if config.min_reward is not None:
        rewards = table.column("reward").to_numpy(zero_copy_only=False).astype(float)
        reasons.append(("n_below_min_reward", np.nan_to_num(rewards, nan=-np.inf) >= config.min_reward))
    keep = np.ones(n, dtype=bool)
    counts: dict[str, int] = {}
    sampled = keep
    for name, ok in reasons:
        counts[name] = int((keep & ~ok).sum())
        keep &= ok
        if name == "n_zero_weight":
            # the stratified weights' n_s counts what a strategy sampled for a policy to train,
            # before the advantage and reward filters (degenerate groups must not shift the mix)
            sampled = keep.copy()
    return keep, sampled, counts
