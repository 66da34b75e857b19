"""Tasks: problems, splits, prompts, rewards, verdicts, the local-file loader, and the
`MathTask` base class both tasks share."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.errors import ConfigError
from pipeline.strategies import PromptAug
from pipeline.tasks import ArithmeticTask, FileTask, MathTask, Task, extract_answer, load_task_file, make_task, number_reward
from pipeline.tasks.base import RIGHT_FEEDBACK, WRONG_FEEDBACK
from pipeline.types import Problem

GSM8K_SAMPLE = Path(__file__).parent / "data" / "gsm8k" / "train_sample.jsonl"


@pytest.fixture(scope="module")
def task() -> ArithmeticTask:
    return make_task("arithmetic")


def test_arithmetic_implements_the_task_protocol(task):
    assert isinstance(task, Task)
    assert task.name == "arithmetic"


def test_problems_are_deterministic_distinct_and_in_their_split(task):
    a = task.problems("train", 300, seed=3)
    assert a == task.problems("train", 300, seed=3)
    assert a != task.problems("train", 300, seed=4)
    assert len({p.uid for p in a}) == 300
    assert all(p.split == "train" for p in a)
    for p in a[:50]:
        x, op, y = p.question[:-1].replace("-", " - ").replace("+", " + ").split()
        assert 10 <= int(x) <= 999 and 10 <= int(y) <= 999 and p.question.endswith("=")
        assert int(p.answer) == (int(x) + int(y) if op == "+" else int(x) - int(y)) >= 0


def test_train_and_heldout_never_share_a_problem(task):
    train = {p.question for seed in range(3) for p in task.problems("train", 2000, seed)}
    held = {p.question for seed in range(3) for p in task.problems("heldout", 400, seed)}
    assert len(held) > 400 and len(train) > 2000 and not train & held
    # the split is a function of the problem alone, not of the seed that drew it
    for p in task.problems("heldout", 100, 9):
        assert task.make_problem(*_operands(p)).split == "heldout"


def _operands(p: Problem):
    op = "+" if "+" in p.question else "-"
    a, b = p.question[:-1].split(op)
    return int(a), op, int(b)


def test_solver_verifier_and_feedback_prompts(task):
    p = task.make_problem(123, "+", 45)
    assert task.solver_messages(p) == [{"role": "user", "content": "123+45="}]
    (v,) = task.verifier_messages(p, " 168 ")
    assert v["role"] == "user" and "123+45=" in v["content"] and "168" in v["content"] and "yes or no" in v["content"]
    assert task.feedback_message(p, "167") == {"role": "user", "content": "That is wrong. Try again."}
    assert task.feedback_message(p, "168")["content"] != "That is wrong. Try again."


@pytest.mark.parametrize(
    "completion,expected",
    [("168", 1.0), (" 168", 1.0), ("123+45=168", 1.0), ("167", 0.0), ("1680", 0.0), ("", 0.0), ("abc", 0.0), ("yes", 0.0)],
)
def test_solver_reward_right_wrong_unparsable(task, completion, expected):
    assert task.reward(task.make_problem(123, "+", 45), completion) == expected


def test_reward_is_none_when_the_reference_is_unusable(task):
    bad = Problem(uid="x", question="1+1=", answer="two")
    assert task.reward(bad, "2") is None
    assert task.reward(Problem(uid="y", question="1+1=", answer="2.5"), "2") is None


@pytest.mark.parametrize("text,verdict", [("yes", True), (" Yes.", True), ("no", False), ("NO!", False), ("", None), ("maybe", None), ("7", None)])
def test_parse_verdict(task, text, verdict):
    assert task.parse_verdict(text) is verdict


def test_hint_names_the_tens_digit_and_prompt_aug_shows_it(task):
    p = task.make_problem(123, "+", 45)
    assert p.hint == "the tens digit is 6"
    msgs = PromptAug().augment(task.solver_messages(p), p)
    assert msgs[0] == {"role": "system", "content": "Hint: the tens digit is 6"}
    assert make_task("arithmetic", hint="prefix").make_problem(123, "+", 45).hint == "16_"
    assert make_task("arithmetic", hint="none").make_problem(123, "+", 45).hint is None
    assert task.make_problem(15, "-", 11).hint == "the tens digit is 0"


def test_config_errors_name_the_field():
    with pytest.raises(ConfigError, match="heldout_fraction"):
        make_task("arithmetic", heldout_fraction=1.5)
    with pytest.raises(ConfigError, match="ops"):
        make_task("arithmetic", ops="*")
    with pytest.raises(ConfigError, match="unknown task"):
        make_task("chess")
    with pytest.raises(ConfigError, match="split"):
        make_task().problems("test", 3, 0)


@pytest.mark.parametrize(
    "cell,fmt,expected",
    [("so 3 + 4 = 7\n#### 7", "auto", "7"), ("#### 1,234", "gsm8k", "1234"), ("42", "auto", "42"),
     ("Paris", "plain", "Paris"), ("no marker", "gsm8k", None), ("answer: 12 apples", r"answer: (\d+)", "12"), ("", "auto", None)],
)
def test_extract_answer(cell, fmt, expected):
    assert extract_answer(cell, fmt) == expected


def test_gsm8k_sample_loads_through_load_task_file():
    t = load_task_file(GSM8K_SAMPLE)
    assert isinstance(t, Task) and len(t) == 20
    train, held = t.problems("train", 100, 0), t.problems("heldout", 100, 0)
    assert len(train) + len(held) == 20 and not {p.question for p in train} & {p.question for p in held}
    rows = [json.loads(line) for line in GSM8K_SAMPLE.read_text().splitlines()]
    by_q = {r["question"]: r["answer"].rsplit("####", 1)[1].strip() for r in rows}
    for p in train + held:
        assert p.answer == by_q[p.question].replace(",", "")
        assert t.reward(p, f"Let me think. The answer is {p.answer}.") == 1.0
        assert t.reward(p, f"#### {int(p.answer) + 1}") == 0.0
        assert t.reward(p, "I don't know") == 0.0
    assert make_task(str(GSM8K_SAMPLE)).problems("train", 3, 1) == t.problems("train", 3, 1)


def test_file_task_from_parquet_with_custom_columns_and_splits(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "p.parquet"
    pq.write_table(pa.table({"q": ["2+2?", "capital of France?", "3*3?"], "a": ["4", "Paris", None], "s": ["train", "test", "train"]}), path)
    t = make_task("file", path=str(path), question_col="q", answer_col="a", split_col="s")
    train, held = t.problems("train", 10, 0), t.problems("heldout", 10, 0)
    assert sorted(p.question for p in train) == ["2+2?", "3*3?"] and [p.question for p in held] == ["capital of France?"]
    assert t.reward(held[0], "It is paris") == 0.0 and t.reward(held[0], "paris") == 1.0
    no_ref = next(p for p in train if p.question == "3*3?")
    assert t.reward(no_ref, "9") is None
    with pytest.raises(ConfigError, match="column 'question'"):
        load_task_file(path)


# -- the MathTask base class ------------------------------------------------------------------
SHARED = ("solver_messages", "verifier_messages", "feedback_message", "parse_verdict")


@pytest.mark.parametrize(
    "completion,expected",
    [("42", 1.0), ("so it is 42.", 1.0), ("#### 42 (not 43)", 1.0), ("42.0000000001", 1.0), ("1,042", 0.0),
     ("41", 0.0), ("42 or 43", 0.0), ("", 0.0), ("forty-two", 0.0)],
)
def test_number_reward(completion, expected):
    assert number_reward(42.0, completion) == expected


def test_number_reward_reads_thousands_separators():
    assert number_reward(1234.0, "The answer is 1,234.") == 1.0


@pytest.mark.parametrize("make", [lambda: make_task("arithmetic"), lambda: load_task_file(GSM8K_SAMPLE)], ids=["arithmetic", "file"])
def test_both_tasks_share_the_math_task_behaviour(make):
    """Both tasks take their prompts, feedback and verdicts from `MathTask`, and those follow each
    task's own reward: one right and one wrong attempt per problem."""
    t = make()
    assert isinstance(t, MathTask) and isinstance(t, Task)
    for method in SHARED:
        assert getattr(type(t), method) is getattr(MathTask, method), method
    for p in t.problems("train", 3, 0):
        assert t.solver_messages(p) == [{"role": "user", "content": p.question}]
        assert t.verifier_messages(p, " 7 ") == [
            {"role": "user", "content": f"{p.question}\nProposed answer: 7\nIs it right? Answer yes or no."}
        ]
        right, wrong = p.answer, str(int(p.answer) + 1)
        assert t.reward(p, right) == 1.0 and t.reward(p, wrong) == 0.0
        assert t.feedback_message(p, right) == {"role": "user", "content": RIGHT_FEEDBACK}
        assert t.feedback_message(p, wrong) == {"role": "user", "content": WRONG_FEEDBACK}
    assert (t.parse_verdict("Yes."), t.parse_verdict("no"), t.parse_verdict("maybe")) == (True, False, None)


def test_file_task_feedback_follows_its_text_reward(tmp_path):
    """A non-numeric answer: the feedback turn follows the file task's last-line string match,
    and an unscorable attempt (no reference answer) gets the wrong-answer feedback."""
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"question": "capital of France?", "answer": "Paris"}) + "\n"
                    + json.dumps({"question": "capital of Spain?", "answer": ""}) + "\n")
    t = make_task(str(path))
    assert isinstance(t, FileTask)
    by_q = {p.question: p for p in t.problems("train", 2, 0) + t.problems("heldout", 2, 0)}
    paris, blank = by_q["capital of France?"], by_q["capital of Spain?"]
    assert t.feedback_message(paris, "I think\n paris ")["content"] == RIGHT_FEEDBACK
    assert t.feedback_message(paris, "paris?")["content"] == WRONG_FEEDBACK
    assert t.reward(blank, "Madrid") is None and t.feedback_message(blank, "Madrid")["content"] == WRONG_FEEDBACK


class _ParityTask(MathTask):
    """A task written as a user would: a name, its problems and its reward, nothing else."""

    name = "parity"

    def problems(self, split: str, n: int, seed: int) -> list[Problem]:
        return [Problem(uid=f"parity:{seed}:{i}", question=f"Is {seed + i} even or odd?", answer="even" if (seed + i) % 2 == 0 else "odd",
                        split=split) for i in range(n)]

    def reward(self, problem: Problem, completion_text: str) -> float | None:
        words = completion_text.lower().split()
        return 1.0 if words and words[-1] == problem.answer else 0.0


def test_a_subclass_overriding_only_problems_and_reward_is_a_full_task():
    t = _ParityTask()
    assert isinstance(t, Task)
    p, q = t.problems("train", 2, seed=4)
    assert (p.question, p.answer, q.answer) == ("Is 4 even or odd?", "even", "odd")
    assert t.solver_messages(p) == [{"role": "user", "content": "Is 4 even or odd?"}]
    assert t.verifier_messages(p, "even")[0]["content"].startswith("Is 4 even or odd?\nProposed answer: even\n")
    # the shared feedback turn follows the subclass's reward, not a numeric check
    assert t.feedback_message(p, "it is even")["content"] == RIGHT_FEEDBACK
    assert t.feedback_message(q, "it is even")["content"] == WRONG_FEEDBACK
    assert t.parse_verdict("YES") is True


def test_a_subclass_without_problems_or_reward_cannot_be_built():
    class NoReward(MathTask):
        name = "no-reward"

        def problems(self, split, n, seed):
            return []

    class NoProblems(MathTask):
        name = "no-problems"

        def reward(self, problem, completion_text):
            return 0.0

    for cls in (NoReward, NoProblems, MathTask):
        with pytest.raises(TypeError, match="abstract"):
            cls()
