"""Asset checks: the data contract between stages. Blocking checks stop the round before bad
data flows on (a failed blocking check with ERROR severity skips the downstream assets)."""

import dagster as dg
import polars as pl

from assets.advantages import advantages
from assets.config import RunSettings
from assets.metadata import md_table
from assets.partitions import round_of
from assets.policy import policy
from assets.problems import problems
from assets.resources import StoreResource
from assets.rollouts import rollouts
from schemas import STEPS, SchemaError, validate

ERROR = dg.AssetCheckSeverity.ERROR
WARN = dg.AssetCheckSeverity.WARN

MIN_ESS_FRACTION = 0.1
"""Below this effective-sample-size fraction (ESS / rows, ESS = (sum r)^2 / sum r^2 of the
sequence likelihood ratios r = p_train/q over the round's update), a cell's update rests on a
tenth of its rows or fewer: the few rows with large ratios carry it, and the estimate is noisy.
Non-blocking: it warns, the round goes on."""
MAX_MASKED_FRACTION = 0.8
"""Above this, most of a strategy's rows were masked out by the sequence-ratio cap."""


def _load(store: StoreResource, context, table: str) -> pl.DataFrame:
    tables = store.tables()
    tables.pull()  # a URL store: a check may run in a process (or on a machine) of its own
    return tables.read(round_of(context), table)


@dg.asset_check(asset=problems, blocking=True, description="training problems never come from the held-out split")
def problems_disjoint_from_heldout(context: dg.AssetCheckExecutionContext, settings: RunSettings, store: StoreResource) -> dg.AssetCheckResult:
    df = _load(store, context, "problems")
    ctx = settings.context(store, round_of(context))  # the round's workflow: no engine, a check never samples
    run, workflow = ctx.config, ctx.workflow()
    heldout = {p.uid for p in workflow.problems("heldout", run.evaluation.problems, run.evaluation.seed)}
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


def advantage_baselines(df: pl.DataFrame, cfg) -> tuple[int, int, float]:
    """(groups, groups off, worst) of an `advantages` table under `cfg` (an AdvantageConfig).
    A group or batch baseline centres each group's member advantages: off = |mean| > 1e-6, worst
    the largest |mean|. The role baseline (SPIRAL's RAE) subtracts one running mean per role and
    round, which a round's rows need not average to: there the groups are (round, role) and off
    means its members were scored against more than one baseline (reward - advantage differs by
    more than 1e-6; worst the largest spread)."""
    members = df.filter(pl.col("active") & pl.col("reward").is_not_null())
    if cfg.baseline == "role":
        spread = (pl.col("reward") - pl.col("advantage"))
        groups = members.group_by("round", "agent_id").agg((spread.max() - spread.min()).alias("off"))
    else:
        key = [*cfg.group_key, "round"]
        if cfg.trajectory_mean:
            # a trajectory is one member: its rows' mean advantage (equal to each row's with the "mean" score)
            members = members.group_by(*key, "traj_uid").agg(pl.col("advantage").mean())
        groups = members.group_by(key).agg(pl.col("advantage").mean().abs().alias("off"))
    return groups.height, groups.filter(pl.col("off") > 1e-6).height, float(groups["off"].max() or 0.0)


@dg.asset_check(asset=advantages, blocking=True, description="no NaN/inf; member advantages are centred in every group (one baseline per role and round under the role baseline)")
def advantages_sane(context: dg.AssetCheckExecutionContext, settings: RunSettings, store: StoreResource) -> dg.AssetCheckResult:
    df = _load(store, context, "advantages")
    cfg = settings.run_config().advantage
    nonfinite = df.filter(~pl.col("advantage").is_finite() | ~pl.col("sample_weight").is_finite() | (pl.col("reward").is_not_null() & ~pl.col("reward").is_finite()))
    groups, off, worst = advantage_baselines(df, cfg)
    return dg.AssetCheckResult(
        passed=nonfinite.height == 0 and off == 0,
        severity=ERROR,
        metadata={
            "nonfinite_rows": nonfinite.height,
            "nonfinite_step_ids": str(nonfinite["step_id"].head(10).to_list()),
            "groups": groups,
            # under the role baseline: (round, role) groups scored against more than one baseline, and the largest spread
            "uncentred_groups" if cfg.baseline != "role" else "roles_with_two_baselines": off,
            "max_abs_group_mean" if cfg.baseline != "role" else "max_baseline_spread": worst,
        },
    )


@dg.asset_check(asset=policy, blocking=False, description="importance-ratio diagnostics within bounds per agent and strategy (effective sample size, masked fraction)")
def ratio_diagnostics(context: dg.AssetCheckExecutionContext, settings: RunSettings, store: StoreResource) -> dg.AssetCheckResult:
    diag = _load(store, context, "ratio_diagnostics")
    loss = settings.run_config().train.loss
    importance_weighted = loss.kind != "rs"
    # rows trained by their NLL (the Verifier's replay) use no ratio: not judged
    judged = (pl.col("strategy") != "*") & (pl.col("rows") > 0) & ~pl.col("strategy").is_in(list(loss.sft_strategies))
    cells = diag.filter((pl.col("agent_id") != "*") & judged)
    if cells.is_empty():  # diagnostics without the per-cell rows: judge per strategy
        cells = diag.filter((pl.col("agent_id") == "*") & judged)
    problems_found = []
    if importance_weighted:
        for row in cells.iter_rows(named=True):
            cell = f"{row['policy_id']}/{row['agent_id']}/{row['strategy']}"
            if row["ess_fraction"] < MIN_ESS_FRACTION:
                problems_found.append(f"{cell}: ESS fraction {row['ess_fraction']:.3f} < {MIN_ESS_FRACTION}")
            if row["masked_fraction"] > MAX_MASKED_FRACTION:
                problems_found.append(f"{cell}: masked fraction {row['masked_fraction']:.3f} > {MAX_MASKED_FRACTION}")
    return dg.AssetCheckResult(
        passed=not problems_found,
        severity=WARN,
        metadata={
            "problems": "\n".join(problems_found) or "none",
            "judged": "per agent and strategy" if importance_weighted else "not judged: the rs loss uses no importance ratio",
            "diagnostics": md_table(diag),
        },
    )


all_checks = [problems_disjoint_from_heldout, steps_schema, tree_groups_share_context, advantages_sane, ratio_diagnostics]
