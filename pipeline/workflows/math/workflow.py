"""The math workflows: DrMAS's Solver/Verifier orchestra (`math`, the default) and the Solver
alone (`single`, a team of one: GRPO's setting), on a task with a checkable answer
(`pipeline.tasks`: the arithmetic task, or a JSONL/Parquet file such as GSM8K).

`math`: the Solver answers, the Verifier judges; an approved sample stops, the others loop, up
to `max_loop_num` loops (`pipeline.workflows.math.orchestra` documents what each role sees and when a
sample stops). Rewards: Solver local = the reward of its own attempt; Verifier local = whether
its verdict matches the judged attempt's correctness (`pipeline.rollout.rewards.verifier_local_reward`);
team reward = the reward of the answer the team plays (`final_answer`): by default the Solver's
first attempt, replaced by a retry only when the Verifier approved that retry ("approved"); DrMAS's
own rule, the Solver's latest attempt whatever the Verifier said of it, is `final_answer=last`.
Why not "last" by default: a Verifier that rejects a right first answer would then swap it for a
retry it never approved, so the loop as deployed could end below its Solver alone; under
"approved" a retry replaces the first answer only on the Verifier's word, so the loop loses a
right first answer only where the Verifier approves a wrong retry.

`single`: the Solver answers once (feedback: twice, the task's feedback between); team reward =
local reward = the reward of its attempt.

The evaluation of the team is `pipeline.workflows.math.evaluation`.

Budget-matched baselines (`pipeline.rollout.budget_matched`): the single agent is the Solver alone
(`single`); its answers compare by the number the reward reads (or the task's `answer_key`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from pipeline.rollout.agent import SHARED_POLICY, Agent
from pipeline.workflows.math.evaluation import evaluate_team, review_set_rows
from pipeline.workflows.math.review_set import REVIEW_SET_SIZE
from pipeline.workflows.math.orchestra import FEEDBACK_TURNS, SOLVER, VERIFIER, MathOrchestra, Utterance, default_agents, solver_view, verifier_view
from pipeline.errors import ConfigError
from pipeline.rollout.rewards import Outcome, verifier_local_reward
from pipeline.tasks.answers import last_number
from pipeline.tasks.base import budget_of
from pipeline.strategies import Feedback
from pipeline.types import Problem
from pipeline.rollout.workflow import Env, StepResult, Workflow, finite_reward

__all__ = ["MathWorkflow", "SingleWorkflow", "MathEnv"]


class _Scores:
    """The task's rewards of one problem's texts, computed once per text (rewards are pure
    functions of the problem and the text); shared by an episode's tree copies."""

    __slots__ = ("task", "problem", "cache")

    def __init__(self, task, problem: Problem) -> None:
        self.task, self.problem, self.cache = task, problem, {}

    def __call__(self, text: str) -> Outcome:
        out = self.cache.get(text)
        if out is None:
            try:
                value = self.task.reward(self.problem, text)
            except Exception as exc:  # noqa: BLE001 - task code may raise anything
                out = Outcome(None, f"reward: {type(exc).__name__}: {exc}")
            else:
                try:
                    v = finite_reward(value, "reward")
                    out = Outcome(v) if v is not None else Outcome(None, "reward returned None")
                except ValueError as err:
                    out = Outcome(None, str(err))
            self.cache[text] = out
        return out


class MathEnv(Env):
    """One episode of the Solver/Verifier loop on one problem (one sample of a group, or a tree)."""

    def __init__(self, workflow: "MathWorkflow", problem: Problem, strategy) -> None:
        self.workflow, self.problem, self.strategy = workflow, problem, strategy
        self.scores = _Scores(workflow.task, problem)
        self.opening = workflow.task.solver_messages(problem)
        self.attempts: list[str] = []
        self.replies: list[Utterance] = []
        self.last: Outcome | None = None
        """The reward of the Solver's latest attempt."""
        self.final: Outcome | None = None
        """The reward of the answer the team plays (`MathWorkflow.final_answer`)."""
        self.loops = 0

    def copy(self) -> "MathEnv":
        out = object.__new__(type(self))  # a subclass's copy extends this one
        out.workflow, out.problem, out.strategy, out.scores, out.opening = self.workflow, self.problem, self.strategy, self.scores, self.opening
        out.attempts, out.replies, out.last, out.loops = list(self.attempts), list(self.replies), self.last, self.loops
        out.final = self.final
        return out

    def observe(self, agent_id: str):
        if agent_id == self.workflow.solver_id:
            return solver_view(self.opening, self.attempts, self.replies)
        return verifier_view(self.workflow.task, self.problem, self.attempts[-1])

    def step(self, agent_id: str, text: str) -> StepResult:
        wf = self.workflow
        if agent_id == wf.solver_id:
            self.attempts.append(text)
            self.last = self.scores(text)
            # feedback's second attempt answers the task's own feedback: it is the answer whatever the Verifier says
            if len(self.attempts) == 1 or wf.verifier_id is None or wf.final_answer == "last" or isinstance(self.strategy, Feedback):
                self.final = self.last
            if wf.verifier_id is None:  # a team of one: each attempt is checked by the task alone
                return self._after_loop(text, approved=False, local=self.last)
            return _result(self.last)
        task = wf.task
        reads_solution = getattr(task, "verdict_reads_solution", False)
        try:
            verdict = task.parse_verdict(text, self.attempts[-1]) if reads_solution else task.parse_verdict(text)
            verdict = Outcome(verdict) if verdict in (True, False, None) else Outcome(None, f"parse_verdict returned {verdict!r}, expected True, False or None")
        except Exception as exc:  # noqa: BLE001
            verdict = Outcome(None, f"parse_verdict: {type(exc).__name__}: {exc}")
        # a Verifier that checks by solving again is rewarded only for a right verdict from a right answer
        own = self.scores(text) if reads_solution else None
        local = verifier_local_reward(verdict, self.last, own)
        approved = verdict.ok and verdict.value is True
        if approved:  # an approved retry is the answer the team plays ("approved"; "last" has it already)
            self.final = self.last
        result = self._after_loop(text, approved, local)
        return StepResult(result.reward, result.done, verdict.value if verdict.ok else None, result.error)

    def _after_loop(self, text: str, approved: bool, local: Outcome) -> StepResult:
        """End of loop `self.loops`: stop, or queue the Solver's reply for its next attempt."""
        wf = self.workflow
        feedback = isinstance(self.strategy, Feedback)
        if feedback:
            going = self.loops + 1 < FEEDBACK_TURNS
        else:  # a team of one has no one to reject its attempt: it answers once
            going = wf.verifier_id is not None and not approved and self.loops + 1 < wf.max_loop_num
        self.loops += 1
        if going:
            reply = wf.orchestra.reply(self.strategy, self.problem, self.attempts[-1], text)
            self.replies.append(reply)
        return _result(local, done=not going)

    def team_reward(self) -> float | None:
        if self.final is None:
            return None
        if not self.final.ok:
            raise ValueError(self.final.error)
        return self.final.value


FINAL_ANSWERS = ("approved", "last")
"""The rules for the answer a math team plays (`MathWorkflow.final_answer`)."""


def _result(outcome: Outcome, done: bool = False) -> StepResult:
    return StepResult(outcome.value if outcome.ok else None, done, None, outcome.error)


@dataclass
class MathWorkflow(Workflow):
    """DrMAS's math orchestra as a workflow: a Solver and a Verifier on a task's problems."""

    task: object = None
    """The task (`pipeline.tasks.Task`): prompts, reward, verdict parsing, feedback."""
    agents: tuple[Agent, ...] = field(default_factory=default_agents)
    """One agent of role "solver" and one of role "verifier" (any ids)."""
    max_loop_num: int = 2
    """Solver/Verifier loops at most per sample (DrMAS's max_loop_num); feedback always runs 2."""
    final_answer: str = "approved"
    """The answer the team plays (its team reward): "approved", the Solver's first attempt unless
    the Verifier approved a retry (then that retry); "last", the Solver's latest attempt (DrMAS's)."""
    orchestra: MathOrchestra | None = None
    """The loop's rules (rejection message); built from the task by default."""

    name: ClassVar[str] = "math"
    supports_feedback: ClassVar[bool] = True
    table_metrics: ClassVar[tuple[tuple[str, str, str], ...]] = (
        (SOLVER, "accuracy", "solver_acc"),
        (SOLVER, "accuracy_greedy", "greedy"),
        (SOLVER, "accuracy_hint", "with_hint"),
        (VERIFIER, "verdict_accuracy", "verifier_acc"),
        (VERIFIER, "verdict_balanced_accuracy", "verifier_bal_acc"),
        (VERIFIER, "verdict_set_balanced_accuracy", "verifier_set_bal"),
        (VERIFIER, "verdict_balanced_accuracy_greedy", "verifier_bal_greedy"),
    )
    roles: ClassVar[tuple[str, ...]] = (SOLVER, VERIFIER)

    def __post_init__(self) -> None:
        if self.task is None:
            from pipeline.tasks import make_task

            self.task = make_task()
        self.agents = tuple(self.agents)
        if isinstance(self.max_loop_num, bool) or not isinstance(self.max_loop_num, int) or self.max_loop_num < 1:
            raise ConfigError(f"workflow {self.name!r}: max_loop_num must be an integer >= 1, got {self.max_loop_num!r}")
        if self.final_answer not in FINAL_ANSWERS:
            raise ConfigError(f"workflow {self.name!r}: final_answer must be one of {list(FINAL_ANSWERS)}, got {self.final_answer!r}")
        roles = [a.role for a in self.agents]
        if sorted(roles) != sorted(self.roles):
            raise ConfigError(f"workflow {self.name!r} needs one agent per role {list(self.roles)}; its agents have roles {roles}")
        if self.orchestra is None:
            prompts = getattr(self.task, "prompts", None)
            rejection = prompts.rejection_template() if callable(getattr(prompts, "rejection_template", None)) else None
            self.orchestra = MathOrchestra(self.task) if rejection is None else MathOrchestra(self.task, rejection_template=rejection)

    # the schedule: the Solver, then the Verifier, in every loop
    @property
    def turn_order(self) -> tuple[str, ...]:
        by_role = {a.role: a.agent_id for a in self.agents}
        return tuple(by_role[r] for r in self.roles)

    @property
    def max_turns(self) -> int:
        return max(self.max_loop_num, FEEDBACK_TURNS)

    @property
    def solver_id(self) -> str:
        return next(a.agent_id for a in self.agents if a.role == SOLVER)

    @property
    def verifier_id(self) -> str | None:
        return next((a.agent_id for a in self.agents if a.role == VERIFIER), None)

    def problems(self, split: str, n: int, seed: int) -> list[Problem]:
        return self.task.problems(split, n, seed)

    def reset(self, problem: Problem, strategy) -> MathEnv:
        return MathEnv(self, problem, strategy)

    def max_tokens(self, agent_id: str, kind: str = "rollout") -> int | None:
        return budget_of(self.task, None, kind)

    def default_model(self):
        from pipeline.workflows.math.model import default_model

        return default_model()

    def evaluate(self, samplers, tokenizers, config, round_: int):
        """`evaluate_team`; on the arithmetic task, also the Verifier judged on the fixed,
        balanced set (`verdict_set_*`, `review_set_rows`): near misses are made for integer sums,
        and a Verifier that judges only the Solver's own answers rests on the few wrong ones a
        good Solver leaves."""
        import polars as pl

        from pipeline.tasks.arithmetic import ArithmeticTask

        own = evaluate_team(self.task, self.agents, samplers, tokenizers, config, round_)
        verifier = next((a for a in self.agents if a.role == VERIFIER), None)
        if verifier is None or not isinstance(self.task, ArithmeticTask):
            return own
        return pl.concat([own, review_set_rows(self.task, verifier, samplers, tokenizers, config, round_, REVIEW_SET_SIZE, 0, "verdict_set")])

    # -- the budget-matched baselines: the Solver alone, its answers compared by their number
    compares_answers: ClassVar[bool] = True

    def single_agent(self) -> "SingleWorkflow":
        """The Solver alone on the same task (`single`), with the same rules and budgets."""
        solver = next(a for a in self.agents if a.role == SOLVER)
        return SingleWorkflow(task=self.task, agents=(solver,), orchestra=self.orchestra)

    def answer_key(self, agent_id: str, text: str) -> str | None:
        """The Solver's answer as the task reads it: the task's own `answer_key(text)` when it has
        one, else the number the reward reads (its "#### x", else its last number); None for a
        Verifier's call or a reply without one."""
        if agent_id != self.solver_id:
            return None
        own = getattr(self.task, "answer_key", None)
        if callable(own):
            key = own(text)
            return None if key is None else str(key)
        number = last_number(text)
        return None if number is None else repr(float(number))


@dataclass
class SingleWorkflow(MathWorkflow):
    """The Solver alone on the math task: a team of one, GRPO's setting."""

    agents: tuple[Agent, ...] = (Agent(SOLVER, SOLVER, SHARED_POLICY),)
    max_loop_num: int = 1

    name: ClassVar[str] = "single"
    roles: ClassVar[tuple[str, ...]] = (SOLVER,)
    table_metrics: ClassVar[tuple[tuple[str, str, str], ...]] = MathWorkflow.table_metrics[:3]

    @property
    def max_turns(self) -> int:
        return max(self.max_loop_num, FEEDBACK_TURNS)

    def single_agent(self) -> "SingleWorkflow":
        return self
