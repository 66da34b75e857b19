"""Asset checks: the data contract between stages. Blocking checks stop the round before bad
data flows on (a failed blocking check with ERROR severity skips the downstream assets)."""


import json
import math

import dagster as dg
import polars as pl

from assets.advantages import advantages
from assets.config import RunSettings
from assets.partitions import round_of
from assets.policy import policy
from assets.problems import problems
from assets.resources import StoreResource
from assets.rollouts import rollouts
from pipeline.store import checkpoint_dir, read_table, table_path
from schemas import STEPS, SchemaError, validate

ERROR = dg.AssetCheckSeverity.ERROR
WARN = dg.AssetCheckSeverity.WARN

MIN_ESS_FRACTION = 0.05
"""Below this effective-sample-size fraction a strategy's update rests on a handful of rows."""
MAX_MASKED_FRACTION = 0.8
"""Above this, most of a strategy's rows were masked out by the sequence-ratio cap."""


def _load(store: StoreResource, context, table: str) -> pl.DataFrame:
    return read_table(table_path(store.root(), round_of(context), table))


@dg.asset_check(asset=problems, blocking=True, description="training problems never come from the held-out split")
def problems_disjoint_from_heldout(context: dg.AssetCheckExecutionContext, settings: RunSettings, store: StoreResource) -> dg.AssetCheckResult:
    df = _load(store, context, "problems")
    run = settings.run_config()
    ctx_task = settings.context(store, _NoEngine()).task()
    heldout = {p.uid for p in ctx_task.problems("heldout", run.evaluation.problems, run.evaluation.seed)}
    overlap = sorted(set(df["uid"].to_list()) & heldout)
    not_train = df.filter(pl.col("split") != "train")["uid"].to_list()
    return dg.AssetCheckResult(
        passed=not overlap and not not_train,
        severity=ERROR,
        metadata={"overlap": len(overlap), "overlap_uids": str(overlap[:10]), "not_train": len(not_train)},
    )


@dg.asset_check(asset=rollouts, blocking=True, description="the steps table matches its schema")
def steps_schema(context: dg.AssetCheckExecutionContext, store: StoreResource) -> dg.AssetCheckResult:
    df = _load(store, context, "steps")
    try:
        validate(df, STEPS)
        problems_found: list[str] = []
    except SchemaError as err:
        problems_found = err.problems
    return dg.AssetCheckResult(passed=not problems_found, severity=ERROR, metadata={"problems": "\n".join(problems_found) or "none", "rows": df.height})


@dg.asset_check(asset=rollouts, blocking=True, description="tree siblings (one node's N candidates) share one prompt_hash")
def tree_groups_share_context(context: dg.AssetCheckExecutionContext, store: StoreResource) -> dg.AssetCheckResult:
    df = _load(store, context, "steps").filter(pl.col("strategy") == "tree")
    if df.height == 0:
        return dg.AssetCheckResult(passed=True, metadata={"tree_groups": 0})
    groups = df.group_by("uid", "agent_id", "turn").agg(
        pl.col("prompt_hash").n_unique().alias("contexts"),
        pl.col("selected").sum().alias("selected"),
        pl.col("parent_node_id").n_unique().alias("parents"),
    )
    bad = groups.filter((pl.col("contexts") != 1) | (pl.col("selected") != 1) | (pl.col("parents") != 1))
    return dg.AssetCheckResult(
        passed=bad.height == 0,
        severity=ERROR,
        metadata={"tree_groups": groups.height, "bad_groups": bad.height, "examples": str(bad.head(5).to_dicts())},
    )


@dg.asset_check(asset=advantages, blocking=True, description="no NaN/inf; member advantages are centred in every group")
def advantages_sane(context: dg.AssetCheckExecutionContext, settings: RunSettings, store: StoreResource) -> dg.AssetCheckResult:
    df = _load(store, context, "advantages")
    cfg = settings.run_config().advantage
    nonfinite = df.filter(~pl.col("advantage").is_finite() | ~pl.col("sample_weight").is_finite() | (pl.col("reward").is_not_null() & ~pl.col("reward").is_finite()))
    members = df.filter(pl.col("active") & pl.col("reward").is_not_null())
    key = [*cfg.group_key, "round"]
    if cfg.trajectory_mean:
        # a trajectory is one member: its rows' mean advantage (equal to each row's with the "mean" score)
        members = members.group_by(*key, "traj_uid").agg(pl.col("advantage").mean())
    centred = members.group_by(key).agg(pl.col("advantage").mean().abs().alias("off"), pl.len().alias("n"))
    worst = float(centred["off"].max() or 0.0)
    off = centred.filter(pl.col("off") > 1e-6)
    return dg.AssetCheckResult(
        passed=nonfinite.height == 0 and off.height == 0,
        severity=ERROR,
        metadata={
            "nonfinite_rows": nonfinite.height,
            "nonfinite_step_ids": str(nonfinite["step_id"].head(10).to_list()),
            "groups": centred.height,
            "uncentred_groups": off.height,
            "max_abs_group_mean": worst,
        },
    )


@dg.asset_check(asset=policy, blocking=False, description="importance-ratio diagnostics within bounds (effective sample size, masked fraction)")
def ratio_diagnostics(context: dg.AssetCheckExecutionContext, settings: RunSettings, store: StoreResource) -> dg.AssetCheckResult:
    r = round_of(context)
    problems_found = []
    meta: dict = {}
    for pid in settings.run_config().policy_ids:
        meta_path = checkpoint_dir(store.root(), r, pid) / "maxit_checkpoint.json"
        metrics = json.loads(meta_path.read_text()).get("metrics", {})
        loss = metrics.get("mean_loss")
        if loss is not None and not math.isfinite(loss):
            problems_found.append(f"{pid}: mean loss is {loss}")
        for name, value in metrics.items():
            if not name.startswith("strategy/"):
                continue
            meta[f"{pid}/{name}"] = value
            if name.endswith("/ess_fraction") and value < MIN_ESS_FRACTION and metrics.get(name.replace("ess_fraction", "rows"), 0) > 0:
                problems_found.append(f"{pid}: {name} = {value:.3f} < {MIN_ESS_FRACTION}")
            if name.endswith("/masked_fraction") and value > MAX_MASKED_FRACTION:
                problems_found.append(f"{pid}: {name} = {value:.3f} > {MAX_MASKED_FRACTION}")
    return dg.AssetCheckResult(passed=not problems_found, severity=WARN, metadata={"problems": "\n".join(problems_found) or "none", **meta})


class _NoEngine:
    """Stands in for the engine resource where a check needs the task but never samples."""

    def pool(self):
        return None


all_checks = [problems_disjoint_from_heldout, steps_schema, tree_groups_share_context, advantages_sane, ratio_diagnostics]
