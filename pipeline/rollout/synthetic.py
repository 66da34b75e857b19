"""Synthetic rollout tables for demos, tests and benchmarks (no model involved).

`synthetic_steps(n_problems, samples, ...)` lays out what a round of the Solver/Verifier
orchestra under several strategies produces, with rewards drawn per problem difficulty, as
the columns the advantage engine reads (and, with `full=True`, every column of `steps`).
Vectorized with NumPy, for the benchmarks' tables of millions of rows.
"""

from __future__ import annotations

import numpy as np
import polars as pl

__all__ = ["synthetic_steps"]


def synthetic_steps(
    n_problems: int = 1000,
    samples: int = 4,
    agents: tuple[str, ...] = ("solver", "verifier"),
    turns: int = 3,
    strategies: tuple[str, ...] = ("iid", "prompt_aug", "feedback"),
    seed: int = 0,
    inactive_frac: float = 0.1,
    null_frac: float = 0.01,
    full: bool = False,
    layout: str = "grid",
) -> pl.DataFrame:
    """n_problems x strategies x samples trajectories, each with len(agents) x turns calls.

    Rewards: global_reward ~ Bernoulli(p_problem) shared by a trajectory, local_reward per call
    ~ Bernoulli(0.5) * 0.5 for the second agent onwards, 0 for the first. A fraction of calls is
    inactive (approved earlier) and a fraction has a null reward (a failed reward function).

    layout="grid": every problem under every strategy, every trajectory `turns` loops long.
    layout="loops": each problem under one strategy (interleaved), each trajectory 1..`turns`
    loops long (80% stop after the first, as approved samples do), so a table of N rows holds
    about N/10 problems with 4 samples and 2 agents (the benchmark's 1M+ uids at 10M rows)."""
    if layout == "loops":
        return _loops_layout(n_problems, samples, agents, turns, strategies, seed, inactive_frac, null_frac)
    if layout != "grid":
        raise ValueError(f"layout must be 'grid' or 'loops', got {layout!r}")
    rng = np.random.default_rng(seed)
    n_agents, n_strat = len(agents), len(strategies)
    per_traj = n_agents * turns
    n_traj = n_problems * n_strat * samples
    n = n_traj * per_traj
    traj = np.repeat(np.arange(n_traj, dtype=np.int64), per_traj)
    problem = traj // (n_strat * samples)
    strat = (traj // samples) % n_strat
    sample = traj % samples
    within = np.tile(np.arange(per_traj, dtype=np.int64), n_traj)
    turn = within // n_agents
    agent = within % n_agents
    p = rng.beta(1.0, 1.5, size=n_problems)
    success = (rng.random(n_traj) < p[problem[::per_traj]]).astype(np.float64)
    global_reward = np.repeat(success, per_traj)
    local_reward = np.where(agent > 0, 0.5 * (rng.random(n) < 0.5), 0.0)
    active = rng.random(n) >= inactive_frac
    null = rng.random(n) < null_frac
    uid = pl.Series("uid", problem).cast(pl.String)
    df = pl.DataFrame(
        {
            "step_id": pl.Series(np.arange(n, dtype=np.int64)).cast(pl.String),
            "uid": "p" + uid,
            "traj_uid": "t" + pl.Series(traj).cast(pl.String),
            "sample_idx": sample.astype(np.int32),
            "agent_id": pl.Series(agent).replace_strict(dict(enumerate(agents)), return_dtype=pl.String),
            "turn": turn.astype(np.int32),
            "strategy": pl.Series(strat).replace_strict(dict(enumerate(strategies)), return_dtype=pl.String),
            "active": active,
            "global_reward": pl.Series(np.where(null, np.nan, global_reward)).fill_nan(None),
            "local_reward": local_reward,
        }
    )
    if full:
        df = _fill_steps_columns(df, rng, agents)
    return df


def _fill_steps_columns(df: pl.DataFrame, rng: np.random.Generator, agents: tuple[str, ...]) -> pl.DataFrame:
    """Add the remaining `steps` columns with short fake token lists (for schema-shaped demos)."""
    n = df.height
    lens = rng.integers(1, 5, size=n)
    ids = [list(map(int, rng.integers(3, 300, size=k))) for k in lens]
    lps = [list(map(float, -rng.random(k))) for k in lens]
    return df.with_columns(
        pl.lit(0, dtype=pl.Int32).alias("round"),
        pl.col("agent_id").alias("policy_id").replace_strict({a: "shared" for a in df["agent_id"].unique()}, return_dtype=pl.String),
        pl.col("turn").alias("step"),
        ("n" + pl.col("step_id")).alias("node_id"),
        pl.lit(None, dtype=pl.String).alias("parent_node_id"),
        pl.lit(True).alias("selected"),
        pl.concat_list(pl.struct(pl.lit("user").alias("role"), pl.col("uid").alias("content"))).alias("sampling_messages"),
        pl.col("uid").alias("prompt_hash"),
        pl.concat_list(pl.lit(1, dtype=pl.Int32), pl.lit(2, dtype=pl.Int32)).alias("prompt_ids"),
        pl.Series("completion_ids", ids, dtype=pl.List(pl.Int32)),
        pl.Series("completion_logprobs", lps, dtype=pl.List(pl.Float32)),
        pl.lit("").alias("completion_text"),
        pl.lit("stop").alias("finish_reason"),
        (pl.col("global_reward") + pl.col("local_reward")).alias("reward"),
        pl.lit(None, dtype=pl.String).alias("reward_error"),
        # the last agent gives verdicts (the math Verifier): its verdict agrees with the judged
        # answer when its local reward is 1
        pl.when(pl.col("agent_id") == agents[-1]).then((pl.col("local_reward") >= 0.5) == (pl.col("global_reward") >= 0.5)).alias("verdict"),
        pl.lit("synthetic").alias("model_version"),
        pl.lit(-1, dtype=pl.Int32).alias("policy_round"),
        pl.lit(0, dtype=pl.Int32).alias("staleness"),
        pl.lit("synthetic").alias("engine"),
        pl.lit(0, dtype=pl.Int64).alias("seed"),
        pl.lit(1.0, dtype=pl.Float64).alias("temperature"),
    )


def _loops_layout(n_problems, samples, agents, turns, strategies, seed, inactive_frac, null_frac) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    n_agents = len(agents)
    n_traj = n_problems * samples
    probs = np.array([0.8] + [0.2 / max(turns - 1, 1)] * (turns - 1))[:turns]
    loops = rng.choice(np.arange(1, turns + 1), size=n_traj, p=probs / probs.sum())
    per_traj = loops * n_agents
    traj = np.repeat(np.arange(n_traj, dtype=np.int64), per_traj)
    n = traj.size
    starts = np.repeat(np.cumsum(per_traj) - per_traj, per_traj)
    within = np.arange(n, dtype=np.int64) - starts
    problem = traj // samples
    p = rng.beta(1.0, 1.5, size=n_problems)
    success = (rng.random(n_traj) < p[np.arange(n_traj) // samples]).astype(np.float64)
    agent = within % n_agents
    null = rng.random(n) < null_frac
    return pl.DataFrame(
        {
            "step_id": pl.Series(np.arange(n, dtype=np.int64)).cast(pl.String),
            "uid": "p" + pl.Series(problem).cast(pl.String),
            "traj_uid": "t" + pl.Series(traj).cast(pl.String),
            "sample_idx": (traj % samples).astype(np.int32),
            "agent_id": pl.Series(agent).replace_strict(dict(enumerate(agents)), return_dtype=pl.String),
            "turn": (within // n_agents).astype(np.int32),
            "strategy": pl.Series(problem % len(strategies)).replace_strict(dict(enumerate(strategies)), return_dtype=pl.String),
            "active": rng.random(n) >= inactive_frac,
            "global_reward": pl.Series(np.where(null, np.nan, success[traj])).fill_nan(None),
            "local_reward": np.where(agent > 0, 0.5 * (rng.random(n) < 0.5), 0.0),
        }
    )
