"""What the reasoning-gym teams share (`AnsweringTeam`): the embedded model of their dataset,
and re-scoring a `steps` table from the stored rows (`rescore_steps`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import polars as pl

from pipeline.errors import DataError
from pipeline.types import Problem
from pipeline.workflows.math import SingleWorkflow
from pipeline.workflows.reasoning_gym.datasets import ReasoningGymTask

__all__ = ["AnsweringTeam", "rescore_steps"]


def rescore_steps(task: ReasoningGymTask, steps: pl.DataFrame, problems: pl.DataFrame, agent_id: str) -> pl.DataFrame:
    """The rows of `agent_id` (the agent whose text is the team's answer) in a `steps` table with
    a column `rescored`: the dataset's score of the row's completion, recomputed from the stored
    `problems` rows of the same round (question and stored entry) alone."""
    mine = steps.filter(pl.col("agent_id") == agent_id).join(problems.select("round", "uid", "question", "answer"), on=["round", "uid"], how="left")
    missing = mine.filter(pl.col("question").is_null())
    if missing.height:
        raise DataError(f"rescore: step {missing['step_id'][0]!r} has no problem row (round {missing['round'][0]}, uid {missing['uid'][0]!r})")
    scores = [task.reward(Problem(uid=r["uid"], question=r["question"], answer=r["answer"]), r["completion_text"]) for r in mine.iter_rows(named=True)]
    return mine.drop("question", "answer").with_columns(pl.Series("rescored", scores, dtype=pl.Float64))


class AnsweringTeam:
    """What the reasoning-gym teams share: the embedded model of their dataset, re-scoring."""

    name: ClassVar[str] = "reasoning_gym"

    @property
    def answering_agent(self) -> str:
        """The agent whose reply is the team's answer (the math teams': their Solver)."""
        return self.solver_id

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
class SingleSolver(AnsweringTeam, SingleWorkflow):
    """The Solver alone on a reasoning-gym dataset (the `single` team, and tool_plan's single agent)."""

    name: ClassVar[str] = "reasoning_gym"
