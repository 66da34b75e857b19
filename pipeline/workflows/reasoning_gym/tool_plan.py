"""`tool_plan`: PettingLLMs' pattern for puzzles on a reasoning-gym dataset. One turn:

- tool agent: sees the question and is asked for a Python program that prints what answers it;
  its code (a ```python block, else the text from its first def/import line, else the whole
  text: the code workflow's `extract_code`) runs in `pipeline.sandbox` (hostile input:
  `sandbox_timeout` seconds, `sandbox_memory_mb`, network isolation, output capped). Local
  reward: the dataset's score of the program's last output line taken as the answer (did the
  program work the answer out).
- plan agent: sees the question and what the program printed (at most `output_chars`
  characters; or why it failed) and answers. Local reward = team reward = the dataset's score of
  its answer.

Its single agent (`single_agent`, the budget-matched baselines' arm) is one agent answering the
question directly: the plan agent's policy on the dataset's own answering prompt (the reasoning-gym
`single` team), no program and no sandbox. The team's protocol played by one agent (the tool agent
taking both seats, the program still run) is the `protocol` arm (`ProtocolWorkflow`).

Program results are cached per (problem, code) and shared by the episodes of a problem and the
tree's copies (a run is a pure function of the code). A sandbox that cannot run a program at
all gives the tool's row a null reward naming why, and the plan agent sees that nothing ran.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from pipeline.errors import ConfigError
from pipeline.rollout.agent import Agent
from pipeline.rollout.workflow import Env, StepResult, Workflow
from pipeline.types import Message, Problem
from pipeline.workflows.code.env import extract_code
from pipeline.workflows.reasoning_gym.datasets import ReasoningGymTask
from pipeline.workflows.reasoning_gym.answering import AnsweringTeam

__all__ = ["TOOL", "PLANNER", "ToolPlanWorkflow", "ToolPlanEnv", "tool_prompt", "plan_prompt"]

TOOL = "tool"
PLANNER = "planner"
OUTPUT_CAP = 4096
"""Bytes of a program's stdout and stderr the sandbox keeps (the prompt shows fewer)."""


def tool_prompt(question: str) -> list[Message]:
    return [Message(role="user", content=f"{question}\nWrite a Python program that prints the answer on its last line.")]


def plan_prompt(question: str, output: str) -> list[Message]:
    return [Message(role="user", content=f"{question}\nA program written to solve it printed:\n{output}\nGive the answer alone.")]


@dataclass(frozen=True)
class ProgramRun:
    """What the plan agent is shown of one program's run, and the tool's reward."""

    shown: str
    reward: float | None
    error: str | None = None


class ToolPlanEnv(Env):
    def __init__(self, workflow: "ToolPlanWorkflow", problem: Problem) -> None:
        self.workflow, self.problem = workflow, problem
        self.run: ProgramRun | None = None
        self.answer: float | None = None

    def copy(self) -> "ToolPlanEnv":
        out = ToolPlanEnv(self.workflow, self.problem)
        out.run, out.answer = self.run, self.answer
        return out

    def observe(self, agent_id: str) -> list[Message]:
        if agent_id == TOOL:
            return tool_prompt(self.problem.question)
        return plan_prompt(self.problem.question, self.run.shown if self.run else "(nothing: no program ran)")

    def step(self, agent_id: str, text: str) -> StepResult:
        if agent_id == TOOL:
            self.run = self.workflow.run_program(self.problem, text)
            return StepResult(self.run.reward, False, None, self.run.error)
        self.answer = self.workflow.task.reward(self.problem, text)
        return StepResult(self.answer, True)

    def team_reward(self) -> float | None:
        return self.answer


def _default_agents() -> tuple[Agent, ...]:
    return (Agent(TOOL), Agent(PLANNER))


@dataclass
class ToolPlanWorkflow(AnsweringTeam, Workflow):
    """A tool agent and a plan agent on a reasoning-gym dataset (the module's docstring)."""

    task: ReasoningGymTask = None
    tool_tokens: int = 192
    output_chars: int = 400
    sandbox_timeout: float = 2.0
    sandbox_memory_mb: int = 256
    allow_unisolated_network: bool = False
    agents: tuple[Agent, ...] = field(default_factory=_default_agents)

    name: ClassVar[str] = "reasoning_gym"
    answering_agent: ClassVar[str] = PLANNER  # the plan agent's reply is the team's answer
    max_turns: ClassVar[int] = 1
    table_metrics: ClassVar[tuple[tuple[str, str, str], ...]] = (
        ("team", "success", "success"),
        ("team", "success_greedy", "greedy"),
        (TOOL, "reward", "tool_reward"),
        (PLANNER, "reward", "plan_reward"),
    )

    def __post_init__(self) -> None:
        def bad(what: str) -> ConfigError:
            return ConfigError(f"workflow 'reasoning_gym' (team tool_plan): {what}")

        for name, low in (("tool_tokens", 1), ("output_chars", 1), ("sandbox_memory_mb", 64)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise bad(f"{name} must be an integer >= {low}, got {v!r}")
        if isinstance(self.sandbox_timeout, bool) or not isinstance(self.sandbox_timeout, (int, float)) or not 0 < self.sandbox_timeout <= 5:
            raise bad(f"sandbox_timeout must be seconds in (0, 5] (within the 10 s reward timeout), got {self.sandbox_timeout!r}")
        if not isinstance(self.allow_unisolated_network, bool):
            raise bad(f"allow_unisolated_network must be true or false, got {self.allow_unisolated_network!r}")
        self.agents = tuple(self.agents)
        ids = sorted(a.agent_id for a in self.agents)
        if ids != sorted((TOOL, PLANNER)):
            raise bad(f"needs the agents {[TOOL, PLANNER]}, got {ids}")
        from pipeline import sandbox

        if not self.allow_unisolated_network and sandbox.available_isolation() == "none":
            raise bad("the sandbox that runs the tool's programs has no network isolation here; install bubblewrap "
                      "(apt-get install bubblewrap) or pass --workflow-options allow_unisolated_network=true")
        self._runs: dict[tuple[str, str], ProgramRun] = {}

    @property
    def turn_order(self) -> tuple[str, ...]:
        return (TOOL, PLANNER)

    def problems(self, split: str, n: int, seed: int) -> list[Problem]:
        return self.task.problems(split, n, seed)

    def reset(self, problem: Problem, strategy) -> ToolPlanEnv:
        return ToolPlanEnv(self, problem)

    def max_tokens(self, agent_id: str, kind: str = "rollout") -> int | None:
        return self.tool_tokens if agent_id == TOOL else self.task.default_max_tokens

    def single_agent(self):
        """One agent answering the question directly (the module's docstring): the dataset's
        answering prompt (`SingleSolver`) on the plan agent's policy, under the plan agent's id."""
        from dataclasses import replace

        from pipeline.workflows.reasoning_gym.answering import SingleSolver

        planner = next(a for a in self.agents if a.agent_id == PLANNER)
        answering = SingleSolver(task=self.task).agents[0]  # its role, under the plan agent's id and policy
        return SingleSolver(task=self.task, agents=(replace(answering, agent_id=PLANNER, policy_id=planner.policy_id),))

    def run_program(self, problem: Problem, text: str) -> ProgramRun:
        """The tool's program run in the sandbox (cached per problem and code)."""
        code = extract_code(text, "main")
        key = (problem.uid, code)
        if key not in self._runs:
            self._runs[key] = self._execute(problem, code)
        return self._runs[key]

    def _execute(self, problem: Problem, code: str) -> ProgramRun:
        from pipeline.sandbox import SandboxError, SandboxUnavailable, run_program

        try:
            res = run_program(code, timeout=float(self.sandbox_timeout), memory_mb=self.sandbox_memory_mb, output_cap=OUTPUT_CAP,
                              allow_unisolated_network=self.allow_unisolated_network)
        except (SandboxError, SandboxUnavailable) as err:
            return ProgramRun("(nothing: the program could not be run)", None, f"sandbox: {err}")
        out = res.stdout.strip()
        if res.status == "error":
            return ProgramRun("(nothing: the program could not be run)", None, f"sandbox: {res.reason}")
        lines = [ln for ln in out.splitlines() if ln.strip()]
        reward = self.task.reward(problem, lines[-1]) if lines else 0.0
        shown = out[-self.output_chars:] if out else "(no output)"
        if res.status != "ok":
            shown = f"{shown}\n(the program stopped: {res.reason})"[-self.output_chars:]
        return ProgramRun(shown, reward)
