import math
import threading
import time

import pytest

from pipeline.rollout.rewards import (
    Outcome,
    mixed_reward,
    parse_verdicts,
    row_reward,
    safe_map,
    score_attempts,
    verifier_local_reward,
)
from pipeline.types import Problem


def test_safe_map_returns_values_in_order():
    out = safe_map(lambda x: x * 2, [(i,) for i in range(100)], timeout=5.0)
    assert [o.value for o in out] == [i * 2 for i in range(100)]
    assert all(o.ok for o in out)


@pytest.mark.parametrize("timeout", [None, 5.0])
def test_safe_map_turns_exceptions_into_errors(timeout):
    def fn(x):
        if x == 1:
            raise RuntimeError("boom")
        return x

    out = safe_map(fn, [(0,), (1,), (2,)], timeout=timeout)
    assert [o.value for o in out] == [0, None, 2]
    assert out[1].error == "RuntimeError: boom"
    assert out[0].ok and out[2].ok


def test_safe_map_times_out_one_call_and_goes_on():
    release = threading.Event()

    def fn(x):
        if x == 1:
            release.wait(10)
        return x

    out = safe_map(fn, [(0,), (1,), (2,), (3,)], timeout=1.0, label="reward")
    release.set()
    # the hung call's value (1, after the wait) is not there: the batch went on without it
    assert [o.value for o in out] == [0, None, 2, 3]
    assert out[1].error == "reward timed out after 1s"


def test_safe_map_timeout_is_per_call_not_per_batch():
    out = safe_map(lambda x: time.sleep(0.05) or x, [(i,) for i in range(6)], timeout=0.15)
    assert [o.value for o in out] == list(range(6))


class _Task:
    def __init__(self, fn):
        self.fn = fn
        self.calls = 0

    def reward(self, problem, text):
        self.calls += 1
        return self.fn(problem, text)

    def parse_verdict(self, text):
        return self.fn(None, text)


P = Problem(uid="p", question="q", answer="1")


@pytest.mark.parametrize(
    "value, error",
    [
        (float("nan"), "reward returned nan"),
        (float("inf"), "reward returned inf"),
        (None, "reward returned None"),
        ("x", "reward returned str, expected a number"),
        ("1.0", "reward returned str, expected a number"),
    ],
)
def test_score_attempts_rejects_bad_values(value, error):
    [out] = score_attempts(_Task(lambda p, t: value), [(P, "a")], timeout=1.0)
    assert out.value is None and out.error == error


def test_score_attempts_accepts_booleans_and_numpy_scalars():
    import numpy as np

    out = score_attempts(_Task(lambda p, t: {"a": True, "b": np.float32(0.5)}[t]), [(P, "a"), (P, "b")], timeout=1.0)
    assert [o.value for o in out] == [1.0, 0.5]
    assert all(type(o.value) is float for o in out)


def test_score_attempts_scores_each_distinct_pair_once():
    task = _Task(lambda p, t: 1.0 if t == "1" else 0.0)
    out = score_attempts(task, [(P, "1"), (P, "2"), (P, "1"), (P, "1")], timeout=1.0)
    assert [o.value for o in out] == [1.0, 0.0, 1.0, 1.0]
    assert task.calls == 2


def test_parse_verdicts_rejects_non_boolean():
    out = parse_verdicts(_Task(lambda p, t: {"y": True, "n": False, "?": None}.get(t, "maybe")), ["y", "n", "?", "z"], timeout=1.0)
    assert [o.value for o in out] == [True, False, None, None]
    assert [o.ok for o in out] == [True, True, True, False]
    assert "expected True, False or None" in out[3].error


@pytest.mark.parametrize(
    "verdict, judged, expected",
    [
        (True, 1.0, 1.0),
        (False, 0.0, 1.0),
        (True, 0.0, 0.0),
        (False, 1.0, 0.0),
        (None, 1.0, 0.0),
        (None, 0.0, 0.0),
    ],
)
def test_verifier_local_reward(verdict, judged, expected):
    assert verifier_local_reward(Outcome(verdict), Outcome(judged)).value == expected


def test_verifier_local_reward_is_null_when_its_inputs_failed():
    out = verifier_local_reward(Outcome(True), Outcome(None, "reward timed out after 1s"))
    assert out.value is None and "judged attempt: reward timed out" in out.error
    out = verifier_local_reward(Outcome(None, "ValueError: x"), Outcome(1.0))
    assert out.value is None and out.error == "verdict: ValueError: x"


def test_row_reward_mixes_and_propagates_nulls():
    assert mixed_reward(0.5, 1.0, 1.0) == 1.5
    assert mixed_reward(0.5, None, 1.0) is None
    r = row_reward(2.0, Outcome(1.0), Outcome(0.0))
    assert (r.global_reward, r.local_reward, r.reward, r.reward_error) == (1.0, 0.0, 2.0, None)
    r = row_reward(2.0, Outcome(None, "E1"), Outcome(1.0))
    assert r.global_reward is None and r.local_reward == 1.0 and r.reward is None
    assert r.reward_error == "global_reward: E1"
    r = row_reward(2.0, Outcome(None, "E1"), Outcome(None, "E2"))
    assert r.reward_error == "global_reward: E1; local_reward: E2"
    assert not math.isnan(row_reward(1.0, Outcome(0.0), Outcome(0.0)).reward)


def test_a_hanging_or_raising_file_task_reward_is_null_with_a_named_error(tmp_path, monkeypatch):
    """The file task's answer check (math-verify) runs under the rollouts' guard: a check that
    hangs past the timeout or raises gives a null reward and a `reward_error`, the rest go on."""
    import json

    from pipeline.tasks import files, load_task_file

    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"question": "Half of one?", "answer": "\\frac{1}{2}"}) + "\n")
    task = load_task_file(path)
    [p] = task.problems("train", 1, 0) or task.problems("heldout", 1, 0)

    def check(reference, text):
        if text == "hang":
            time.sleep(10)
        if text == "boom":
            raise RecursionError("sympy went too deep")
        return text == "1/2"

    monkeypatch.setattr(files, "math_verify_equal", check)
    out = score_attempts(task, [(p, "hang"), (p, "boom"), (p, "1/2"), (p, "3")], timeout=1.0)
    assert [o.value for o in out] == [None, None, 1.0, 0.0]
    assert out[0].error == "reward timed out after 1s"
    assert out[1].error == "RecursionError: sympy went too deep"


@pytest.mark.parametrize(
    "reply, solution, expected",
    [
        ("168", "168", True),  # the Verifier's own answer equals the proposal: approve
        ("167", "168", False),  # another number: reject
        (" 168\n", "The sum is 168.", True),  # the solution's answer is its last number
        ("#### 12", "so 5 + 7 = 12\n#### 12", True),  # a "####" line wins on both sides
        ("12", "#### 13", False),
        ("yes", "168", None),  # no number of its own: unparsable, as a yes/no reply is here
        ("168", "I don't know", False),  # a proposal without an answer is never approved
    ],
)
def test_a_compare_verdict_is_whether_the_verifiers_own_answer_equals_the_proposal(reply, solution, expected):
    from pipeline.tasks.prompts import parse_compared_verdict

    assert parse_compared_verdict(reply, solution) is expected


def test_the_arithmetic_verifier_checks_by_solving_again():
    from pipeline.tasks.arithmetic import ArithmeticTask

    task = ArithmeticTask()
    [p] = task.problems("train", 1, seed=3)
    assert task.verdict_reads_solution
    assert task.parse_verdict(p.answer, p.answer) is True
    assert task.parse_verdict(str(int(p.answer) + 1), p.answer) is False
    out = parse_verdicts(task, [p.answer, str(int(p.answer) + 10)], timeout=None, solutions=[p.answer, p.answer])
    assert [o.value for o in out] == [True, False]
    with pytest.raises(ValueError, match="judged solutions"):
        parse_verdicts(task, [p.answer], timeout=None)


@pytest.mark.parametrize(
    "verdict, judged, own, expected",
    [
        (True, 1.0, 1.0, 1.0),  # approved a right answer by working it out right
        (False, 0.0, 1.0, 1.0),  # rejected a wrong answer, its own answer right
        (False, 0.0, 0.0, 0.0),  # rejected a wrong answer with another wrong answer: not rewarded
        (True, 0.0, 0.0, 0.0),  # agreed with a wrong answer
        (False, 1.0, 0.0, 0.0),  # rejected a right answer
    ],
)
def test_a_verifier_that_solves_again_is_rewarded_for_a_right_verdict_from_a_right_answer(verdict, judged, own, expected):
    assert verifier_local_reward(Outcome(verdict), Outcome(judged), Outcome(own)).value == expected
    assert verifier_local_reward(Outcome(verdict), Outcome(judged), Outcome(None, "reward timed out after 1s")).error.startswith("own answer")
