"""Held-out evaluation of a team: the `evaluation` table (one row per metric).

Every round is evaluated on the same held-out problems (a fixed seed), at the sampling
temperature, without hints, so rounds are comparable. A workflow decides its metrics
(`Workflow.evaluate`); the default, `evaluate_workflow`, plays the team on the held-out problems
exactly as the rollouts do and reports team success (sampled and greedy), the mean team reward,
success by the turn the episode ended at, and each agent's mean local reward and calls per
episode. The math workflows report the Solver's and the Verifier's own metrics
(`pipeline.workflows.math.evaluate_team`).
"""

from __future__ import annotations

from typing import Mapping

import polars as pl

from pipeline.config import EvalConfig
from pipeline.types import Sampler
from schemas import EVALUATION, polars_schema, validate

__all__ = ["EvalConfig", "evaluate_workflow"]


def evaluate_workflow(workflow, samplers: Mapping[str, Sampler], tokenizers: Mapping[str, object], config: EvalConfig, round_: int) -> pl.DataFrame:
    """The `evaluation` rows of any workflow: its team plays the held-out problems (the same ones
    every round) as in the rollouts (`run_rollouts`, the `iid` strategy, no hint), `samples`
    episodes per problem at the sampling temperature and, with `greedy`, one greedy episode.

    Metrics: team `success` (fraction of episodes whose team reward is right, the one
    correctness rule `is_correct`), `success_greedy`, `team_reward` (its mean); per agent
    `reward` (mean local reward of its calls), `calls` (mean calls per episode); per turn
    `success_turn{t}` (fraction of episodes that ended right by turn t), and whatever
    `workflow.metrics(steps)` adds ((agent_id, metric, value, n) rows)."""
    from pipeline.rollout.loop import run_rollouts
    from pipeline.rollout.sampling import RolloutConfig
    from pipeline.strategies import IID

    problems = workflow.problems("heldout", config.problems, config.seed)
    first = workflow.turn_order[0]
    budget = config.max_tokens or workflow.max_tokens(first, "eval") or RolloutConfig.max_tokens
    by_agent = {} if config.max_tokens else {a: b for a in workflow.turn_order if (b := workflow.max_tokens(a, "eval"))}
    rows: list[dict] = []
    policy_of = {a.agent_id: a.policy_id for a in workflow.agents}

    def add(agent_id: str, metric: str, value: float, n: int) -> None:
        rows.append({"round": round_, "policy_id": policy_of.get(agent_id, "*"), "agent_id": agent_id, "split": "heldout", "metric": metric, "value": float(value), "n": int(n)})

    def play(n: int, temperature: float, seed: int) -> pl.DataFrame:
        cfg = RolloutConfig(round=0, temperature=temperature, max_tokens=budget, max_tokens_by_agent=by_agent, seed=seed, reward_timeout=config.reward_timeout)
        tok = next(iter(tokenizers.values())) if len(set(map(id, tokenizers.values()))) == 1 else None
        if tok is None:  # one tokenizer per policy: the samplers carry theirs
            return pl.from_arrow(run_rollouts(problems, workflow, [IID(group_size=n)], samplers, cfg))
        return pl.from_arrow(run_rollouts(problems, workflow, [IID(group_size=n)], samplers, cfg, tokenizer=tok))

    def team(steps: pl.DataFrame) -> pl.DataFrame:
        """One row per episode: its team reward, right or not, and the turn it ended at."""
        return steps.group_by("traj_uid").agg(pl.col("global_reward").first(), pl.col("turn").max().alias("last_turn"))

    steps = play(config.samples, config.temperature, config.seed)
    episodes = team(steps)
    right = (episodes["global_reward"] >= 0.5).fill_null(False)
    add("team", "success", float(right.mean() or 0.0), episodes.height)
    known = episodes["global_reward"].drop_nulls()
    if known.len():
        add("team", "team_reward", float(known.mean()), known.len())
    turns = int(steps["turn"].max() or 0) + 1 if steps.height else 0
    for t in range(turns):
        done_by = ((episodes["last_turn"] <= t) & right).mean()
        add("team", f"success_turn{t}", float(done_by or 0.0), episodes.height)
    for agent_id in workflow.turn_order:
        mine = steps.filter(pl.col("agent_id") == agent_id)
        local = mine["local_reward"].drop_nulls()
        if local.len():
            add(agent_id, "reward", float(local.mean()), local.len())
        add(agent_id, "calls", mine.height / max(episodes.height, 1), episodes.height)
    extra = getattr(workflow, "metrics", None)
    if callable(extra):
        for agent_id, metric, value, n in extra(steps):
            add(agent_id, metric, value, n)
    if config.greedy:
        greedy = team(play(1, 0.0, config.seed))
        ok = (greedy["global_reward"] >= 0.5).fill_null(False)
        add("team", "success_greedy", float(ok.mean() or 0.0), greedy.height)
    df = pl.DataFrame(rows, schema=polars_schema(EVALUATION))
    return validate(df, EVALUATION)
