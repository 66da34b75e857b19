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

from pipeline.errors import ConfigError
from pipeline.workflows.math import MathWorkflow
from pipeline.workflows.reasoning_gym.answering import AnsweringTeam, SingleSolver
from pipeline.workflows.reasoning_gym.datasets import ReasoningGymTask
from pipeline.workflows.reasoning_gym.tool_plan import ToolPlanWorkflow

__all__ = ["ReasoningGymWorkflow", "SolverVerifierTeam", "SingleSolver", "TEAMS"]

TEAMS = ("single", "solver_verifier", "tool_plan")


@dataclass
class SolverVerifierTeam(AnsweringTeam, MathWorkflow):
    """DrMAS's Solver and Verifier on a reasoning-gym dataset."""

    name: ClassVar[str] = "reasoning_gym"

    def single_agent(self) -> "SingleSolver":
        """The Solver alone on the same dataset, on the same embedded model (the math workflow's
        single agent would start from the math model)."""
        solver = next(a for a in self.agents if a.agent_id == self.solver_id)
        return SingleSolver(task=self.task, agents=(solver,), orchestra=self.orchestra)


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
    return ToolPlanWorkflow(task=task, tool_tokens=tool_tokens, output_chars=output_chars, sandbox_timeout=sandbox_timeout,
                            sandbox_memory_mb=sandbox_memory_mb, allow_unisolated_network=allow_unisolated_network)
