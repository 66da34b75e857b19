"""The stages of a round by their one name, and the seconds each took (the round's `timings` table).

A stage has one name everywhere it is shown: its Dagster asset, its `stage_*` function, the table
it writes (where it writes one named for it), its row of the `timings` table and its round-table
column (`s_` + the name, `seconds_column`). Seconds are recorded one way, `record_timings`: a
stage records its own seconds and the parts of them spent in `SUBSTAGES` in one write; the merge
of a sharded stage records the shards' seconds the same way; whoever runs a whole round records
the rest of its wall time as "other" (`record_other`)."""

from __future__ import annotations

import math
from typing import Mapping

import polars as pl

from pipeline.errors import ConfigError
from pipeline.store import BASE_ROUND, Tables
from schemas import TIMINGS, polars_schema

__all__ = [
    "STAGES",
    "SUBSTAGES",
    "TIMING_ROWS",
    "OLD_STAGE_LABELS",
    "seconds_column",
    "record_timings",
    "record_other",
    "read_timings",
]

STAGES = ("problems", "rollouts", "advantages", "training_view", "policy", "evaluation")
"""The stages of a round in order: their Dagster assets, `stage_*` functions, timings rows and
round-table columns (`s_<stage>`)."""

SUBSTAGES = ("sandbox", "engine_start", "engine_swap")
"""Rows of a round's `timings` table that are parts of other stages' time, not added to it:
"sandbox", the seconds the round waited on model-written programs (a workflow's `sandbox_seconds`:
the code workflow's tests, in its rollouts and evaluation); "engine_start", building engines, and
"engine_swap", pointing live engines at new checkpoints (`EnginePool`), in rollouts and evaluation."""

TIMING_ROWS = (*STAGES, "other", *SUBSTAGES)
"""The rows of a round's `timings` table, in round order ("other": the round's wall time the
stages do not account for, recorded by whoever runs the whole round, e.g. `maxit run`)."""

OLD_STAGE_LABELS = {"view": "training_view", "training": "policy"}
"""The labels stores written before one name per stage used in their `timings` tables, read as
the stages' names (`read_timings`)."""


def seconds_column(stage: str) -> str:
    """The round table's column of a timings row's seconds: `s_<stage>`."""
    return f"s_{stage}"


def _checked(seconds: Mapping[str, float]) -> dict[str, float]:
    for stage, value in seconds.items():
        if stage not in TIMING_ROWS:
            raise ConfigError(f"timings: stage must be one of {TIMING_ROWS}, got {stage!r}")
        if not math.isfinite(value) or value < 0:
            raise ConfigError(f"timings: seconds of stage {stage!r} must be finite and >= 0, got {value!r}")
    return {k: float(v) for k, v in seconds.items()}


def read_timings(tables: Tables, round_: int) -> pl.DataFrame:
    """Round `round_`'s `timings` table (empty when it has none), the old labels read as the
    stages' names."""
    schema = polars_schema(TIMINGS)
    if not tables.exists(round_, "timings"):
        return pl.DataFrame(schema=schema)
    old = tables.read(round_, "timings").select(*schema)
    return old.with_columns(pl.col("stage").replace(OLD_STAGE_LABELS))


def record_timings(tables: Tables, round_: int, seconds: Mapping[str, float] = {}, added: Mapping[str, float] = {}) -> None:
    """Record seconds in round `round_`'s `timings` table, in one write: each of `seconds` (a
    stage, "other" or a substage) replaces an earlier value of its row (a re-run round records its
    own times), each of `added` adds to its row (substages several stages contribute to). The
    stages of a round run one after another."""
    seconds, added = _checked(seconds), _checked({k: v for k, v in added.items() if v > 0})
    if not seconds and not added:
        return
    table = read_timings(tables, round_)
    values = dict(table.select("stage", "seconds").rows())
    values.update(seconds)
    for stage, value in added.items():
        values[stage] = values.get(stage, 0.0) + value
    order = {name: i for i, name in enumerate(TIMING_ROWS)}
    rows = sorted(values.items(), key=lambda kv: order.get(kv[0], len(order)))
    frame = pl.DataFrame({"round": [round_] * len(rows), "stage": [k for k, _ in rows], "seconds": [v for _, v in rows]}, schema=polars_schema(TIMINGS))
    tables.write(round_, "timings", frame)


def record_other(tables: Tables, round_: int, wall_seconds: float, started: float) -> None:
    """Record as "other" the part of a round's wall time (`wall_seconds`, begun at Unix time
    `started`) its stages did not account for. The starting model's evaluation, run with round 0,
    is recorded as round -1's (when its timings were written since `started`), not as "other"."""
    staged = 0.0
    for r in (round_, BASE_ROUND):
        path = tables.path(r, "timings")
        if path.exists() and (r == round_ or path.stat().st_mtime >= started):
            staged += float(read_timings(tables, r).filter(pl.col("stage").is_in(STAGES))["seconds"].sum())
    record_timings(tables, round_, {"other": max(0.0, wall_seconds - staged)})
