"""`ReasoningGymWorkflow`: builds the team named by `team` on a `ReasoningGymTask`.

- `solver_verifier` (default): the math workflow's Solver/Verifier loop (`MathWorkflow`, DrMAS's
  pair) on the dataset's questions; the Verifier works the question out again blind and approves
  when its answer agrees with the Solver's; the Solver's rewards are the dataset's scores.
- `single`: the Solver alone (`SingleWorkflow`).
- `tool_plan`: a tool agent writes Python that the sandbox runs, a plan agent answers from its
  output (`pipeline.workflows.reasoning_gym.tool_plan`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import polars as pl

from pipeline.errors import ConfigError
from pipeline.types import Problem
from pipeline.workflows.math import MathWorkflow, SingleWorkflow
from pipeline.workflows.math.orchestra import SOLVER
from pipeline.workflows.reasoning_gym.datasets import ReasoningGymTask

__all__ = ["ReasoningGymWorkflow", "TEAMS", "WORKFLOW_OPTIONS", "rescore_steps"]

TEAMS = ("single", "solver_verifier", "tool_plan")
WORKFLOW_OPTIONS = ("dataset", "team", "max_loop_num", "heldout_fraction", "max_tokens", "tool_tokens", "output_chars",
                    "sandbox_timeout", "sandbox_memory_mb", "allow_unisolated_network")
"""The workflow's own options; every other `--workflow-options` key is the dataset's."""


def rescore_steps(task: ReasoningGymTask, steps: pl.DataFrame, problems: pl.DataFrame, agent_id: str) -> pl.DataFrame:
    """The rows of `agent_id` (the agent whose text is the team's answer) in a `steps` table with
    a column `rescored`: the dataset's score of the row's completion, recomputed from the stored
    `problems` rows of the same round (question and stored entry) alone."""
    mine = steps.filter(pl.col("agent_id") == agent_id).join(problems.select("round", "uid", "question", "answer"), on=["round", "uid"], how="left")
    missing = mine.filter(pl.col("question").is_null())
    if missing.height:
        raise ConfigError(f"rescore: step {missing['step_id'][0]!r} has no problem row (round {missing['round'][0]}, uid {missing['uid'][0]!r})")
    scores = [task.reward(Problem(uid=r["uid"], question=r["question"], answer=r["answer"]), r["completion_text"]) for r in mine.iter_rows(named=True)]
    return mine.drop("question", "answer").with_columns(pl.Series("rescored", scores, dtype=pl.Float64))


class _Answered:
    """What the reasoning-gym teams share: the embedded model of their dataset, re-scoring."""

    name: ClassVar[str] = "reasoning_gym"
    answering_agent: ClassVar[str] = SOLVER

    def default_model(self):
        from pipeline.workflows.reasoning_gym.model import reasoning_gym_model

        return reasoning_gym_model(self.task)

    def rescore(self, steps: pl.DataFrame, problems: pl.DataFrame) -> pl.DataFrame:
        """`rescore_steps` for this team's answering agent."""
        return rescore_steps(self.task, steps, problems, self.answering_agent)

    def describe(self) -> str:
        team = ", ".join(f"{a.agent_id}@{a.policy_id}" for a in self.agents)
        return f"reasoning_gym {self.task.dataset} ({team})"


@dataclass
class SolverVerifierTeam(_Answered, MathWorkflow):
    """DrMAS's Solver and Verifier on a reasoning-gym dataset."""

    name: ClassVar[str] = "reasoning_gym"


@dataclass
class SingleSolver(_Answered, SingleWorkflow):
    """The Solver alone on a reasoning-gym dataset."""

    name: ClassVar[str] = "reasoning_gym"


def ReasoningGymWorkflow(dataset: str | None = None, team: str = "solver_verifier", max_loop_num: int = 2, heldout_fraction: float = 0.2,
                         max_tokens: int = 16, tool_tokens: int = 192, output_chars: int = 400, sandbox_timeout: float = 2.0,
                         sandbox_memory_mb: int = 256, allow_unisolated_network: bool = False, task_file: str | None = None, **options: Any):
    """The reasoning-gym workflow: `dataset` (any reasoning-gym dataset by name) with its
    generator's `options`, played by `team` (single | solver_verifier | tool_plan). Options of
    the workflow: `max_loop_num` (Solver/Verifier loops), `heldout_fraction` (share of the
    questions held out, by a hash of the question text), `max_tokens` (the answering agents'
    budget), and for tool_plan `tool_tokens`, `output_chars` (program output shown to the plan
    agent), `sandbox_timeout`, `sandbox_memory_mb`, `allow_unisolated_network`."""
    from pipeline.workflows.reasoning_gym.datasets import dataset_names

    if dataset is None:
        raise ConfigError(f"workflow 'reasoning_gym' needs a dataset: --workflow-options dataset=NAME; the datasets are: {', '.join(dataset_names())}")
    if task_file is not None:
        raise ConfigError("workflow 'reasoning_gym' takes no task file: its problems are the dataset's (--workflow-options dataset=NAME)")
    if team not in TEAMS:
        raise ConfigError(f"workflow 'reasoning_gym': team must be one of {list(TEAMS)}, got {team!r}")
    task = ReasoningGymTask(dataset, options, heldout_fraction=heldout_fraction, max_tokens=max_tokens)
    if team == "single":
        return SingleSolver(task=task)
    if team == "solver_verifier":
        return SolverVerifierTeam(task=task, max_loop_num=max_loop_num)
    from pipeline.workflows.reasoning_gym.tool_plan import ToolPlanWorkflow

    return ToolPlanWorkflow(task=task, tool_tokens=tool_tokens, output_chars=output_chars, sandbox_timeout=sandbox_timeout,
                            sandbox_memory_mb=sandbox_memory_mb, allow_unisolated_network=allow_unisolated_network)
