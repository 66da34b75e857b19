"""`PlanPathWorkflow`: the Plan-Path team on the grid's mazes (the game, what each agent sees and
the rewards: `pipeline.workflows.plan_path.game`; the mechanism: the package's docstring).

Problems: the grid game's puzzles (`pipeline.workflows.grid.game.generate_puzzles`: deterministic
per split, n, seed and the maze options; a puzzle's split is a hash of its text, so train and
held-out never share one). The prompt_aug hint, shown to the tool agent, is the grid's: the maze
with the move to take written on every cell of one shortest path from the start.

The tree strategy copies the environment at every candidate (`PlanPathEnv.copy`: a few scalars;
the puzzle is shared and immutable). Feedback is not supported.

Budget-matched baselines (`pipeline.rollout.budget_matched`): `single_agent()` is one agent doing the
job without the tool (`team=single`): the tool's prompt, its path committed directly, one call a
turn; answers compare by the path a text writes (`read_path`).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import ClassVar

from pipeline.errors import ConfigError
from pipeline.models.build import check_model_scale
from pipeline.rollout.agent import Agent
from pipeline.rollout.workflow import Workflow
from pipeline.types import Problem
from pipeline.workflows.grid.game import MAX_CELLS, Puzzle, generate_puzzles, parse_puzzle
from pipeline.workflows.plan_path.game import MAX_PATH, PLAN, TOOL, PlanPathEnv, parse_plan_text, read_path, run_path

__all__ = ["PlanPathWorkflow", "TEAMS"]

TEAMS = {"tool_plan": (TOOL, PLAN), "single": (PLAN,)}
"""The `team` option: the agents (in turn order) of each team the workflow plays."""


def _default_agents() -> tuple[Agent, ...]:
    return (Agent(TOOL), Agent(PLAN))


def _uid(puzzle: Puzzle) -> str:
    import hashlib

    return "plan_path:" + hashlib.blake2b(puzzle.text.encode(), digest_size=6).hexdigest()


@dataclass
class PlanPathWorkflow(Workflow):
    """A tool agent and a plan agent on the grid's mazes (see the package's docstring). Options
    (`--workflow-options`): the maze generator's `size`, `walls`, `min_dist`, `max_dist`,
    `heldout_fraction`; `turns` (tool call + commit rounds per episode, default 2;
    `max_loop_num`, the run's turn count, overrides it); `team` (tool_plan, the default; or
    single: one agent committing paths without the tool, the team's `single_agent()`);
    `model_scale` (N: the embedded model N times as deep, about N times the parameters, a build
    of its own: the `wide` arm's single agent, with the parameters of a team of a policy per
    agent)."""

    max_loop_num: int | None = None
    turns: int = 2
    size: int = 4
    walls: int = 3
    min_dist: int = 2
    max_dist: int = 6
    heldout_fraction: float = 0.2
    team: str = "tool_plan"
    model_scale: int = 1
    agents: tuple[Agent, ...] = field(default_factory=_default_agents)

    name: ClassVar[str] = "plan_path"
    supports_feedback: ClassVar[bool] = False
    compares_answers: ClassVar[bool] = True
    table_metrics: ClassVar[tuple[tuple[str, str, str], ...]] = (
        ("team", "success", "success"),
        ("team", "success_greedy", "greedy"),
        (TOOL, "reward", "tool_reward"),
        (PLAN, "reward", "plan_reward"),
        (PLAN, "keeps_goal", "plan_keeps"),
        (PLAN, "rescues", "plan_rescues"),
    )

    def __post_init__(self) -> None:
        def bad(what: str) -> ConfigError:
            return ConfigError(f"workflow 'plan_path': {what}")

        def whole(name: str, low: int) -> None:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise bad(f"{name} must be an integer >= {low}, got {v!r}")

        for name, low in (("turns", 1), ("size", 2), ("walls", 0), ("min_dist", 1), ("max_dist", 1)):
            whole(name, low)
        check_model_scale(self.name, self.model_scale)
        if self.max_loop_num is not None:
            whole("max_loop_num", 1)
        if self.size * self.size > MAX_CELLS:
            raise bad(f"size {self.size} gives {self.size ** 2} cells; at most {MAX_CELLS} fit the prompt")
        if self.walls > self.size * self.size - 2:
            raise bad(f"{self.walls} walls leave no room for a start and a goal on a {self.size}x{self.size} grid")
        if self.min_dist > self.max_dist:
            raise bad(f"min_dist {self.min_dist} > max_dist {self.max_dist}")
        if self.max_dist > MAX_PATH:
            raise bad(f"max_dist {self.max_dist} > {MAX_PATH}, the longest path a call may write")
        if isinstance(self.heldout_fraction, bool) or not (isinstance(self.heldout_fraction, (int, float)) and 0 < self.heldout_fraction < 1):
            raise bad(f"heldout_fraction must be in (0, 1), got {self.heldout_fraction!r}")
        if self.team not in TEAMS:
            raise bad(f"team must be one of {list(TEAMS)}, got {self.team!r}")
        self.agents = tuple(self.agents)
        if self.team == "single" and self.agents == _default_agents():
            self.agents = (Agent(PLAN),)
        ids = sorted(a.agent_id for a in self.agents)
        if ids != sorted(TEAMS[self.team]):
            raise bad(f"team {self.team} needs the agents {list(TEAMS[self.team])}, got {ids}")
        if self.team == "single":
            self._single_columns()

    def _single_columns(self) -> None:
        self.table_metrics = (("team", "success", "success"), ("team", "success_greedy", "greedy"), (PLAN, "reward", "single_reward"))

    # -- the contract -----------------------------------------------------------------------
    @property
    def max_turns(self) -> int:
        return self.max_loop_num if self.max_loop_num is not None else self.turns

    @property
    def turn_order(self) -> tuple[str, ...]:
        return TEAMS[self.team]

    def _problem(self, puzzle: Puzzle, split: str) -> Problem:
        return Problem(
            uid=_uid(puzzle),
            question=puzzle.text,
            answer=puzzle.path(),
            split=split,
            hint=puzzle.hint(),
            meta=(("task", "plan_path"), ("shortest", str(puzzle.shortest))),
        )

    def problems(self, split: str, n: int, seed: int) -> list[Problem]:
        if split not in ("train", "heldout"):
            raise ConfigError(f"split must be 'train' or 'heldout', got {split!r}")
        puzzles = generate_puzzles(split, n, seed, self.size, self.walls, self.min_dist, self.max_dist, self.heldout_fraction)
        return [self._problem(p, split) for p in puzzles]

    def reset(self, problem: Problem, strategy) -> PlanPathEnv:
        return PlanPathEnv(parse_puzzle(problem.question), self.max_turns, single=self.team == "single")

    def max_tokens(self, agent_id: str, kind: str = "rollout") -> int | None:
        return MAX_PATH + 1  # the longest path and the end token

    def default_model(self):
        from pipeline.workflows.plan_path.model import PlanPathGame, plan_path_model

        return plan_path_model(game=PlanPathGame(self.size, self.walls, self.min_dist, self.max_dist, self.heldout_fraction), scale=self.model_scale)

    # -- the budget-matched baselines -------------------------------------------------------
    def single_agent(self) -> "PlanPathWorkflow":
        """One agent doing the job without the tool (`team=single`): it sees the tool's prompt
        (the maze), and its path is committed and run for real, one call a turn, on the same
        problems, turns and model. It takes the plan agent's seat (its id and policy: the agent
        that commits), so the baselines play it with the plan agent's checkpoint. The default
        (`SoloWorkflow`) would play the team's protocol (trial, then commit) with one policy."""
        solo = copy.copy(self)
        solo.team = "single"
        solo.agents = tuple(a for a in self.agents if a.agent_id == PLAN)
        solo._single_columns()
        return solo

    def answer_key(self, agent_id: str, text: str) -> str | None:
        """The path the text writes (`read_path`), None when it writes none."""
        return read_path(text)

    def metrics(self, steps) -> list[tuple[str, str, float, int]]:
        """Extra evaluation rows of the plan agent, read from its prompts and commits: `keeps_goal`,
        the share of its commits that run the tool's path to the goal when the tool's trial
        reached it; `rescues`, the share of its commits that reach the goal when the trial did not."""
        import polars as pl

        plans = steps.filter(pl.col("agent_id") == PLAN)
        if not plans.height:
            return []
        kept, rescued = [], []
        for messages, text in zip(plans["sampling_messages"].to_list(), plans["completion_text"].to_list()):
            read = parse_plan_text(messages[-1]["content"])
            if read is None:
                continue
            call, output = read
            grid = messages[-1]["content"].split("\n")[1:-2]
            try:
                puzzle = parse_puzzle("\n".join(grid))
            except ValueError:
                continue
            mine = run_path(puzzle, puzzle.start, text)
            if output.startswith("goal") and call is not None:
                kept.append(mine.reached and mine.ran == run_path(puzzle, puzzle.start, call).ran)
            else:
                rescued.append(mine.reached)
        out = []
        if kept:
            out.append((PLAN, "keeps_goal", sum(kept) / len(kept), len(kept)))
        if rescued:
            out.append((PLAN, "rescues", sum(rescued) / len(rescued), len(rescued)))
        return out
