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

Evaluation (`evaluate_team`), on the held-out problems, without hints:
- Solver `accuracy`: fraction of `samples` x `problems` sampled answers that are right;
- Solver `accuracy_greedy`: one greedy answer per problem;
- Solver `accuracy_hint`: as `accuracy` with the prompt-augmentation hint shown (what the hint
  buys); not measured when no held-out problem has a hint;
- Verifier `verdict_accuracy`: the Verifier judges each sampled Solver answer; right when its
  verdict (yes/no) matches the answer's correctness (an unparsable verdict is wrong);
- Verifier `verdict_balanced_accuracy`: the mean of its verdict accuracy on right answers and on
  wrong answers (saying "yes" to everything scores 50%); only when both kinds of answers occur;
- Verifier `verdict_balanced_accuracy_greedy`: the same with its likelier verdict (greedy);
- Verifier `approve_rate`: fraction of Solver answers it approves;
- Solver `accuracy_approved`: accuracy of the Solver answers the Verifier approved.
Answers are scored and verdicts parsed as in the rollouts: guarded (`pipeline.rollout.rewards`) and
with the one correctness rule `is_correct`.

Budget-matched baselines (`pipeline.rollout.baselines`): the single agent is the Solver alone
(`single`); its answers compare by the number the reward reads (or the task's `answer_key`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import partial
from typing import ClassVar, Mapping, Sequence

import polars as pl

from pipeline.rollout.agent import SHARED_POLICY, Agent
from pipeline.workflows.math.orchestra import FEEDBACK_TURNS, SOLVER, VERIFIER, MathOrchestra, Utterance, default_agents, solver_view, verifier_view
from pipeline.errors import ConfigError
from pipeline.models.chat import encode_prompt
from pipeline.rollout.rewards import Outcome, is_correct, parse_verdicts, score_attempts, verifier_local_reward
from pipeline.tasks.answers import last_number
from pipeline.tasks.base import budget_of
from pipeline.strategies import Feedback, PromptAug
from pipeline.types import GenerateCall, Problem, Sampler, generate_calls
from schemas import EVALUATION, validate
from pipeline.rollout.workflow import Env, StepResult, Workflow, finite_reward

__all__ = ["MathWorkflow", "SingleWorkflow", "MathEnv", "evaluate_team"]


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
        return evaluate_team(self.task, self.agents, samplers, tokenizers, config, round_)

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


def _correct(task, problems: Sequence[Problem], texts: Sequence[Sequence[str]], timeout: float | None) -> list[list[bool]]:
    """Per problem, whether each text is a right answer (guarded reward, the one correctness rule)."""
    items = [(p, t) for p, per in zip(problems, texts) for t in per]
    flat = iter(is_correct(o) for o in score_attempts(task, items, timeout))
    return [[next(flat) for _ in per] for per in texts]


def _sample_texts(sampler: Sampler, tokenizer, passes: Sequence[tuple[Sequence, int, float, int, int]]) -> list[list[list[str]]]:
    """The texts of independent sampling passes (messages, n, temperature, max_tokens, seed), in
    order, run together where the engine batches calls (`generate_calls`)."""
    calls = [GenerateCall([encode_prompt(tokenizer, m) for m in messages], n, temperature, max_tokens, seed) for messages, n, temperature, max_tokens, seed in passes]
    return [[[s.text for s in per_prompt] for per_prompt in out] for out in generate_calls(sampler, calls)]


def evaluate_team(
    task,
    agents: Sequence,
    samplers: Mapping[str, Sampler],
    tokenizers: Mapping[str, object],
    config: EvalConfig,
    round_: int,
    problems: Sequence[Problem] | None = None,
) -> pl.DataFrame:
    """The `evaluation` rows of one round. `samplers`/`tokenizers` map policy_id -> engine/tokenizer
    (loaded with that round's checkpoints)."""
    solver = next((a for a in agents if a.role == SOLVER), None)
    verifier = next((a for a in agents if a.role == VERIFIER), None)
    if solver is None:
        raise ConfigError(f"evaluate_team needs an agent with role {SOLVER!r}")
    problems = list(problems) if problems is not None else task.problems("heldout", config.problems, config.seed)
    config = replace(config, max_tokens=budget_of(task, config.max_tokens, "eval"))
    rows: list[dict] = []

    def add(agent, metric: str, value: float, n: int) -> None:
        rows.append(
            {"round": round_, "policy_id": agent.policy_id, "agent_id": agent.agent_id, "split": "heldout", "metric": metric, "value": float(value), "n": int(n)}
        )

    texts, correct = _solver_metrics(task, problems, samplers[solver.policy_id], tokenizers[solver.policy_id], config, partial(add, solver))
    if verifier is not None:
        v_sampler, v_tok = samplers[verifier.policy_id], tokenizers[verifier.policy_id]
        _verifier_metrics(task, problems, texts, correct, v_sampler, v_tok, config, partial(add, verifier), partial(add, solver))
    df = pl.DataFrame(rows, schema={"round": pl.Int32, "policy_id": pl.String, "agent_id": pl.String, "split": pl.String, "metric": pl.String, "value": pl.Float64, "n": pl.Int64})
    return validate(df, EVALUATION)


def _solver_metrics(task, problems: list[Problem], sampler: Sampler, tokenizer, config: EvalConfig, add) -> tuple[list[list[str]], list[list[bool]]]:
    """The Solver's `accuracy` (sampled), `accuracy_greedy` and `accuracy_hint` (with the
    problems' hints shown, when `config.hint` and they have any), added with `add(metric, value,
    n)`; returns the sampled answers and whether each is right (what the Verifier judges)."""
    plain = [task.solver_messages(p) for p in problems]
    hint = config.hint and any(p.hint for p in problems)  # without hints the prompts are the plain ones
    passes = [(plain, config.samples, config.temperature, config.max_tokens, config.seed)]
    if config.greedy:
        passes.append((plain, 1, 0.0, config.max_tokens, config.seed))
    if hint:
        aug = PromptAug()
        hinted = [aug.augment(m, p) for m, p in zip(plain, problems)]
        passes.append((hinted, config.samples, config.temperature, config.max_tokens, config.seed + 1))
    outs = iter(_sample_texts(sampler, tokenizer, passes))
    texts = next(outs)
    correct = _correct(task, problems, texts, config.reward_timeout)
    flat = [c for per in correct for c in per]
    add("accuracy", sum(flat) / len(flat), len(flat))
    if config.greedy:
        ok = [per[0] for per in _correct(task, problems, next(outs), config.reward_timeout)]
        add("accuracy_greedy", sum(ok) / len(ok), len(ok))
    if hint:
        hflat = [c for per in _correct(task, problems, next(outs), config.reward_timeout) for c in per]
        add("accuracy_hint", sum(hflat) / len(hflat), len(hflat))
    return texts, correct


def _verifier_metrics(task, problems, texts, correct, sampler: Sampler, tokenizer, config: EvalConfig, add, add_solver) -> None:
    """The Verifier judging every sampled Solver answer: its `verdict_accuracy`,
    `verdict_balanced_accuracy` (sampled and, with `greedy`, the same answers judged with the
    likelier verdict: how well it discriminates, without sampling noise) and `approve_rate`
    (`add`), and the Solver's `accuracy_approved`, its accuracy on the answers approved
    (`add_solver`)."""
    pairs = [(p, t, c) for p, per, cs in zip(problems, texts, correct) for t, c in zip(per, cs)]
    vmsgs = [verifier_view(task, p, t) for p, t, _ in pairs]
    vpasses = [(vmsgs, 1, config.temperature, config.max_tokens, config.seed + 2)]
    if config.greedy:
        vpasses.append((vmsgs, 1, 0.0, config.max_tokens, config.seed + 2))
    vouts = _sample_texts(sampler, tokenizer, vpasses)
    parsed, right, balanced = _judge(task, vouts[0], pairs, config.reward_timeout)
    approved = [v is True for v in parsed]
    add("verdict_accuracy", sum(right) / len(right), len(right))
    if balanced is not None:
        add("verdict_balanced_accuracy", balanced, len(right))
    if config.greedy:
        _, _, balanced_greedy = _judge(task, vouts[1], pairs, config.reward_timeout)
        if balanced_greedy is not None:
            add("verdict_balanced_accuracy_greedy", balanced_greedy, len(right))
    add("approve_rate", sum(approved) / len(approved), len(approved))
    n_app = sum(approved)
    if n_app:
        acc_app = sum(c for a, (_, _, c) in zip(approved, pairs) if a) / n_app
        add_solver("accuracy_approved", acc_app, n_app)


def _judge(task, verdicts: Sequence[Sequence[str]], pairs, timeout: float | None) -> tuple[list[bool | None], list[bool], float | None]:
    """The Verifier's parsed verdicts on every (problem, answer, right) pair, which were right,
    and the balanced accuracy (None unless there are right and wrong answers)."""
    truth = [c for _, _, c in pairs]
    parsed = [o.value if o.ok else None for o in parse_verdicts(task, [v[0] for v in verdicts], timeout, [t for _, t, _ in pairs])]
    right = [v is not None and v == c for v, c in zip(parsed, truth)]
    on_right = [r for r, c in zip(right, truth) if c]
    on_wrong = [r for r, c in zip(right, truth) if not c]
    balanced = (sum(on_right) / len(on_right) + sum(on_wrong) / len(on_wrong)) / 2 if on_right and on_wrong else None
    return parsed, right, balanced
