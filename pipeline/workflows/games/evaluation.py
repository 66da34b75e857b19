"""The games' evaluation: self-play on the held-out positions (`evaluate_workflow`, whose team
`success` is a legal finish in tic-tac-toe and `team_reward` the joint deal value in bargaining),
then the team's player against two opponents, in each seat, on the same held-out positions every
round (the evaluation seed):

- "scripted": the game's scripted player (`GameWorkflow.opponent`: tic-tac-toe's heuristic wins
  if it can, blocks if it must, else plays a random cell), played inside the environment;
- "base": the starting policy (`base_model`, default the workflow's embedded model), sampled by a
  transformers engine of its own at the evaluation's temperature.

Metrics (agent "team": both seats together; per seat under the seat's agent):
`{win,draw,loss}_vs_{scripted,base}` (a forfeit by an illegal move is a loss) and
`illegal_vs_{opponent}` (the share of games the team's player forfeited).
"""

from __future__ import annotations

from typing import Mapping

import polars as pl

from pipeline.rollout.agent import Agent
from pipeline.rollout.evaluation import evaluate_workflow
from pipeline.rollout.workflow import Workflow
from pipeline.types import Problem
from pipeline.workflows.games.env import PLAYERS, GameEnv
from pipeline.workflows.games.opponents import OPPONENTS
from schemas import EVALUATION, polars_schema, validate

__all__ = ["Versus", "evaluate_game", "versus_results", "BASE_POLICY"]

BASE_POLICY = "base-opponent"
"""The policy id of the starting policy when it plays the other seat."""


class Versus(Workflow):
    """`game` with the team's agent in `seat` and the other seat held by `opponent`: "scripted"
    (played inside the environment) or "base" (an agent on `BASE_POLICY`). The team reward of an
    episode is the seat's result: 1 win, 0.5 draw, 0 loss."""

    def __init__(self, game, seat: int, opponent: str) -> None:
        self.game, self.seat, self.opponent = game, seat, opponent
        self.name = game.name
        policy = {a.agent_id: a.policy_id for a in game.agents}
        mine = Agent(PLAYERS[seat], policy_id=policy[PLAYERS[seat]])
        if opponent == "base":
            other = Agent(PLAYERS[1 - seat], policy_id=BASE_POLICY)
            self.agents = tuple(sorted((mine, other), key=lambda a: PLAYERS.index(a.agent_id)))
        else:
            self.agents = (mine,)
        self.max_turns = game.max_turns

    def problems(self, split: str, n: int, seed: int) -> list[Problem]:
        return self.game.problems(split, n, seed)

    def reset(self, problem: Problem, strategy) -> GameEnv:
        table = self.game.table(problem)
        seats = {a.agent_id: PLAYERS.index(a.agent_id) for a in self.agents}
        scripted = OPPONENTS[self.game.spec.name][self.game.opponent] if self.opponent == "scripted" else None
        return GameEnv(self.game.spec, table, seats, self.game.illegal_penalty, opponent=scripted, judge=self.seat, seed=problem.uid, reward=self.game.reward)

    def max_tokens(self, agent_id: str, kind: str = "rollout") -> int | None:
        return self.game.max_tokens(agent_id, kind)


def versus_results(steps: pl.DataFrame, seat_agent: str, penalty: float) -> pl.DataFrame:
    """One row per game (every game, also one the opponent won before the seat's first call):
    `result` (the team reward: 1 win, 0.5 draw, 0 loss; a null, from an episode the workflow's
    code broke, counts as a loss) and `illegal` (the game's last call was the seat's illegal
    move: it ended the game with the penalty as its local reward)."""
    last = pl.col("agent_id").last() == seat_agent
    return steps.sort("turn", "step").group_by("traj_uid").agg(
        pl.col("global_reward").first().fill_null(0.0).alias("result"),
        (last & (pl.col("local_reward").last() == penalty)).fill_null(False).alias("illegal"),
    )


def _play(workflow: Workflow, problems, samplers, config, round_: int) -> pl.DataFrame:
    from pipeline.rollout.loop import run_rollouts
    from pipeline.rollout.sampling import RolloutConfig
    from pipeline.strategies import IID

    budget = config.max_tokens or workflow.max_tokens(PLAYERS[0], "eval")
    cfg = RolloutConfig(round=0, temperature=config.temperature, max_tokens=budget, seed=config.seed, reward_timeout=config.reward_timeout)
    return pl.from_arrow(run_rollouts(problems, workflow, [IID(group_size=config.samples)], samplers, cfg))


def _base_sampler(game, samplers):
    """A transformers engine on the starting policy, or None when the workflow names none."""
    from pipeline.engines import make_sampler

    base = game.base_model or game.default_model()
    if base is None:
        return None
    cached = getattr(game, "_base_engine", None)
    if cached is not None and str(cached.model_dir) == str(base):
        return cached
    engine = make_sampler("hf", base)
    game._base_engine = engine
    return engine


def evaluate_game(game, samplers: Mapping[str, object], tokenizers: Mapping[str, object], config, round_: int) -> pl.DataFrame:
    """The `evaluation` rows of one round of a game workflow (module docstring)."""
    frame = evaluate_workflow(game.scored_as_a_team(), samplers, tokenizers, config, round_)
    problems = game.problems("heldout", config.problems, config.seed)
    policy_of = {a.agent_id: a.policy_id for a in game.agents}
    rows: list[dict] = []

    def add(agent_id: str, metric: str, value: float, n: int) -> None:
        rows.append({"round": round_, "policy_id": policy_of.get(agent_id, "*"), "agent_id": agent_id, "split": "heldout", "metric": metric, "value": float(value), "n": int(n)})

    base = _base_sampler(game, samplers)
    for opponent in ("scripted", "base"):
        if opponent == "base" and base is None:
            continue
        engines = {**samplers, BASE_POLICY: base} if opponent == "base" else dict(samplers)
        per_seat = []
        for seat, agent_id in enumerate(PLAYERS):
            steps = _play(Versus(game, seat, opponent), problems, engines, config, round_)
            games = versus_results(steps, agent_id, game.illegal_penalty)
            per_seat.append(games)
            add(agent_id, f"win_vs_{opponent}", float((games["result"] == 1.0).mean() or 0.0), games.height)
        both = pl.concat(per_seat)
        for name, value in (("win", 1.0), ("draw", 0.5), ("loss", 0.0)):
            add("team", f"{name}_vs_{opponent}", float((both["result"] == value).mean() or 0.0), both.height)
        add("team", f"illegal_vs_{opponent}", float(both["illegal"].mean() or 0.0), both.height)
    extra = pl.DataFrame(rows, schema=polars_schema(EVALUATION))
    return validate(pl.concat([frame, extra]), EVALUATION)
