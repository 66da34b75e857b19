"""`math_review`: the math team with DrMAS's Verifier, which reads the answer it judges.

The `math` team's Verifier is blind: it works the sum out again and its verdict is whether the
two agree, a second sample of the same policy. Here the Verifier is shown the Solver's answer
and says whether it is right:

- Solver: the problem ("12+34="), its answer ("46"); after a rejection it sees its answer and
  "That is wrong. Try again." (`REVIEW_REJECTION`; a file task's own rejection message quotes the
  Verifier) and answers again (`orchestra.solver_view`).
- Verifier: the problem and the Solver's answer ("12+34=\\nProposed answer: 46\\nIs it right?",
  `pipeline.tasks.prompts.REVIEW_PROMPTS`); it may write the sum first, then its verdict word
  ("46 yes"). The verdict is that word; an unparsable reply is a rejection that earns nothing.
  On a file task the task's own Verifier prompt shows the whole solution and reads its
  "Verdict: yes|no".

Rewards:
- Solver local: its answer right (the task's reward).
- Verifier local: 1 for a right verdict (approves a right answer, rejects a wrong one), else 0;
  its own sum is a scratchpad and is not scored. Catching wrong answers counts as much as passing
  right ones through the verdict balance, not the reward: the "rs" loss's view gives the kept
  "yes" and "no" rows equal total weight (`ViewConfig.balance_verdicts`), i.e. each class
  weighted by its inverse frequency among the right verdicts. Weighting the reward itself would
  do nothing under "rs" (it keeps rows at or above a threshold) and would put a constant offset
  into the policy-gradient losses' group baselines; a verdict-correctness reward is what DrMAS
  trains.
- Team: the final answer right (`final_attempt`).

The loop as deployed (the rollouts and the evaluation play it the same way): the Solver answers,
the Verifier judges; an approval stops, a rejection sends the Solver a retry, up to
`max_loop_num` loops. The final answer is the Solver's first answer unless the Verifier approved
a retry and its approval confirms it (`confirms`: its reply writes the retry's number, its own
working agrees); then the first such retry. Why both conditions:
- a retry replaces the first answer only when approved ("the last answer counts", the `math`
  team's rule, lets a chance Verifier throw away right first answers for retries that are mostly
  wrong, which is how that team ends below its Solver);
- approval alone is not enough while the Verifier is near chance and the retries are worse than
  first answers (they are, at the start: the Solver has never seen a rejection): each wrong retry
  it approves breaks a first answer that may have been right. A verdict word is a coin the
  Verifier can flip; writing the retry's exact number as its own sum is a claim a guess rarely
  makes. So a wrong retry replaces the first answer only when the Verifier computes that same
  wrong number, and the team can fall below its Solver only by that much
  (`confirm=False`: approval alone).

Evaluation (`evaluate_review`), on the held-out problems:
- the `math` team's metrics (`evaluate_team`: Solver `accuracy`, `accuracy_greedy`, the Verifier
  judging the Solver's sampled answers);
- the team played as deployed (`pipeline.rollout.evaluation.evaluate_workflow`): team `success`
  (the final answer right), `success_greedy`, and on the same episodes the Solver's
  `first_answer_accuracy` and the team's `fixed` (first answer wrong, final right) and `broken`
  (first right, final wrong) rates, so deployed against the Solver alone is one paired difference;
- the Verifier on a fixed, balanced set (`balanced_review_set`: `review_set_size` held-out
  problems, each once with its right answer and once with a near miss, fixed by
  `review_set_seed`, the same set every round and every run): `review_balanced_accuracy`
  (sampled), `review_balanced_accuracy_greedy`, `review_accuracy_right`, `review_accuracy_wrong`,
  `review_parsable`. A 90% Solver leaves a few dozen wrong answers to judge; this set does not
  move with the Solver.

The starting model is the default model fine-tuned on the review format (`review_model.py`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import ClassVar, Sequence

import polars as pl

from pipeline.errors import ConfigError
from pipeline.rollout.agent import Agent
from pipeline.rollout.contract import StepResult
from pipeline.rollout.rewards import CORRECT_THRESHOLD
from pipeline.tasks.answers import last_number
from pipeline.tasks.prompts import REVIEW_PROMPTS
from pipeline.types import Problem
from pipeline.workflows.math.orchestra import SOLVER, VERIFIER, default_agents
from pipeline.workflows.math.review_set import REVIEW_SET_SIZE, ReviewPair, balanced_review_set, near_miss
from pipeline.workflows.math.evaluation import evaluate_team, review_set_rows
from pipeline.workflows.math.workflow import MathEnv, MathWorkflow, SingleWorkflow
from schemas import EVALUATION, validate

__all__ = ["ReviewWorkflow", "ReviewEnv", "ReviewPair", "final_attempt", "confirms", "deployed_outcomes", "near_miss", "balanced_review_set", "evaluate_review"]


REVIEW_REJECTION = "That is wrong. Try again."
"""What the arithmetic Solver is told after a rejection: the words of the warm start's feedback
turn, which it answers. After the orchestra's own message, which quotes the Verifier ("The
verifier rejected your answer: 130 no\nTry again."), a message it has never seen, the review
model's Solver writes nothing, and an empty retry is never right, so rejection sampling has no
retry to keep (docs/results/math-review.md). A file task keeps its own rejection message."""


def final_attempt(verdicts: Sequence[bool | None], confirmed: Sequence[bool] | None = None) -> int:
    """The index of the answer the team gives, from the Verifier's verdicts on the Solver's
    attempts in order (True approved, False rejected, None unparsable or not judged): the first
    attempt when it was approved, else the first retry approved, else the first attempt (0).
    With `confirmed` (per attempt, `confirms`), a retry counts as approved only when confirmed."""
    if not verdicts or verdicts[0] is True:
        return 0
    for i in range(1, len(verdicts)):
        if verdicts[i] is True and (confirmed is None or confirmed[i]):
            return i
    return 0


def confirms(verifier_text: str, solver_text: str) -> bool:
    """Whether the Verifier's reply writes the judged answer's number (the Solver's "#### x",
    else its last number): its own working agrees with the answer it approves, so the approval
    is not a guess of the verdict word alone."""
    from pipeline.tasks.answers import numbers_equal

    proposed = last_number(solver_text)
    if proposed is None:
        return False
    written = [float(x.replace(",", "")) for x in re.findall(r"-?\d[\d,]*(?:\.\d+)?", verifier_text)]
    return any(numbers_equal(x, proposed) for x in written)


def deployed_outcomes(steps: pl.DataFrame, solver_id: str, verifier_id: str) -> pl.DataFrame:
    """Per episode of `steps` rows (a round's rollouts or an evaluation's), whether the Solver's
    first answer is right and whether the final answer is right under each rule: `approved` (a
    retry replaces the first answer when approved) and `confirmed` (only when the approval
    `confirms` the retry). Columns traj_uid, first, approved, confirmed."""
    rows = steps.select("traj_uid", "agent_id", "turn", "local_reward", "verdict", "completion_text").sort("traj_uid", "turn")
    out = []
    for (uid,), ep in rows.group_by(["traj_uid"], maintain_order=True):
        solver = {t: (r, x) for a, t, r, _, x in ep.select("agent_id", "turn", "local_reward", "verdict", "completion_text").iter_rows() if a == solver_id}
        judged = {t: (v, x) for a, t, _, v, x in ep.select("agent_id", "turn", "local_reward", "verdict", "completion_text").iter_rows() if a == verifier_id}
        if 0 not in solver:
            continue
        turns = sorted(solver)
        right = [solver[t][0] is not None and solver[t][0] >= CORRECT_THRESHOLD for t in turns]
        verdicts = [judged[t][0] if t in judged else None for t in turns]
        conf = [t in judged and confirms(judged[t][1], solver[t][1]) for t in turns]
        out.append({"traj_uid": uid, "first": right[0], "approved": right[final_attempt(verdicts)], "confirmed": right[final_attempt(verdicts, conf)]})
    return pl.DataFrame(out, schema={"traj_uid": pl.String, "first": pl.Boolean, "approved": pl.Boolean, "confirmed": pl.Boolean})


class ReviewEnv(MathEnv):
    """One episode of the review loop: `MathEnv` with the verdict on every attempt kept and the
    team reward read from the final answer (`final_attempt`)."""

    def __init__(self, workflow: "ReviewWorkflow", problem: Problem, strategy) -> None:
        super().__init__(workflow, problem, strategy)
        self.outcomes: list = []
        """The reward of each Solver attempt, in order."""
        self.verdicts: list[bool | None] = []
        """The Verifier's verdict on each judged attempt, in order."""
        self.confirmed: list[bool] = []
        """Whether each verdict `confirms` the attempt it judged."""

    def copy(self) -> "ReviewEnv":
        out = super().copy()
        out.outcomes, out.verdicts, out.confirmed = list(self.outcomes), list(self.verdicts), list(self.confirmed)
        return out

    def step(self, agent_id: str, text: str) -> StepResult:
        result = super().step(agent_id, text)
        if agent_id == self.workflow.solver_id:
            self.outcomes.append(self.last)
        else:
            self.verdicts.append(result.verdict)
            self.confirmed.append(confirms(text, self.attempts[-1]))
        return result

    def team_reward(self) -> float | None:
        if not self.outcomes:
            return None
        final = self.outcomes[final_attempt(self.verdicts, self.confirmed if self.workflow.confirm else None)]
        if not final.ok:
            raise ValueError(final.error)
        return final.value


class ReviewSingleWorkflow(SingleWorkflow):
    """The Solver alone (`single`) from the review team's starting model, so the baselines'
    single agent starts where the team does."""

    def default_model(self):
        from pipeline.workflows.math.review_model import review_model

        return review_model()


@dataclass
class ReviewWorkflow(MathWorkflow):
    """DrMAS's math team with a Verifier that reads the Solver's answer (see the module doc)."""

    task: object = None
    """The task (`pipeline.tasks.Task`); default: the arithmetic task with `REVIEW_PROMPTS`."""
    agents: tuple[Agent, ...] = field(default_factory=default_agents)
    """One agent of role "solver" and one of role "verifier" (any ids)."""
    max_loop_num: int = 2
    """Solver/Verifier loops at most per episode: a first answer and one retry by default."""
    task_file: str | None = None
    """A JSONL/Parquet task file instead of the arithmetic task (its prompts show the Verifier
    the whole solution and read "Verdict: yes|no")."""
    review_set_size: int = REVIEW_SET_SIZE
    """Held-out problems of the Verifier's balanced set (each once right, once a near miss)."""
    review_set_seed: int = 0
    """Seed of the balanced set: the same set every round and every run."""
    confirm: bool = True
    """A retry replaces the first answer only when the Verifier's approval `confirms` it (its
    reply writes the retry's number), not on the verdict word alone: a Verifier near chance
    approves wrong retries, and retries start out worse than first answers, so approval alone
    puts the team below its Solver (docs/results/math-review.md). False: any approval counts."""

    name: ClassVar[str] = "math_review"
    table_metrics: ClassVar[tuple[tuple[str, str, str], ...]] = (
        (SOLVER, "accuracy", "solver_acc"),
        (SOLVER, "first_answer_accuracy", "first_answer"),
        ("team", "success", "deployed"),
        ("team", "success_greedy", "deployed_greedy"),
        (VERIFIER, "review_balanced_accuracy", "review_bal_acc"),
        (VERIFIER, "review_balanced_accuracy_greedy", "review_bal_greedy"),
    )
    judged_metrics: ClassVar[tuple[tuple[str, str], ...] | None] = (("team", "success"), (VERIFIER, "review_balanced_accuracy"))

    def __post_init__(self) -> None:
        if self.task is None:
            if self.task_file:
                from pipeline.tasks import load_task_file

                self.task = load_task_file(self.task_file)
            else:
                from pipeline.tasks.arithmetic import ArithmeticTask

                self.task = ArithmeticTask(prompts=REVIEW_PROMPTS)
        prompts = getattr(self.task, "prompts", None)
        if prompts is not None and not getattr(prompts, "verifier_sees_solution", True):
            raise ConfigError(f"workflow {self.name!r}: the task's Verifier prompt does not show the Solver's answer ({prompts.verifier_user!r}); give it a {{solution}} placeholder")
        if not isinstance(self.confirm, bool):
            raise ConfigError(f"workflow {self.name!r}: confirm must be true or false, got {self.confirm!r}")
        for name in ("review_set_size", "review_set_seed"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < (1 if name == "review_set_size" else 0):
                raise ConfigError(f"workflow {self.name!r}: {name} must be an integer >= {1 if name == 'review_set_size' else 0}, got {value!r}")
        if self.orchestra is None and prompts is REVIEW_PROMPTS:
            from pipeline.workflows.math.orchestra import MathOrchestra

            self.orchestra = MathOrchestra(self.task, rejection_template=REVIEW_REJECTION, quotes_verifier=False)
        super().__post_init__()

    def reset(self, problem: Problem, strategy) -> ReviewEnv:
        return ReviewEnv(self, problem, strategy)

    def default_model(self):
        from pipeline.workflows.math.review_model import review_model

        return review_model()

    def single_agent(self) -> ReviewSingleWorkflow:
        solver = next(a for a in self.agents if a.role == SOLVER)
        return ReviewSingleWorkflow(task=self.task, agents=(solver,), orchestra=self.orchestra)

    def evaluate(self, samplers, tokenizers, config, round_: int):
        return evaluate_review(self, samplers, tokenizers, config, round_)

    def metrics(self, steps: pl.DataFrame) -> list[tuple[str, str, float, int]]:
        """Per played episode (`evaluate_workflow`'s hook): the Solver's first answer right, the
        team's answers it fixed and broke against that first answer, and the team's success under
        either final-answer rule (`success_approved_rule`, `success_confirmed_rule`: the same
        episodes, whichever rule `confirm` plays)."""
        first = (
            steps.filter((pl.col("agent_id") == self.solver_id) & (pl.col("turn") == 0))
            .group_by("traj_uid").agg((pl.col("local_reward").first() >= CORRECT_THRESHOLD).fill_null(False).alias("first"))
        )
        final = steps.group_by("traj_uid").agg((pl.col("global_reward").first() >= CORRECT_THRESHOLD).fill_null(False).alias("final"))
        both = first.join(final, on="traj_uid", how="inner")
        n = both.height
        if not n:
            return []
        rules = deployed_outcomes(steps, self.solver_id, self.verifier_id)
        by_rule = [("team", f"success_{rule}_rule", float(rules[rule].mean()), rules.height) for rule in ("approved", "confirmed")] if rules.height else []
        return by_rule + [
            (self.solver_id, "first_answer_accuracy", float(both["first"].mean()), n),
            ("team", "fixed", float((~both["first"] & both["final"]).mean()), n),
            ("team", "broken", float((both["first"] & ~both["final"]).mean()), n),
        ]


def evaluate_review(workflow: ReviewWorkflow, samplers, tokenizers, config, round_: int) -> pl.DataFrame:
    """The `evaluation` rows of one round of `math_review` (see the module doc)."""
    from pipeline.rollout.evaluation import evaluate_workflow

    task = workflow.task
    own = evaluate_team(task, workflow.agents, samplers, tokenizers, config, round_)
    played = evaluate_workflow(workflow, samplers, tokenizers, config, round_)
    verifier = next(a for a in workflow.agents if a.role == VERIFIER)
    extra = review_set_rows(task, verifier, samplers, tokenizers, config, round_, workflow.review_set_size, workflow.review_set_seed, "review")
    return validate(pl.concat([own, played.select(own.columns).cast(own.schema), extra.select(own.columns).cast(own.schema)]), EVALUATION)
