"""The version threshold: rows sampled too many rounds before the checkpoint they train are
dropped or down-weighted before the training view is built.

A row's staleness at training time is the round of the checkpoint its round trains from minus
the round of the checkpoint that sampled it (`policy_round`). For the round's own rows that is
their `staleness` column; a row replayed from an earlier round (the Verifier's replay) is older by
the rounds since. Rows of stores written before `policy_round` existed were sampled by the
checkpoint of the round before theirs (rounds were synchronous then).

This is the version threshold of asynchronous trainers (TRL's `AsyncGRPOTrainer` drops samples
older than `max_staleness`; verl's fully-async recipe and SkyRL bound the policy versions a batch
may span): `max_row_staleness` K and `stale_row_weight` w, rows over K weighted by w (0: dropped).
"""

from __future__ import annotations

from typing import Mapping

import polars as pl


__all__ = ["row_staleness", "apply_version_threshold"]

def row_staleness(trained_round: int | Mapping[str, int]) -> pl.Expr:
    """Each row's staleness when trained from round `trained_round`'s checkpoint (one round for
    every policy, or policy_id -> round: each policy trains its own, e.g. with `--start-from
    best`): `trained_round - policy_round`, with `round - 1` where `policy_round` is null or
    absent; null for a policy the mapping lacks."""
    if isinstance(trained_round, Mapping):
        trained = pl.col("policy_id").replace_strict(dict(trained_round), default=None, return_dtype=pl.Int32)
    else:
        trained = pl.lit(trained_round)
    return (trained - pl.col("policy_round").fill_null(pl.col("round") - 1)).cast(pl.Int32)


def apply_version_threshold(rows, trained_round: int | Mapping[str, int], max_row_staleness: int | None, weight: float) -> pl.DataFrame:
    """`rows` (an `advantages` table, Arrow or Polars) with the rows staler than
    `max_row_staleness` at `trained_round` (one round, or policy_id -> the round of the
    checkpoint that policy trains from) weighted by `weight` (`sample_weight` times it), or
    dropped when `weight` is 0; unchanged when `max_row_staleness` is None. A row of a policy
    the mapping lacks trains no checkpoint here and is left as it is."""
    frame = rows if isinstance(rows, pl.DataFrame) else pl.from_arrow(rows)
    if max_row_staleness is None:
        return frame
    if "policy_round" not in frame.columns:
        frame = frame.with_columns(pl.lit(None, dtype=pl.Int32).alias("policy_round"))
    stale = (row_staleness(trained_round) > max_row_staleness).fill_null(False)
    if weight == 0:
        return frame.filter(~stale)
    return frame.with_columns(pl.when(stale).then(pl.col("sample_weight") * weight).otherwise(pl.col("sample_weight")).alias("sample_weight"))
