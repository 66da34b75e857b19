"""Held-out evaluation of a team: the `evaluation` table (one row per metric).

Every round is evaluated on the same held-out problems (a fixed seed), at the sampling
temperature, without hints, so rounds are comparable:
- Solver `accuracy`: fraction of `samples` x `problems` sampled answers that are right;
- Solver `accuracy_greedy`: one greedy answer per problem;
- Solver `accuracy_hint`: as `accuracy` with the prompt-augmentation hint shown (what the hint buys);
  not measured when no held-out problem has a hint (a task file without a hint column): it would
  sample the same prompts again;
- Verifier `verdict_accuracy`: the Verifier judges each sampled Solver answer; right when its
  verdict (yes/no) matches the answer's correctness (an unparsable verdict is wrong);
- Verifier `verdict_balanced_accuracy`: the mean of its verdict accuracy on right answers and on
  wrong answers (robust to the base rate: saying "yes" to everything scores 50%); only when both
  kinds of answers occur;
- Verifier `verdict_balanced_accuracy_greedy`: the same, judging the same answers with its likelier
  verdict (greedy), i.e. how well it discriminates without the noise of sampling a verdict;
- Verifier `approve_rate`: fraction of Solver answers it approves;
- team `accuracy_approved`: accuracy of the Solver answers the Verifier approved.
Two engine calls per metric family, batched over all problems. Answers are scored and verdicts
parsed exactly as in the rollouts: guarded (`pipeline.rewards`: a raising or hanging task function
gives an unscored answer, counted wrong) and with the one correctness rule `is_correct`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Mapping, Sequence

import polars as pl

from pipeline.errors import ConfigError
from pipeline.models.chat import encode_prompt
from pipeline.rewards import is_correct, parse_verdicts, score_attempts
from pipeline.tasks.base import budget_of
from pipeline.types import Problem, Sampler
from schemas import EVALUATION, validate

__all__ = ["EvalConfig", "evaluate_team"]


@dataclass(frozen=True)
class EvalConfig:
    """What the held-out evaluation samples."""

    problems: int = 200
    """Held-out problems (the same ones every round)."""
    samples: int = 2
    """Solver samples per problem at `temperature` (standard error ~2.5 points at 200 x 2 near 50%)."""
    temperature: float = 1.0
    """Sampling temperature (the rollouts' temperature, so the number reads as what training sees)."""
    max_tokens: int | None = None
    """Completion budget of the Solver and of the Verifier; None = the task's
    (`default_eval_max_tokens`: arithmetic 16, file tasks 512)."""
    seed: int = 20_261_122
    """Seed of the held-out problem draw and of the sampling."""
    hint: bool = True
    """Also measure `accuracy_hint`."""
    reward_timeout: float | None = 10.0
    """Seconds one call of the task's reward or verdict parser may take (as in the rollouts)."""
    greedy: bool = True
    """Also measure `accuracy_greedy`."""

    def __post_init__(self) -> None:
        for name in ("problems", "samples", "max_tokens"):
            v = getattr(self, name)
            if name == "max_tokens" and v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"EvalConfig.{name} must be an integer >= 1, got {v!r}")
        if not (isinstance(self.temperature, (int, float)) and self.temperature > 0):
            raise ConfigError(f"EvalConfig.temperature must be > 0, got {self.temperature!r}")


def _correct(task, problems: Sequence[Problem], texts: Sequence[Sequence[str]], timeout: float | None) -> list[list[bool]]:
    """Per problem, whether each text is a right answer (guarded reward, the one correctness rule)."""
    items = [(p, t) for p, per in zip(problems, texts) for t in per]
    flat = iter(is_correct(o) for o in score_attempts(task, items, timeout))
    return [[next(flat) for _ in per] for per in texts]


def _sample_texts(sampler: Sampler, tokenizer, messages: Sequence, n: int, temperature: float, max_tokens: int, seed: int) -> list[list[str]]:
    prompts = [encode_prompt(tokenizer, m) for m in messages]
    out = sampler.generate(prompts, n=n, temperature=temperature, max_tokens=max_tokens, seed=seed)
    return [[s.text for s in per_prompt] for per_prompt in out]


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
    from pipeline.strategies import PromptAug

    solver = next((a for a in agents if a.role == "solver"), None)
    verifier = next((a for a in agents if a.role == "verifier"), None)
    if solver is None:
        raise ConfigError("evaluate_team needs an agent with role 'solver'")
    problems = list(problems) if problems is not None else task.problems("heldout", config.problems, config.seed)
    config = replace(config, max_tokens=budget_of(task, config.max_tokens, "eval"))
    rows: list[dict] = []

    def add(agent, metric: str, value: float, n: int) -> None:
        rows.append(
            {"round": round_, "policy_id": agent.policy_id, "agent_id": agent.agent_id, "split": "heldout", "metric": metric, "value": float(value), "n": int(n)}
        )

    s_sampler, s_tok = samplers[solver.policy_id], tokenizers[solver.policy_id]
    plain = [task.solver_messages(p) for p in problems]
    texts = _sample_texts(s_sampler, s_tok, plain, config.samples, config.temperature, config.max_tokens, config.seed)
    correct = _correct(task, problems, texts, config.reward_timeout)
    flat = [c for per in correct for c in per]
    add(solver, "accuracy", sum(flat) / len(flat), len(flat))
    if config.greedy:
        greedy = _sample_texts(s_sampler, s_tok, plain, 1, 0.0, config.max_tokens, config.seed)
        ok = [per[0] for per in _correct(task, problems, greedy, config.reward_timeout)]
        add(solver, "accuracy_greedy", sum(ok) / len(ok), len(ok))
    if config.hint and any(p.hint for p in problems):  # without hints the prompts are the plain ones
        aug = PromptAug()
        hinted = [aug.augment(m, p) for m, p in zip(plain, problems)]
        htexts = _sample_texts(s_sampler, s_tok, hinted, config.samples, config.temperature, config.max_tokens, config.seed + 1)
        hflat = [c for per in _correct(task, problems, htexts, config.reward_timeout) for c in per]
        add(solver, "accuracy_hint", sum(hflat) / len(hflat), len(hflat))

    if verifier is not None:
        v_sampler, v_tok = samplers[verifier.policy_id], tokenizers[verifier.policy_id]
        pairs = [(p, t, c) for p, per, cs in zip(problems, texts, correct) for t, c in zip(per, cs)]
        vmsgs = [verifier.verifier_view(task, p, t) for p, t, _ in pairs]
        truth = [c for _, _, c in pairs]

        def judge(temperature: float, seed: int) -> tuple[list[bool | None], list[bool], float | None]:
            """The Verifier's parsed verdicts on every pair, which were right, and the balanced accuracy."""
            verdicts = _sample_texts(v_sampler, v_tok, vmsgs, 1, temperature, config.max_tokens, seed)
            parsed = [o.value if o.ok else None for o in parse_verdicts(task, [v[0] for v in verdicts], config.reward_timeout, [t for _, t, _ in pairs])]
            right = [v is not None and v == c for v, c in zip(parsed, truth)]
            on_right = [r for r, c in zip(right, truth) if c]
            on_wrong = [r for r, c in zip(right, truth) if not c]
            balanced = (sum(on_right) / len(on_right) + sum(on_wrong) / len(on_wrong)) / 2 if on_right and on_wrong else None
            return parsed, right, balanced

        parsed, right, balanced = judge(config.temperature, config.seed + 2)
        approved = [v is True for v in parsed]
        add(verifier, "verdict_accuracy", sum(right) / len(right), len(right))
        if balanced is not None:
            add(verifier, "verdict_balanced_accuracy", balanced, len(right))
        if config.greedy:
            # the same answers judged with the likelier verdict: how well it discriminates, without sampling noise
            _, _, balanced_greedy = judge(0.0, config.seed + 2)
            if balanced_greedy is not None:
                add(verifier, "verdict_balanced_accuracy_greedy", balanced_greedy, len(right))
        add(verifier, "approve_rate", sum(approved) / len(approved), len(approved))
        n_app = sum(approved)
        if n_app:
            acc_app = sum(c for a, (_, _, c) in zip(approved, pairs) if a) / n_app
            add(solver, "accuracy_approved", acc_app, n_app)
    df = pl.DataFrame(rows, schema={"round": pl.Int32, "policy_id": pl.String, "agent_id": pl.String, "split": pl.String, "metric": pl.String, "value": pl.Float64, "n": pl.Int64})
    return validate(df, EVALUATION)
