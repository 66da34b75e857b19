"""What one finished round of a store logs to the experiment trackers (`collect_round`), read back
from its tables: pure functions from a table to named finite scalars, one per source (its
evaluation, the round table `maxit run` prints, its rollouts, importance ratios, seconds and the
registry's training summary), and the store's settings as flat values (`settings_values`). The
names and what each holds: `pipeline.reporting.tracking`, which writes them."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import polars as pl

from pipeline import store as st
from pipeline.errors import MaxitError
from pipeline.reporting.report import STAGE_COLUMNS, round_summary, trajectory_success
from pipeline.rollout.rewards import CORRECT_THRESHOLD
from pipeline.run.experiment_record import read_experiment
from pipeline.run.timings import read_timings
from pipeline.store import BASE_ROUND
from pipeline.store.registry import PolicyRegistry

__all__ = [
    "RoundScalars",
    "collect_round",
    "evaluation_scalars",
    "summary_scalars",
    "reward_scalars",
    "ratio_scalars",
    "timing_scalars",
    "training_scalars",
    "settings_values",
]


# -- what a round logs: pure functions over its tables ----------------------------------------


@dataclass(frozen=True)
class RoundScalars:
    """The numbers one round logs."""

    round: int
    """Round number (-1: the starting checkpoints); the step they are logged at."""
    values: Mapping[str, float]
    """Metric name ("heldout/solver/accuracy", ...) -> finite value."""


_NAME = re.compile(r"[^\w./\- ]")


def _name(*parts: object) -> str:
    """A metric name every target accepts (MLflow allows letters, digits, _ - . / and space):
    "*" ("all agents" in ratio_diagnostics) becomes "all", any other character "_"."""
    return "/".join(_NAME.sub("_", "all" if str(p) == "*" else str(p)) for p in parts)


def _finite(values: Mapping[str, Any]) -> dict[str, float]:
    """The entries whose value is a finite number, as floats (nulls and NaN are left out)."""
    out = {}
    for key, value in values.items():
        if isinstance(value, bool) or value is None:
            continue
        if isinstance(value, (int, float)) and math.isfinite(value):
            out[key] = float(value)
    return out


def evaluation_scalars(evaluation: pl.DataFrame) -> dict[str, float]:
    """`<split>/<agent_id>/<metric>` of an evaluation table (one round's); a (split, agent,
    metric) listed twice keeps its first row."""
    rows = evaluation.unique(["split", "agent_id", "metric"], keep="first", maintain_order=True)
    return _finite({_name(r["split"], r["agent_id"], r["metric"]): r["value"] for r in rows.iter_rows(named=True)})


def summary_scalars(summary: pl.DataFrame, round_: int, skip: Sequence[str] = ()) -> dict[str, float]:
    """`summary/<column>` of the round table's row for `round_` (columns in `skip` left out)."""
    row = summary.filter(pl.col("round") == round_)
    if row.height == 0:
        return {}
    values = row.row(0, named=True)
    return _finite({_name("summary", c): v for c, v in values.items() if c != "round" and c not in skip})


def reward_scalars(steps: pl.DataFrame) -> dict[str, float]:
    """From one round's `steps` rows: per agent and per strategy, over active rows, the mean
    local and global reward (null rewards left out) and the number of calls; per agent the share
    of its scored calls whose local reward counts as correct; per strategy the trajectory
    success (mean final team reward of its trajectories, a tree counted once)."""
    active = steps.filter(pl.col("active"))
    out: dict[str, float] = {}
    for key in ("agent_id", "strategy"):
        kind = "agent" if key == "agent_id" else "strategy"
        table = (
            active.group_by(key)
            .agg(
                pl.col("local_reward").mean().alias("local_reward"),
                pl.col("global_reward").mean().alias("global_reward"),
                (pl.col("local_reward") >= CORRECT_THRESHOLD).mean().alias("success"),
                pl.len().alias("calls"),
            )
            .sort(key)
        )
        for r in table.iter_rows(named=True):
            names = ("local_reward", "global_reward", "calls") + (("success",) if kind == "agent" else ())
            out.update(_finite({_name("rollout", kind, r[key], n): r[n] for n in names}))
    success = trajectory_success(steps.lazy()).group_by("strategy").agg(pl.col("global_reward").mean()).collect()
    for r in success.iter_rows(named=True):
        out.update(_finite({_name("rollout", "strategy", r["strategy"], "success"): r["global_reward"]}))
    return out


RATIO_KEYS = ("round", "policy_id", "agent_id", "strategy")


def ratio_scalars(ratio: pl.DataFrame) -> dict[str, float]:
    """`ratio/<policy_id>/<agent_id>/<strategy>/<column>` of every row and numeric column of a
    round's `ratio_diagnostics` table."""
    out: dict[str, float] = {}
    for r in ratio.iter_rows(named=True):
        out.update(_finite({_name("ratio", r["policy_id"], r["agent_id"], r["strategy"], c): v for c, v in r.items() if c not in RATIO_KEYS}))
    return out


def timing_scalars(timings: pl.DataFrame) -> dict[str, float]:
    """`time/<stage>`: seconds of each stage of a round (`timings` table)."""
    return _finite({_name("time", r["stage"]): r["seconds"] for r in timings.iter_rows(named=True)})


def training_scalars(records: Sequence[Any]) -> dict[str, float]:
    """`train/<policy_id>/<metric>` of a round's registry entries (`CheckpointRecord.metrics`)."""
    out: dict[str, float] = {}
    for rec in records:
        out.update(_finite({_name("train", rec.policy_id, k): v for k, v in rec.metrics.items()}))
    return out


def settings_values(record: Mapping[str, Any] | None) -> dict[str, str | int | float | bool]:
    """The experiment record's settings as flat scalars: `settings/<name>`, `effective/<name>`
    (the values the loss's preset filled in) and `engine`. Lists and nulls become JSON text."""
    if not record:
        return {}
    out: dict[str, str | int | float | bool] = {}
    for section in ("settings", "effective"):
        for name, value in sorted((record.get(section) or {}).items()):
            out[_name(section, name)] = value if isinstance(value, (str, int, float, bool)) else json.dumps(value)
    if "engine" in record:
        out["engine"] = str(record["engine"])
    return out


# -- reading a round's tables -----------------------------------------------------------------


def _table_metrics(store: Path) -> Sequence[tuple[str, str, str]] | None:
    """The round table's (agent_id, metric, column) triples of the store's workflow, the one its
    experiment record names (`table_metrics` of the workflow's class; the base `Workflow`'s for
    a factory function or a module that cannot be imported here); None (the round table's
    default) when no record names one."""
    from pipeline.rollout.workflow import Workflow
    from pipeline.workflows import _resolve

    name = ((read_experiment(store) or {}).get("settings") or {}).get("workflow")
    if not name:
        return None
    try:
        return getattr(_resolve(name), "table_metrics", Workflow.table_metrics)
    except MaxitError:  # a user's workflow module not importable here: the team's columns
        return Workflow.table_metrics


def collect_round(store: str | Path, round_: int, metrics: Sequence[tuple[str, str, str]] | None = None) -> RoundScalars:
    """Every number round `round_` of `store` logs, read from its tables (a table the round
    lacks adds nothing). `metrics`: the round table's (agent_id, metric, column) triples, by
    default the store's workflow's `table_metrics`."""
    store = Path(store)
    tables = st.Tables(store)
    values: dict[str, float] = {}
    values.update(evaluation_scalars(tables.read(round_, "evaluation")))
    summary = round_summary(store, [round_], metrics if metrics is not None else _table_metrics(store))
    values.update(summary_scalars(summary, round_, skip=tuple(STAGE_COLUMNS.values())))
    for table, scalars in (("steps", reward_scalars), ("ratio_diagnostics", ratio_scalars)):
        if tables.exists(round_, table):
            values.update(scalars(tables.read(round_, table)))
    values.update(timing_scalars(read_timings(tables, round_)))
    if round_ != BASE_ROUND:
        values.update(training_scalars([r for r in PolicyRegistry(store).records() if r.round == round_]))
    return RoundScalars(round=round_, values=values)
