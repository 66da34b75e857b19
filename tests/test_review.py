"""`math_review`: the Verifier reads the Solver's answer, is rewarded for a right verdict, the
deployed loop keeps the first answer unless a retry is approved, and the Verifier is judged on a
fixed, balanced set of right answers and near misses."""

from __future__ import annotations

import random

import polars as pl
import pytest

from fakes import FakeSampler, FakeTask
from pipeline.errors import ConfigError
from pipeline.rollout.evaluation import EvalConfig
from pipeline.strategies import IID
from pipeline.tasks.arithmetic import ArithmeticTask
from pipeline.tasks.prompts import ARITHMETIC_PROMPTS
from pipeline.workflows import load_workflow
from pipeline.workflows.math.review import ReviewWorkflow, balanced_review_set, confirms, deployed_outcomes, evaluate_review, final_attempt, near_miss


@pytest.fixture
def workflow() -> ReviewWorkflow:
    return ReviewWorkflow()


def episode(workflow, turns: list[tuple[str, str]]):
    """An episode of 12+34= (answer 46) played by `turns` ((role, text), in order)."""
    env = workflow.reset(workflow.task.make_problem(12, "+", 34), IID(group_size=1))
    results = [env.step(workflow.solver_id if role == "solver" else workflow.verifier_id, text) for role, text in turns]
    return env, results


def test_the_name_resolves_and_the_verifier_prompt_shows_the_solvers_answer(workflow):
    assert isinstance(load_workflow("math_review"), ReviewWorkflow)
    env, _ = episode(workflow, [("solver", "47")])
    shown = " ".join(m["content"] for m in env.observe(workflow.verifier_id))
    assert "12+34=" in shown and "Proposed answer: 47" in shown
    env, _ = episode(workflow, [("solver", "47"), ("verifier", "46 no"), ("solver", "58")])
    shown = " ".join(m["content"] for m in env.observe(workflow.verifier_id))
    assert "Proposed answer: 58" in shown and "47" not in shown  # the attempt being judged, not the first


def test_after_a_rejection_the_solver_is_told_its_answer_was_wrong(workflow):
    env, _ = episode(workflow, [("solver", "47"), ("verifier", "46 no")])
    retry = env.observe(workflow.solver_id)
    assert [m["content"] for m in retry[-2:]] == ["47", "That is wrong. Try again."]
    assert "46 no" not in " ".join(m["content"] for m in retry)  # words it was warm-started on, not a message it never saw


def test_a_blind_verifier_prompt_is_refused():
    with pytest.raises(ConfigError, match="does not show the Solver's answer"):
        ReviewWorkflow(task=ArithmeticTask(prompts=ARITHMETIC_PROMPTS))


@pytest.mark.parametrize(
    "answer, verdict, reward, approved",
    [
        ("46", "46 yes", 1.0, True),   # a right answer passed
        ("46", "46 no", 0.0, False),   # a right answer rejected
        ("47", "46 no", 1.0, False),   # a wrong answer caught
        ("47", "47 yes", 0.0, True),   # a wrong answer passed
        ("47", "47", 0.0, None),       # no verdict word: unparsable, no reward, a rejection
    ],
)
def test_the_verifier_is_rewarded_for_a_right_verdict_and_the_solver_for_a_right_answer(workflow, answer, verdict, reward, approved):
    env, (solver, judged) = episode(workflow, [("solver", answer), ("verifier", verdict)])
    assert solver.reward == (1.0 if answer == "46" else 0.0)
    assert judged.reward == reward and judged.verdict is approved
    assert judged.done is (approved is True)  # an approval stops; anything else is a retry


@pytest.mark.parametrize(
    "verdicts, final",
    [((), 0), ((True,), 0), ((False,), 0), ((False, True), 1), ((False, False), 0), ((False, None), 0), ((None, True), 1), ((False, False, True), 2), ((True, True), 0)],
)
def test_the_final_answer_is_the_first_approved_else_the_first(verdicts, final):
    assert final_attempt(verdicts) == final


@pytest.mark.parametrize(
    "verdicts, confirmed, final",
    [((False, True), (False, True), 1), ((False, True), (False, False), 0), ((True,), (False,), 0),
     ((False, True, True), (False, False, True), 2), ((False, None), (False, False), 0)],
)
def test_a_retry_needs_a_confirmed_approval(verdicts, confirmed, final):
    assert final_attempt(verdicts, confirmed) == final


def test_an_approval_confirms_when_the_verifier_writes_the_answers_number():
    assert confirms("46 yes", "46") and confirms("46 yes", "The answer is 46.") and confirms("so 1,046. Verdict: yes", "#### 1046")
    assert not confirms("45 yes", "46") and not confirms("yes", "46") and not confirms("46 yes", "no number")


@pytest.mark.parametrize(
    "turns, team",
    [
        ([("solver", "46"), ("verifier", "46 yes")], 1.0),
        ([("solver", "47"), ("verifier", "47 yes")], 0.0),
        # rejected twice: the first answer stands, right or wrong, whatever the retry was
        ([("solver", "46"), ("verifier", "46 no"), ("solver", "45"), ("verifier", "46 no")], 1.0),
        ([("solver", "47"), ("verifier", "46 no"), ("solver", "46"), ("verifier", "hmm")], 0.0),
        # a retry replaces it only when approved
        ([("solver", "47"), ("verifier", "46 no"), ("solver", "46"), ("verifier", "46 yes")], 1.0),
        ([("solver", "46"), ("verifier", "46 no"), ("solver", "45"), ("verifier", "45 yes")], 0.0),
        # an approval whose sum is another number does not replace it
        ([("solver", "46"), ("verifier", "46 no"), ("solver", "45"), ("verifier", "46 yes")], 1.0),
        ([("solver", "47"), ("verifier", "46 no"), ("solver", "46"), ("verifier", "yes")], 0.0),
    ],
)
def test_the_team_reward_is_the_final_answers(workflow, turns, team):
    env, results = episode(workflow, turns)
    assert results[-1].done
    assert env.team_reward() == team
    assert env.copy().team_reward() == team  # a tree branch keeps the verdicts
    steps = pl.DataFrame(
        [{"traj_uid": "t", "agent_id": role, "turn": i // 2, "local_reward": r.reward, "verdict": r.verdict, "completion_text": text}
         for i, ((role, text), r) in enumerate(zip(turns, results))]
    )
    assert deployed_outcomes(steps, "solver", "verifier")["confirmed"].to_list() == [team == 1.0]


def test_without_confirmation_any_approved_retry_counts():
    plain = ReviewWorkflow(confirm=False)
    env, _ = episode(plain, [("solver", "46"), ("verifier", "46 no"), ("solver", "45"), ("verifier", "46 yes")])
    assert env.team_reward() == 0.0


def test_the_balanced_set_has_200_of_each_class_fixed_by_seed():
    task = ReviewWorkflow().task
    pairs = balanced_review_set(task)
    right = [p for p in pairs if p.right]
    wrong = [p for p in pairs if not p.right]
    assert len(right) >= 200 and len(wrong) >= 200 and len(right) == len(wrong)
    assert all(p.problem.split == "heldout" for p in pairs)
    assert all(task.reward(p.problem, p.answer) == (1.0 if p.right else 0.0) for p in pairs)
    kinds = {p.kind for p in wrong}
    assert kinds == {"carry", "digit"} and sum(p.kind == "carry" for p in wrong) >= 50
    assert balanced_review_set(task) == pairs  # fixed by its seed
    assert balanced_review_set(task, seed=1) != pairs


def test_near_misses_drop_one_carry_or_change_one_digit():
    task = ArithmeticTask()
    rng = random.Random(0)
    p = task.make_problem(39, "+", 81)  # 120: carries out of the units and out of the tens
    assert {near_miss(p, rng, "carry") for _ in range(40)} == {110, 20}
    q = task.make_problem(12, "+", 34)  # 46: no carry to drop, so one digit off
    for _ in range(40):
        wrong = str(near_miss(q, rng, "carry"))
        assert wrong != "46" and len(wrong) == 2 and sum(x != y for x, y in zip(wrong, "46")) == 1
    d = task.make_problem(52, "-", 17)  # 35: a borrow from the tens; dropped, 45
    assert near_miss(d, rng, "carry") == 45


def test_the_evaluation_plays_the_deployed_loop_and_judges_the_balanced_set():
    sampler = FakeSampler(solver_accuracy=0.5, verifier_accuracy=0.8, garbage=0.0, hint_bonus=0.0)
    workflow = ReviewWorkflow(task=FakeTask(), review_set_size=100, confirm=False)  # the fake says a bare yes/no
    cfg = EvalConfig(problems=30, samples=2, max_tokens=32)
    df = evaluate_review(workflow, {"shared": sampler}, {"shared": sampler.tokenizer}, cfg, round_=3)
    m = {(a, k): (v, n) for a, k, v, n in df.select("agent_id", "metric", "value", "n").iter_rows()}
    assert set(df["round"]) == {3}
    for key in [("solver", "accuracy"), ("solver", "first_answer_accuracy"), ("team", "success"), ("team", "fixed"), ("team", "broken"),
                ("team", "success_approved_rule"), ("team", "success_confirmed_rule"), ("verifier", "review_balanced_accuracy"), ("verifier", "review_balanced_accuracy_greedy"), ("verifier", "review_accuracy_wrong")]:
        assert key in m, key
    assert m[("verifier", "review_balanced_accuracy")][1] == 200
    assert 0.65 < m[("verifier", "review_balanced_accuracy")][0] < 0.95  # the fake judges right 80% of the time
    success, first = m[("team", "success")][0], m[("solver", "first_answer_accuracy")][0]
    fixed, broken = m[("team", "fixed")][0], m[("team", "broken")][0]
    assert success == pytest.approx(first + fixed - broken)
    assert fixed > broken  # a Verifier better than chance can only help on balance
    assert m[("team", "success_approved_rule")][0] == success
    assert m[("team", "success_confirmed_rule")][0] == first  # a bare "yes" never confirms a retry


def test_options_are_checked():
    with pytest.raises(ConfigError, match="review_set_size"):
        ReviewWorkflow(review_set_size=0)
    with pytest.raises(ConfigError, match="confirm"):
        ReviewWorkflow(confirm="yes")


def test_a_near_miss_reads_the_answer_as_the_checker_does_and_refuses_a_non_integer():
    import random

    from pipeline.errors import ConfigError
    from pipeline.types import Problem
    from pipeline.workflows.math.review_set import near_miss

    for answer in ("42.0", "#### 42", "42"):
        wrong = near_miss(Problem("u", "19+23=", answer), random.Random(0), "digit")
        assert isinstance(wrong, int) and wrong != 42
    with pytest.raises(ConfigError, match="not an integer"):
        near_miss(Problem("u", "what is half of 3?", "1.5"), random.Random(0), "digit")
