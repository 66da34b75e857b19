"""Held-out evaluation: the rollouts' correctness rule and guarded reward calls, and the
Verifier's balanced verdict accuracy."""

from __future__ import annotations

import polars as pl
import pytest

from fakes import FakeSampler, FakeTask
from pipeline.workflows.math.orchestra import default_agents
from pipeline.rollout.evaluation import EvalConfig
from pipeline.workflows.math import evaluate_team
from pipeline.rollout.rewards import CORRECT_THRESHOLD, Outcome, is_correct


def metrics(df: pl.DataFrame) -> dict[str, float]:
    return dict(zip(df["metric"], df["value"]))


def evaluate(task, sampler, **config):
    tok = sampler.tokenizer
    cfg = EvalConfig(problems=40, samples=2, max_tokens=32, **config)
    return metrics(evaluate_team(task, default_agents(), {"shared": sampler}, {"shared": tok}, cfg, round_=0))


def test_is_correct_is_the_one_rule():
    assert is_correct(Outcome(1.0)) and is_correct(Outcome(CORRECT_THRESHOLD))
    assert not is_correct(Outcome(0.0)) and not is_correct(Outcome(None, "raised")) and not is_correct(Outcome(None))


class HalfCreditTask(FakeTask):
    """A partial-credit reward of 0.5 for a right answer: correct under the one rule (>= 0.5),
    though an evaluation with its own rule (>= 1.0) would count it wrong."""

    def reward(self, problem, completion_text):
        return 0.5 * super().reward(problem, completion_text)


def test_evaluation_uses_the_rollouts_correctness_rule():
    full = evaluate(FakeTask(), FakeSampler(solver_accuracy=0.6))
    half = evaluate(HalfCreditTask(), FakeSampler(solver_accuracy=0.6))
    assert full["accuracy"] == half["accuracy"] > 0.3
    assert full["accuracy_greedy"] == half["accuracy_greedy"]


class RaisingTask(FakeTask):
    def reward(self, problem, completion_text):
        if problem.uid.endswith("-3"):
            raise RuntimeError("reward crashed")
        return super().reward(problem, completion_text)

    def parse_verdict(self, text):
        if text.startswith("no"):
            raise ValueError("parser crashed")
        return super().parse_verdict(text)


def test_a_raising_reward_or_parser_is_an_unscored_answer_not_a_dead_evaluation():
    m = evaluate(RaisingTask(), FakeSampler(solver_accuracy=1.0, hint_bonus=0.0, garbage=0.0))
    # one problem of 40 raises: its answers count wrong, the rest are right
    assert m["accuracy"] == pytest.approx(39 / 40)
    assert 0.0 <= m["verdict_accuracy"] <= 1.0


def test_balanced_verdict_accuracy_is_robust_to_the_base_rate():
    # a Verifier that always says yes: 50% balanced, whatever the Solver's accuracy
    class YesSampler(FakeSampler):
        def _sample(self, prompt, rng, max_tokens):
            s = super()._sample(prompt, rng, max_tokens)
            if "Verify the proposed answer." in prompt.rsplit("\x02", 1)[-1]:
                from pipeline.types import Sample

                ids = self.tokenizer.encode("yes") + [0]
                return Sample(token_ids=ids, logprobs=[-0.1] * len(ids), text="yes", finish_reason="stop")
            return s

    m = evaluate(FakeTask(), YesSampler(solver_accuracy=0.8, garbage=0.0))
    assert m["approve_rate"] == 1.0
    assert m["verdict_accuracy"] == pytest.approx(m["accuracy"])  # right exactly on the right answers
    assert m["verdict_balanced_accuracy"] == pytest.approx(0.5)
    # a perfect checker: 100% balanced
    perfect = evaluate(FakeTask(), FakeSampler(solver_accuracy=0.5, verifier_accuracy=1.0, garbage=0.0))
    assert perfect["verdict_balanced_accuracy"] == pytest.approx(1.0)


def test_greedy_balanced_verdict_accuracy_judges_the_same_answers_with_the_likelier_verdict():
    """The greedy column judges the T=1 answers again at temperature 0: an always-yes Verifier
    scores 50% there too, a perfect one 100%; with `greedy=False` it is not computed."""
    perfect = evaluate(FakeTask(), FakeSampler(solver_accuracy=0.5, verifier_accuracy=1.0, garbage=0.0))
    assert perfect["verdict_balanced_accuracy_greedy"] == pytest.approx(1.0)
    noisy = evaluate(FakeTask(), FakeSampler(solver_accuracy=0.5, verifier_accuracy=0.7, garbage=0.0))
    assert 0.0 <= noisy["verdict_balanced_accuracy_greedy"] <= 1.0
    assert "verdict_balanced_accuracy_greedy" not in evaluate(FakeTask(), FakeSampler(solver_accuracy=0.5), greedy=False)


class HintlessTask(FakeTask):
    """FakeTask's problems without their hints (a task file without a hint column)."""

    def problems(self, split, n, seed):
        from dataclasses import replace

        return [replace(p, hint=None) for p in super().problems(split, n, seed)]


def test_accuracy_hint_is_measured_only_when_problems_have_hints():
    hinted_sampler, plain_sampler = FakeSampler(solver_accuracy=0.5), FakeSampler(solver_accuracy=0.5)
    hinted = evaluate(FakeTask(), hinted_sampler)
    plain = evaluate(HintlessTask(), plain_sampler)
    assert "accuracy_hint" in hinted and "accuracy_hint" not in plain
    assert {"accuracy", "accuracy_greedy", "verdict_accuracy"} <= set(plain)
    # the hint's engine call (2 samples per problem at the sampling temperature) is the one skipped
    assert len(plain_sampler.calls) == len(hinted_sampler.calls) - 1


def test_a_batching_engine_evaluates_in_two_batches_with_the_same_metrics():
    """The Solver's sampled, greedy and hinted passes go to a batching engine as one batch, the
    Verifier's sampled and greedy verdicts as another; the metrics are those of one call at a time."""

    class Batching(FakeSampler):
        def generate_calls(self, calls):
            self.batches = getattr(self, "batches", []) + [[(c.n, c.temperature) for c in calls]]
            return [self.generate(*c) for c in calls]

    plain_sampler, batching = FakeSampler(solver_accuracy=0.5), Batching(solver_accuracy=0.5)
    assert evaluate(FakeTask(), batching) == evaluate(FakeTask(), plain_sampler)
    assert batching.batches == [[(2, 1.0), (1, 0.0), (2, 1.0)], [(1, 1.0), (1, 0.0)]]
    assert len(plain_sampler.calls) == 5


class ArithmeticSampler(FakeSampler):
    """The arithmetic task's roles: the Solver answers "a+b=" right with probability
    `solver_accuracy`; the blind Verifier ("Check it: work it out again.") writes the sum, right
    with probability `verifier_accuracy`, else one off."""

    def _sample(self, prompt, rng, max_tokens):
        import re

        from fakes import END, ROLE_MARK
        from pipeline.types import Sample

        last_user = prompt.rsplit(ROLE_MARK["user"], 1)[-1].split(END)[0]
        a, op, b = re.search(r"(\d+)\s*([+-])\s*(\d+)\s*=", last_user).groups()
        x = int(a) + int(b) if op == "+" else int(a) - int(b)
        p = self.verifier_accuracy if "Check it" in last_user else self.solver_accuracy
        text = str(x if rng.random() < p else x + rng.choice([-1, 1]))
        ids = self.tokenizer.encode(text) + [0]
        return Sample(token_ids=ids, logprobs=[-0.5] * len(ids), text=text, finish_reason="stop")


def test_the_math_verifier_is_judged_on_a_fixed_balanced_set_whatever_the_solver_leaves():
    from pipeline.workflows.math import MathWorkflow

    team = MathWorkflow(agents=default_agents(shared_policy=False))
    verifier = ArithmeticSampler(verifier_accuracy=0.7)
    cfg = EvalConfig(problems=40, samples=2, max_tokens=8)
    by_solver = {}
    for acc in (0.3, 0.95):
        solver = ArithmeticSampler(solver_accuracy=acc)
        df = team.evaluate({"solver": solver, "verifier": verifier}, {"solver": solver.tokenizer, "verifier": verifier.tokenizer}, cfg, 0)
        by_solver[acc] = {m: (v, n) for m, v, n in df.filter(pl.col("agent_id") == "verifier").select("metric", "value", "n").iter_rows()}
    low, high = by_solver[0.3], by_solver[0.95]
    # the set: 250 right answers and 250 near misses, the same whatever the Solver answered
    assert low["verdict_set_accuracy_right"][1] == low["verdict_set_accuracy_wrong"][1] == 250
    assert low["verdict_set_balanced_accuracy"][1] == 500
    for metric in ("verdict_set_balanced_accuracy", "verdict_set_balanced_accuracy_greedy", "verdict_set_accuracy_right", "verdict_set_accuracy_wrong"):
        assert low[metric] == high[metric], metric
    # a blind Verifier approves a right answer when its own sum is right, and a near miss only
    # when it makes that same slip
    assert abs(low["verdict_set_accuracy_right"][0] - 0.7) < 0.08
    assert low["verdict_set_accuracy_wrong"][0] > 0.9


def test_the_balanced_set_is_the_arithmetic_tasks_alone():
    from pipeline.workflows.math import MathWorkflow

    sampler = FakeSampler()
    df = MathWorkflow(task=FakeTask()).evaluate({"shared": sampler}, {"shared": sampler.tokenizer}, EvalConfig(problems=20, samples=2, max_tokens=32), 0)
    assert not any(m.startswith("verdict_set") for m in df["metric"])
