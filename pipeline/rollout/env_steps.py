"""The environments' side of a rollout round (`pipeline.rollout.loop`): every agent step's
completions stepped through the workflow's code (guarded, `safe_map`; a tree candidate steps its
own copy of the state), the tree's selection of the candidate it goes on from, the feedback
strategy's credit of its first attempt, and the team rewards that close the round.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

from pipeline.rollout.contract import StepResult, finite_reward, side_value, team_value
from pipeline.rollout.rewards import Outcome, row_reward, safe_map
from pipeline.rollout.rows import Episode, Row
from pipeline.rollout.sampling import RolloutConfig
from pipeline.strategies import Feedback

__all__ = ["step_envs", "select_candidate", "follow", "credit_first_attempts", "final_rewards", "best_candidate", "advance"]


def step_envs(acting: list[Episode], new_rows: list[list[Row]], agent_id: str, timeout: float | None) -> list[list[tuple | None]]:
    """Env stepping: the environment takes every completion (workflow code, guarded, one batch;
    a tree candidate steps its own copy). Each row gets its local reward and verdict, a tree row
    its team reward right after the step; per episode, per row: (env, StepResult) or None when
    the workflow's code failed (the row says why)."""
    calls = [(e.env, agent_id, row.sample.text, e.tree) for e, rows in zip(acting, new_rows) for row in rows]
    outcomes = iter(safe_map(advance, calls, timeout, label="step"))
    stepped = []
    for e, rows in zip(acting, new_rows):
        results = []
        for row in rows:
            out = next(outcomes)
            if not out.ok:
                row.local = Outcome(None, f"step({agent_id!r}): {out.error}")
                row.global_ = Outcome(None, "the episode ended at this step")
                results.append(None)
                continue
            env, result, reward, team = out.value
            row.local = Outcome(reward, result.error) if reward is not None else Outcome(None, result.error or "step returned reward None")
            row.verdict = result.verdict
            if e.tree:
                row.global_ = Outcome(*team)
            results.append((env, result))
        stepped.append(results)
    return stepped


def select_candidate(e: Episode, rows: list[Row], config: RolloutConfig) -> int:
    """Tree selection: the index of the row the episode goes on from (marked `selected` in a
    tree, by `best_candidate` over the mixed rewards); an ordinary trajectory's one row."""
    if not e.tree:
        return 0
    mixed = [row_reward(config.alpha, row.global_, row.local, config.local_weight).reward for row in rows]
    best = best_candidate(mixed, getattr(e.strategy, "greedy", True))
    for i, row in enumerate(rows):
        row.selected = i == best
    return best


def follow(e: Episode, chosen: Row, outcome: tuple | None) -> None:
    """The episode goes on from `chosen`: its next row's parent, its environment state; it ends
    when the step failed (with the row's error) or the environment is done."""
    e.parent = chosen.step_id
    if outcome is None:
        e.active, e.error = False, chosen.local.error
        return
    e.env = outcome[0]
    if outcome[1].done:
        e.active = False


def credit_first_attempts(acting: list[Episode], timeout: float | None) -> None:
    """Feedback credit: the feedback strategy's first attempt is an episode of its own that ends
    at the end of turn 0; its rows are credited with the team reward before the feedback, not
    with the second attempt's."""
    firsts = [e for e in acting if isinstance(e.strategy, Feedback) and e.error is None]
    for e, out in zip(firsts, safe_map(_team_reward, [(e.env,) for e in firsts], timeout, label="team_reward")):
        e.first_team = _team_outcome(out)


def best_candidate(rewards: Sequence[float | None], greedy: bool) -> int:
    """AT-GRPO's best-of-N: argmax of the immediate rewards (first on ties, nulls last), or 0."""
    if not greedy:
        return 0
    best_i, best_v = 0, -math.inf
    for i, v in enumerate(rewards):
        if v is not None and v > best_v:
            best_i, best_v = i, v
    return best_i


def advance(env, agent_id: str, text: str, branch: bool):
    """One guarded unit of workflow code: step `env` (a copy of it for a tree candidate) with
    the agent's text; a tree candidate also reads its team reward right after the step (its own
    side's where the environment gives one per side), as (value, why it is None)."""
    if branch:
        env = env.copy()
        if env is None:
            raise ValueError("copy returned None")
    result = env.step(agent_id, text)
    if not isinstance(result, StepResult):
        raise ValueError(f"step returned {type(result).__name__}, expected a StepResult")
    reward = finite_reward(result.reward, "step")
    if result.verdict not in (True, False, None):
        raise ValueError(f"step returned verdict {result.verdict!r}, expected True, False or None")
    team = side_value(team_value(env.team_reward(), "team_reward"), agent_id) if branch else None
    return env, result, reward, team


def _team_reward(env):
    return team_value(env.team_reward(), "team_reward")


def final_rewards(episodes: list[Episode], timeout: float | None) -> None:
    """Ordinary trajectories: every row gets the episode's team reward at its end as its global
    reward, its own agent's where the environment gives one per side (tree rows were scored right
    after their step)."""
    ordinary = [e for e in episodes if not e.tree and e.rows]
    live = [e for e in ordinary if e.error is None]
    teams = dict(zip(map(id, live), safe_map(_team_reward, [(e.env,) for e in live], timeout, label="team_reward")))
    for e in ordinary:
        final = Outcome(None, e.error) if e.error is not None else _team_outcome(teams[id(e)])
        for row in e.rows:
            row.global_ = _side(e.first_team if e.first_team is not None and row.turn == 0 else final, row.agent_id)


def _team_outcome(out: Outcome) -> Outcome:
    """A guarded `team_reward()` call as the global reward of rows (None is named)."""
    if out.ok and out.value is None:
        return Outcome(None, "team_reward returned None")
    return out


def _side(out: Outcome, agent_id: str) -> Outcome:
    """`agent_id`'s global reward from a team outcome: the value itself, or its entry of a
    per-side mapping (a missing or None entry is named)."""
    if not out.ok or not isinstance(out.value, Mapping):
        return out
    return Outcome(*side_value(out.value, agent_id))
