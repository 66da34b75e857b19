"""The held-out evaluation of a math team (`evaluate_team`, `MathWorkflow.evaluate`).

On the held-out problems, without hints:
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
Those Verifier metrics rest on the wrong answers the Solver happens to leave, a few dozen once it
is good. `review_set_rows` judges the Verifier on a fixed, balanced set instead (the same right
answers and near misses every round and run; `review_set.balanced_review_set`): `math` reports it
as `verdict_set_*` on the arithmetic task, `math_review` as `review_*`.
Answers are scored and verdicts parsed as in the rollouts: guarded (`pipeline.rollout.rewards`) and
with the one correctness rule `is_correct`.
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from typing import Mapping, Sequence

import polars as pl

from pipeline.config import EvalConfig
from pipeline.errors import ConfigError
from pipeline.models.chat import encode_prompt
from pipeline.rollout.rewards import is_correct, parse_verdicts, score_attempts
from pipeline.strategies import PromptAug
from pipeline.tasks.base import budget_of
from pipeline.types import GenerateCall, Problem, Sampler, generate_calls
from pipeline.workflows.math.orchestra import SOLVER, VERIFIER, verifier_view
from pipeline.workflows.math.review_set import balanced_review_set, review_set_metrics
from schemas import EVALUATION, validate

__all__ = ["evaluate_team", "review_set_rows", "sample_texts", "right_answers"]


def right_answers(task, problems: Sequence[Problem], texts: Sequence[Sequence[str]], timeout: float | None) -> list[list[bool]]:
    """Per problem, whether each text is a right answer (guarded reward, the one correctness rule)."""
    items = [(p, t) for p, per in zip(problems, texts) for t in per]
    flat = iter(is_correct(o) for o in score_attempts(task, items, timeout))
    return [[next(flat) for _ in per] for per in texts]


def sample_texts(sampler: Sampler, tokenizer, passes: Sequence[tuple[Sequence, int, float, int, int]]) -> list[list[list[str]]]:
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
    return validate(pl.DataFrame(rows, schema=_SCHEMA), EVALUATION)


_SET_METRICS = {"balanced": "balanced_accuracy", "right": "accuracy_right", "wrong": "accuracy_wrong", "parsable": "parsable"}
"""`review_set_metrics`' keys -> the metric names' ends (after the prefix)."""

_SCHEMA = {"round": pl.Int32, "policy_id": pl.String, "agent_id": pl.String, "split": pl.String, "metric": pl.String, "value": pl.Float64, "n": pl.Int64}


def review_set_rows(task, verifier, samplers: Mapping[str, Sampler], tokenizers: Mapping[str, object], config: EvalConfig, round_: int,
                    size: int, seed: int, prefix: str) -> pl.DataFrame:
    """The `evaluation` rows of `verifier` judging the fixed, balanced set of `task`
    (`balanced_review_set(task, size, seed)`: `size` held-out problems, each with its right answer
    and with a near miss), sampled at the evaluation's temperature and greedily:
    `<prefix>_balanced_accuracy`, `<prefix>_balanced_accuracy_greedy`, `<prefix>_accuracy_right`,
    `<prefix>_accuracy_wrong` and `<prefix>_parsable` (an unparsable verdict is wrong). The
    Verifier's prompt is the task's, with the proposed answer where the Solver's would be; a
    verdict is read as the rollouts read it (`parse_verdicts`: a task whose verdict reads the
    solution, the blind `math` Verifier, approves when its own answer agrees with the proposed one)."""
    pairs = balanced_review_set(task, size, seed)
    msgs = [verifier_view(task, pr.problem, pr.answer) for pr in pairs]
    budget = budget_of(task, config.max_tokens, "eval")
    passes = [(msgs, 1, config.temperature, budget, config.seed + 3), (msgs, 1, 0.0, budget, config.seed + 3)]
    rows = []
    for suffix, texts in zip(("", "_greedy"), sample_texts(samplers[verifier.policy_id], tokenizers[verifier.policy_id], passes)):
        outcomes = parse_verdicts(task, [t[0] for t in texts], config.reward_timeout, [pr.answer for pr in pairs])
        m = review_set_metrics(task, pairs, [o.value if o.ok else None for o in outcomes])
        for key in ("balanced",) if suffix else _SET_METRICS:
            n = len(pairs) if key in ("balanced", "parsable") else len(pairs) // 2
            rows.append({"round": round_, "policy_id": verifier.policy_id, "agent_id": verifier.agent_id, "split": "heldout",
                         "metric": f"{prefix}_{_SET_METRICS[key]}{suffix}", "value": float(m[key]), "n": n})
    return validate(pl.DataFrame(rows, schema=_SCHEMA), EVALUATION)


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
    outs = iter(sample_texts(sampler, tokenizer, passes))
    texts = next(outs)
    correct = right_answers(task, problems, texts, config.reward_timeout)
    flat = [c for per in correct for c in per]
    add("accuracy", sum(flat) / len(flat), len(flat))
    if config.greedy:
        ok = [per[0] for per in right_answers(task, problems, next(outs), config.reward_timeout)]
        add("accuracy_greedy", sum(ok) / len(ok), len(ok))
    if hint:
        hflat = [c for per in right_answers(task, problems, next(outs), config.reward_timeout) for c in per]
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
    vouts = sample_texts(sampler, tokenizer, vpasses)
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
