"""Group-relative advantages over stored rollout rows, with Polars window expressions.

`compute_advantages(steps, config)` is a pure function from a frame of agent calls to the same
rows with `group_size, group_mean, group_std, advantage, sample_weight` added. It reads only the
columns it needs (`step_id`, `uid`, `strategy`, the `group_by` columns, `traj_uid` in
trajectory-mean mode, `reward` or `global_reward`/`local_reward`, and `active` if present), so it
runs on tables that other tools wrote as well as on maxit's `steps` table. Everything is lazy
`.over()` windows: no Python loop over rows or groups.

Semantics (docs/ALGORITHMS.md; AdvantageConfig documents each switch):
- group key = uid + strategy + group_by (DrMAS: agent_id; AT-GRPO: agent_id, turn; plain GRPO:
  nothing more): a group never spans strategies;
- reward = alpha * global_reward + local_weight * local_reward when both parts are present;
- members = active rows with a reward (DrMAS: an agent called k times counts k times), or, with
  `trajectory_mean`, one member per trajectory valued at the mean of its rows in the group;
  each row is then scored by its own reward (`trajectory_score="own"`) or by its trajectory's
  mean ("mean");
- A = (score - mean) / (std + eps) with ddof=1 ("std") or A = score - mean ("center");
- groups of one member: A = 0, or verl's mean 0 / std 1 (`singleton="raw"`);
  groups whose members all have the same value: A = 0 exactly;
- inactive rows and rows with a null reward: out of the statistics, A = 0, weight 0;
- NaN or infinite rewards, null keys and duplicated step_ids are errors naming the offending
  step_ids;
- sample_weight is the membership weight: 1.0 for rows in the statistics, 0.0 otherwise.
  Stratified strategy weights are applied by the training view, over the rows each policy
  actually trains on (`ViewConfig.strategy_weights`), which this stage cannot know;
- a `round` column, when present, is part of every group, so a table spanning several rounds
  gives the same numbers as each round on its own;
- baseline="role" (SPIRAL's RAE, `role_advantages`): no groups; a running mean of the reward per
  role (agent_id) over the rounds, A = reward - that mean, fed by the `earlier` rounds' rows.
"""

from __future__ import annotations

import polars as pl

from pipeline.config import AdvantageConfig
from pipeline.errors import ConfigError, DataError, SchemaError
from schemas import duplicates_problem

__all__ = ["compute_advantages", "advantage_metrics", "required_columns", "role_baselines", "ADVANTAGE_COLUMNS"]

ADVANTAGE_COLUMNS = ("group_size", "group_mean", "group_std", "advantage", "sample_weight")

_MAX_IDS = 10
_SEED_A, _SEED_B = 0x6D61786974, 0x5EED2


def required_columns(config: AdvantageConfig, schema: pl.Schema) -> list[str]:
    """The columns `compute_advantages` reads from a frame with `schema` under `config`."""
    cols = ["step_id", *config.group_key]
    if config.trajectory_mean:
        cols.append("traj_uid")
    if "global_reward" in schema or "local_reward" in schema:
        cols += [c for c in ("global_reward", "local_reward") if c in schema]
    else:
        cols.append("reward")
    if "active" in schema:
        cols.append("active")
    return cols


def _check_input(schema: pl.Schema, config: AdvantageConfig) -> None:
    problems: list[str] = []
    needed = required_columns(config, schema)
    for col in needed:
        if col not in schema:
            if col == "reward":
                problems.append("missing column 'reward' (or 'global_reward' and 'local_reward')")
            else:
                why = {
                    "traj_uid": " (needed by trajectory_mean=True)",
                    "strategy": " (always part of the group key; a table sampled under one strategy can add it as a constant)",
                }.get(col, "")
                problems.append(f"missing column {col!r}{why}")
            continue
        dtype = schema[col]
        if col in ("reward", "global_reward", "local_reward"):
            if not (dtype.is_numeric() or dtype == pl.Null):
                problems.append(f"column {col!r} has type {dtype}, expected a number (float64)")
        elif col == "active":
            if dtype != pl.Boolean:
                problems.append(f"column 'active' has type {dtype}, expected bool")
        elif col == "turn":
            if not dtype.is_integer():
                problems.append(f"column 'turn' has type {dtype}, expected an integer (int32)")
        elif dtype not in (pl.String, pl.Categorical) and not isinstance(dtype, pl.Enum):
            problems.append(f"column {col!r} has type {dtype}, expected string")
    if "global_reward" in schema and "local_reward" not in schema or "local_reward" in schema and "global_reward" not in schema:
        present = "global_reward" if "global_reward" in schema else "local_reward"
        absent = "local_reward" if present == "global_reward" else "global_reward"
        problems.append(f"column {present!r} is present but {absent!r} is missing; reward = alpha*global_reward + local_weight*local_reward needs both")
    if problems:
        raise SchemaError("steps (advantage input)", problems)


def _ids(df: pl.DataFrame, mask: pl.Series) -> str:
    ids = df.filter(mask)["step_id"]
    shown = ", ".join(repr(i) for i in ids.head(_MAX_IDS).to_list())
    more = f" and {ids.len() - _MAX_IDS} more" if ids.len() > _MAX_IDS else ""
    return f"{ids.len()} row(s): step_id {shown}{more}"


def _check_values(out: pl.DataFrame, config: AdvantageConfig) -> None:
    problems: list[str] = []
    # the parts too: a NaN global_reward beside a null local_reward gives a null (not NaN) reward
    for col in ("reward", "global_reward", "local_reward"):
        if col not in out.columns:
            continue
        values = out[col]
        if not values.is_finite().fill_null(True).all():
            problems.append(f"NaN or infinite {col} in {_ids(out, values.is_not_null() & ~values.is_finite())}")
    for col in config.group_key + (["traj_uid"] if config.trajectory_mean else []) + (["active"] if "active" in out.columns else []):
        if out[col].null_count():
            what = "" if col == "active" else " (part of the group key)"
            problems.append(f"null {col!r}{what} in {_ids(out, out[col].is_null())}")
    if problems:
        raise DataError("cannot compute advantages:\n  - " + "\n  - ".join(problems))


def compute_advantages(steps: pl.DataFrame | pl.LazyFrame, config: AdvantageConfig | None = None, *, earlier: pl.DataFrame | None = None) -> pl.DataFrame:
    """The input rows, in input order, with `reward` (recomputed from global/local when present)
    and `group_size, group_mean, group_std, advantage, sample_weight` added. `earlier`: the
    earlier rounds' rows (steps or advantages tables, with `round`), read by baseline="role" only."""
    config = config or AdvantageConfig()
    df = steps.collect() if isinstance(steps, pl.LazyFrame) else steps
    schema = df.schema
    _check_input(schema, config)
    if config.baseline == "role":
        return role_advantages(df, config, earlier)
    # a repeated row would count twice in its group's statistics (a table of several rounds
    # read through a round=* glob: step_ids are unique per round)
    duplicated = duplicates_problem(df, "step_id", within="round" if "round" in schema else None)
    if duplicated:
        raise DataError(f"cannot compute advantages: {duplicated}")
    # The plan reads only the columns it needs and yields only the new ones; the input's other
    # columns are joined back without a copy (materializing pass-through string columns in the
    # plan would cost more than the windows themselves).
    cols = list(dict.fromkeys(required_columns(config, schema) + (["round"] if "round" in schema else [])))
    new_cols = ["reward", *ADVANTAGE_COLUMNS, "_collision"]
    sub = df.lazy().select(cols)
    new = _plan(sub, sub.collect_schema(), config, exact=False).select(new_cols).collect()
    if new["_collision"].any():
        # Two different group keys share a 64-bit hash (about 1e-8 odds at a million groups):
        # recompute with windows over the key columns themselves.
        new = _plan(sub, sub.collect_schema(), config, exact=True).select(new_cols).collect()
    out = df.drop([c for c in new_cols if c in schema]).hstack(new)
    _check_values(out, config)
    keep = [c for c in schema.names() if c not in ADVANTAGE_COLUMNS]
    if "reward" not in keep:
        keep.append("reward")
    return out.select(*keep, *ADVANTAGE_COLUMNS)


def _plan(lf: pl.LazyFrame, schema: pl.Schema, config: AdvantageConfig, exact: bool) -> pl.LazyFrame:
    """The lazy plan. Windows run over one UInt64 hash of the group key (much faster than over
    several string columns); a second, independently seeded hash must be constant inside every
    window, and `_collision` flags the rows where it is not (then `exact=True` re-plans over the
    key columns)."""
    # A table holding several rounds (e.g. read through a round=* glob) never mixes them.
    per_round = ["round"] if "round" in schema and "round" not in config.group_key else []
    keys = config.group_key + per_round
    lf, g, t = _with_reward_and_keys(lf, schema, config, exact, keys)
    lf, stat = _with_member_values(lf, config, exact, t)
    lf = lf.with_columns(_group_windows(stat, g, config, exact))
    return _with_advantages(lf, config)


def _with_reward_and_keys(lf: pl.LazyFrame, schema: pl.Schema, config: AdvantageConfig, exact: bool, keys: list[str]):
    """`lf` with `reward` (alpha * global + local_weight * local when the parts are there),
    `_member` (active rows with a finite reward) and, unless `exact`, the group key's two hashes
    (and the trajectory key's); with the window keys of the groups and of the trajectories."""
    tkeys = [*keys, "traj_uid"]
    if "global_reward" in schema:
        reward = float(config.alpha) * pl.col("global_reward").cast(pl.Float64) + float(config.local_weight) * pl.col(
            "local_reward"
        ).cast(pl.Float64)
    else:
        reward = pl.col("reward").cast(pl.Float64)
    active = pl.col("active") if "active" in schema else pl.lit(True)
    member = (active & reward.is_not_null() & reward.is_finite()).fill_null(False)
    prep = [reward.alias("reward"), member.alias("_member")]
    if exact:
        g, t = keys, tkeys
    else:
        g, t = "_g", "_t"
        prep += [pl.struct(keys).hash(_SEED_A).alias("_g"), pl.struct(keys).hash(_SEED_B).alias("_g2")]
        if config.trajectory_mean:
            prep += [pl.struct(tkeys).hash(_SEED_A).alias("_t"), pl.struct(tkeys).hash(_SEED_B).alias("_t2")]
    return lf.with_columns(prep), g, t


def _with_member_values(lf: pl.LazyFrame, config: AdvantageConfig, exact: bool, t):
    """`lf` with `_val` (what a row's advantage is computed from: its own reward, or with
    trajectory_score="mean" its trajectory's mean), and the member values the group statistics
    run over (`stat`): each active row (DrMAS), or each trajectory's mean, held by one row of it."""
    own = pl.when("_member").then(pl.col("reward"))
    if not config.trajectory_mean:
        return lf.with_columns(own.alias("_val")), pl.col("_val")
    row = pl.int_range(pl.len(), dtype=pl.UInt32)
    lf = lf.with_columns(row.alias("_row"))
    traj_mean = pl.when("_member").then(own.mean().over(t))
    first_row = pl.when("_member").then(pl.col("_row")).min().over(t)
    traj = [(pl.col("_member") & (pl.col("_row") == first_row)).alias("_rep")]
    if config.trajectory_score == "mean":
        traj.append(traj_mean.alias("_val"))
        stat = pl.when("_rep").then(pl.col("_val"))
    else:
        traj += [traj_mean.alias("_tmean"), own.alias("_val")]
        stat = pl.when("_rep").then(pl.col("_tmean"))
    if not exact:
        traj.append((pl.col("_t2").min().over(t) != pl.col("_t2").max().over(t)).alias("_tcollision"))
    return lf.with_columns(traj), stat


def _group_windows(stat: pl.Expr, g, config: AdvantageConfig, exact: bool) -> list[pl.Expr]:
    """Group statistics: null-skipping aggregations over the member values, one window key
    (`_n`, `_mean`, `_std`, `_flat`), and `_collision` (see `_plan`)."""
    windows = [
        stat.count().over(g).cast(pl.Int32).alias("_n"),
        stat.mean().over(g).alias("_mean"),
        stat.std(ddof=1).over(g).alias("_std"),
        (stat.max().over(g) == stat.min().over(g)).alias("_flat"),
    ]
    if exact:
        windows.append(pl.lit(False).alias("_collision"))
    else:
        collision = pl.col("_g2").min().over(g) != pl.col("_g2").max().over(g)
        if config.trajectory_mean:
            collision = collision | pl.col("_tcollision")
        windows.append(collision.alias("_collision"))
    return windows


def _with_advantages(lf: pl.LazyFrame, config: AdvantageConfig) -> pl.LazyFrame:
    """`lf` with the advantage columns from the group statistics: a singleton group under
    `singleton`, a flat group 0, non-members 0 with weight 0, else (value - mean) / (std + eps)."""
    n, val, mean, std = pl.col("_n"), pl.col("_val"), pl.col("_mean"), pl.col("_std")
    raw_singleton = config.singleton == "raw"
    group_mean = pl.when(n == 0).then(None).when((n == 1) & raw_singleton).then(0.0).otherwise(mean)
    group_std = (
        pl.when(n == 0).then(None)
        .when(n == 1).then(pl.lit(1.0) if raw_singleton else pl.lit(None, dtype=pl.Float64))
        .when(pl.col("_flat")).then(0.0)
        .otherwise(std)
    )
    centered = val - pl.col("group_mean")
    scaled = centered / (pl.col("group_std") + float(config.eps)) if config.normalize == "std" else centered
    advantage = (
        pl.when(~pl.col("_member")).then(0.0)
        .when(n == 1).then(scaled if raw_singleton else pl.lit(0.0))
        .when(pl.col("_flat")).then(0.0)
        .otherwise(scaled)
    )
    # Membership weight; stratified strategy weights are the training view's (see module doc).
    weight = pl.when("_member").then(1.0).otherwise(0.0)

    lf = lf.with_columns(group_mean.alias("group_mean"), group_std.alias("group_std"))
    return lf.with_columns(
        n.alias("group_size"),
        advantage.alias("advantage"),
        weight.cast(pl.Float64).alias("sample_weight"),
    )


def advantage_metrics(advantages: pl.DataFrame | pl.LazyFrame, config: AdvantageConfig | None = None) -> pl.DataFrame:
    """Per (round, agent_id, strategy) (round when the table has it): row counts (active, members, inactive, null reward), reward mean
    over members, and over its groups (the advantage groups, split by agent and strategy): the
    number of groups, the fractions of singleton groups, zero-std groups, and all-good / all-bad /
    mixed groups (success = global_reward > 0 when that column exists, else reward > 0)."""
    config = config or AdvantageConfig()
    lf = advantages.lazy()
    schema = lf.collect_schema()
    # a table spanning several rounds: groups never mix rounds (as in compute_advantages)
    by = [c for c in ("round", "agent_id", "strategy") if c in schema]
    sub = list(dict.fromkeys([*config.group_key, *by]))
    if "active" not in schema:
        lf = lf.with_columns(pl.lit(True).alias("active"))
    active = pl.col("active")
    member = active & pl.col("reward").is_not_null()
    success = (pl.col("global_reward") if "global_reward" in schema else pl.col("reward")) > 0
    lf = lf.with_columns(member.alias("_member"), success.alias("_success"))
    rows = lf.group_by(by).agg(
        pl.len().alias("rows"),
        active.sum().alias("active"),
        pl.col("_member").sum().alias("members"),
        (~active).sum().alias("inactive"),
        (active & pl.col("reward").is_null()).sum().alias("null_reward"),
        pl.col("reward").filter("_member").mean().alias("reward_mean"),
        pl.col("advantage").filter("_member").abs().mean().alias("abs_advantage_mean"),
    )
    groups = (
        lf.filter("_member")
        .group_by(sub)
        .agg(
            pl.len().alias("n"),
            (pl.col("reward").max() == pl.col("reward").min()).alias("flat"),
            pl.col("_success").all().alias("all_good"),
            (~pl.col("_success")).all().alias("all_bad"),
        )
        .group_by(by)
        .agg(
            pl.len().alias("groups"),
            (pl.col("n") == 1).mean().alias("singleton_frac"),
            ((pl.col("n") > 1) & pl.col("flat")).mean().alias("zero_std_frac"),
            pl.col("all_good").mean().alias("all_good_frac"),
            pl.col("all_bad").mean().alias("all_bad_frac"),
            (~pl.col("all_good") & ~pl.col("all_bad")).mean().alias("mixed_frac"),
        )
    )
    return rows.join(groups, on=by, how="left").sort(by).collect()


# -- role-conditioned baselines (SPIRAL's RAE) ----------------------------------------------------


def _role_rewards(df: pl.DataFrame, config: AdvantageConfig) -> pl.LazyFrame:
    """(round, agent_id, reward, _member) of `df`'s rows: the mixed reward as `_with_reward_and_keys`
    computes it, members = active rows with a finite reward."""
    lf, _, _ = _with_reward_and_keys(df.lazy(), df.schema, config, True, [])
    return lf.select("round", "agent_id", "reward", "_member")


def role_baselines(rows: pl.DataFrame, config: AdvantageConfig) -> pl.DataFrame:
    """(round, agent_id, baseline, members) for every round and role of `rows` (which have
    `round`): b starts at 0 and after each round becomes role_decay * b + (1 - role_decay) * (the
    mean reward of the role's member rows in that round); a round where the role has no member
    leaves b as it was. `baseline` is b after the row's own round."""
    _check_input(rows.schema, config)
    if "round" not in rows.columns or "agent_id" not in rows.columns:
        raise DataError("role baselines need the columns 'round' and 'agent_id'")
    per_round = (
        _role_rewards(rows, config)
        .group_by("round", "agent_id")
        .agg(pl.col("reward").filter("_member").mean().alias("mean"), pl.col("_member").sum().cast(pl.Int32).alias("members"))
        .sort("agent_id", "round")
        .collect()
    )
    d = float(config.role_decay)
    # one value per (round, role): a handful of rows, so the recursion is a plain loop
    out, b, last = [], 0.0, None
    for r, agent, mean, members in per_round.iter_rows():
        if agent != last:
            b, last = 0.0, agent
        if members:
            b = d * b + (1 - d) * mean
        out.append((r, agent, b, members))
    return pl.DataFrame(out, schema={"round": per_round.schema["round"], "agent_id": pl.String, "baseline": pl.Float64, "members": pl.Int32}, orient="row")


def role_advantages(df: pl.DataFrame, config: AdvantageConfig, earlier: pl.DataFrame | None) -> pl.DataFrame:
    """`df`'s rows with A = reward - the role's running mean after their round (`role_baselines`
    over `earlier` and `df` together); non-members A = 0, weight 0. A table of a round after the
    first needs `earlier` (the running mean would silently restart at 0 otherwise)."""
    if "round" not in df.columns:
        first = 0 if earlier is None or not earlier.height else int(earlier["round"].max()) + 1
        df = df.with_columns(pl.lit(first, dtype=pl.Int32).alias("round"))
        added = True
    else:
        added = False
    if earlier is None and df.height and int(df["round"].min()) > 0:
        raise ConfigError(f"baseline='role' on round {int(df['round'].min())}: pass the earlier rounds' rows (earlier=), or the running mean restarts at 0")
    cols = [c for c in required_columns(config, df.schema) if c in df.columns] + ["round", "agent_id"]
    history = df.select(list(dict.fromkeys(cols)))
    if earlier is not None and earlier.height:
        old = earlier.select([c for c in history.columns if c in earlier.columns])
        history = pl.concat([old.filter(pl.col("round") < df["round"].min()), history], how="diagonal_relaxed")
    base = role_baselines(history, config).select("round", "agent_id", pl.col("baseline").alias("group_mean"), pl.col("members").alias("group_size"))
    scored = _role_rewards(df, config).collect().select("reward", "_member")
    out = df.drop([c for c in ("reward", *ADVANTAGE_COLUMNS) if c in df.columns]).hstack(scored)
    out = out.join(base.with_columns(pl.col("round").cast(out.schema["round"])), on=["round", "agent_id"], how="left", maintain_order="left")
    _check_values(out, config)
    out = out.with_columns(
        pl.when("_member").then(pl.col("reward") - pl.col("group_mean")).otherwise(0.0).alias("advantage"),
        pl.lit(None, dtype=pl.Float64).alias("group_std"),
        pl.when("_member").then(1.0).otherwise(0.0).alias("sample_weight"),
    )
    keep = [c for c in df.columns if c not in ADVANTAGE_COLUMNS and c != "reward" and not (added and c == "round")]
    return out.select(*keep, "reward", *ADVANTAGE_COLUMNS)
