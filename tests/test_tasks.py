"""Tasks: problems, splits, prompts, rewards, verdicts, the local-file loader, and the
`MathTask` base class both tasks share."""

from __future__ import annotations

import json
import re
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
    assert v["role"] == "user" and "123+45=" in v["content"] and "168" not in v["content"]  # blind: no proposal
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
def test_parse_verdict(text, verdict):
    assert PromptTemplate().parse_verdict(text) is verdict  # a yes/no Verifier, read by its first word


@pytest.mark.parametrize("text,verdict", [("168", True), ("168 no", True), ("167 yes", False), ("yes", None), ("", None)])
def test_the_arithmetic_verdict_compares_the_verifiers_own_answer(task, text, verdict):
    assert task.parse_verdict(text, "168") is verdict


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
    pq.write_table(pa.table({"q": ["2+2?", "capital of France?", "3*3?"], "a": ["4", "Paris", "####"], "s": ["train", "test", "train"]}), path)
    t = make_task("file", path=str(path), question_col="q", answer_col="a", split_col="s")
    train, held = t.problems("train", 10, 0), t.problems("heldout", 10, 0)
    assert sorted(p.question for p in train) == ["2+2?", "3*3?"] and [p.question for p in held] == ["capital of France?"]
    assert t.reward(held[0], "It is paris") == 0.0 and t.reward(held[0], "paris") == 1.0
    no_ref = next(p for p in train if p.question == "3*3?")  # "####" with nothing after: no answer extracted
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
        assert t.solver_messages(p) == t.prompts.solver_messages(p.question)
        assert t.verifier_messages(p, " 7 ") == t.prompts.verifier_messages(p.question, "7")
        right, wrong = p.answer, str(int(p.answer) + 1)
        assert t.reward(p, right) == 1.0 and t.reward(p, wrong) == 0.0
        assert t.feedback_message(p, right) == {"role": "user", "content": t.prompts.fill(t.prompts.right_feedback)}
        assert t.feedback_message(p, wrong) == {"role": "user", "content": t.prompts.fill(t.prompts.wrong_feedback)}
    if t.verdict_reads_solution:  # arithmetic: the Verifier's own answer against the proposal
        assert (t.parse_verdict("7 no", "7"), t.parse_verdict("8", "7"), t.parse_verdict("maybe", "7")) == (True, False, None)
    else:
        assert (t.parse_verdict("Yes."), t.parse_verdict("no"), t.parse_verdict("maybe")) == (True, False, None)


def test_file_task_feedback_follows_its_text_reward(tmp_path):
    """A non-numeric answer: the feedback turn follows the file task's last-line string match,
    and an unscorable attempt (no reference answer) gets the wrong-answer feedback."""
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"question": "capital of France?", "answer": "Paris"}) + "\n"
                    + json.dumps({"question": "capital of Spain?", "answer": "####"}) + "\n")
    t = make_task(str(path))
    assert isinstance(t, FileTask)
    by_q = {p.question: p for p in t.problems("train", 2, 0) + t.problems("heldout", 2, 0)}
    paris, blank = by_q["capital of France?"], by_q["capital of Spain?"]
    right, wrong = (t.prompts.fill(x) for x in (t.prompts.right_feedback, t.prompts.wrong_feedback))
    assert right.startswith("That is right.") and wrong.startswith("That is wrong.")
    assert t.feedback_message(paris, "I think\n paris ")["content"] == right
    assert t.feedback_message(paris, "paris?")["content"] == wrong
    assert t.reward(blank, "Madrid") is None and t.feedback_message(blank, "Madrid")["content"] == wrong


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


# -- prompts ------------------------------------------------------------------------------------
from pipeline.errors import DataError  # noqa: E402
from pipeline.tasks import ARITHMETIC_PROMPTS, CHAIN_OF_THOUGHT_PROMPTS, PromptTemplate, load_prompt_file, parse_marked_verdict  # noqa: E402
from pipeline.tasks.prompts import COT_EXAMPLES, GSM8K_ANSWER_FORMAT  # noqa: E402
from pipeline.tasks.files import math_answer_reward  # noqa: E402


def test_arithmetic_prompts_are_the_ones_the_default_model_knows(task):
    """The exact texts the embedded model is warm-started on, and its verdicts: the Verifier's
    own answer compared with the proposal."""
    p = task.make_problem(123, "+", 45)
    assert task.prompts is ARITHMETIC_PROMPTS
    assert task.solver_messages(p) == [{"role": "user", "content": "123+45="}]
    # a blind Verifier: it is not shown the proposal (it cannot copy it); the comparison reads it
    assert task.verifier_messages(p, " 168 \n") == [{"role": "user", "content": "123+45=\nCheck it: work it out again."}]
    assert not task.prompts.verifier_sees_solution
    assert task.feedback_message(p, "168") == {"role": "user", "content": "That is right. Say it again."}
    assert task.prompts.verdict == "compare" and task.verdict_reads_solution
    assert [task.parse_verdict(t, "168") for t in ("168 yes", "168 no", "167 yes", "yes", "")] == [True, True, False, None, None]


def test_file_task_prompts_are_chain_of_thought():
    t = load_task_file(GSM8K_SAMPLE)
    p = t.problems("train", 1, 0)[0]
    *shots, solver = t.solver_messages(p)
    assert solver["role"] == "user" and solver["content"].startswith(p.question) and "few short steps" in solver["content"]
    assert '"#### <number>"' in solver["content"]
    # the worked examples come first as earlier turns: the same user text on their question, then their solution
    assert [m["role"] for m in shots] == ["user", "assistant"] * len(COT_EXAMPLES) and len(COT_EXAMPLES) >= 1
    for (question, answer), (user, assistant) in zip(COT_EXAMPLES, zip(shots[::2], shots[1::2])):
        assert user["content"] == solver["content"].replace(p.question, question, 1)
        assert assistant["content"] == answer and re.search(r"\n#### \d+$", answer) and t.reward(p, answer) is not None
    solution = "First, 48/2 = 24.\nThen 48 + 24 = 72.\n#### 72"
    [verifier] = t.verifier_messages(p, solution + "\n")
    assert p.question in verifier["content"] and solution in verifier["content"] and '"Verdict: yes"' in verifier["content"]
    assert "####" in t.feedback_message(p, "#### 1")["content"]
    assert t.parse_verdict("The steps hold.\nVerdict: yes") is True and t.parse_verdict("Verdict: no") is False


@pytest.mark.parametrize(
    "text, verdict",
    [("Step 1 is right.\nVerdict: yes", True), ("**Verdict:** No", False), ("verdict - YES.", True), ("yes", True), ("No.", False),
     ("Verdict: no. On second thought, Verdict: yes", True), ("I checked every step.\nYes", True), ("I checked.\nno.", False),
     ("maybe", None), ("", None), ("The answer is not correct", None), ("Verdict: unsure", None)],
)
def test_marked_verdicts(text, verdict):
    assert parse_marked_verdict(text) is verdict


def test_placeholders_are_filled_once():
    t = PromptTemplate(user="Q: {question} ({answer_format})", answer_format="end with #### n", verifier_user="{question} -> {solution}")
    assert t.solver_messages("what is {solution}?") == [{"role": "user", "content": "Q: what is {solution}? (end with #### n)"}]
    assert t.verifier_messages("q", " {question} ") == [{"role": "user", "content": "q -> {question}"}]
    assert PromptTemplate(user="{question}", system="Be brief. {answer_format}", answer_format="A").solver_messages("q") == [
        {"role": "system", "content": "Be brief. A"}, {"role": "user", "content": "q"}]


def test_examples_are_earlier_turns_and_a_prompt_file_sets_or_clears_them(tmp_path):
    t = PromptTemplate(user="Q: {question}", system="S", examples=[["1+1?", "#### 2"], ("2+2?", "#### 4")])
    assert t.examples == (("1+1?", "#### 2"), ("2+2?", "#### 4"))
    assert t.solver_messages("3+3?") == [
        {"role": "system", "content": "S"}, {"role": "user", "content": "Q: 1+1?"}, {"role": "assistant", "content": "#### 2"},
        {"role": "user", "content": "Q: 2+2?"}, {"role": "assistant", "content": "#### 4"}, {"role": "user", "content": "Q: 3+3?"}]
    assert t.verifier_messages("3+3?", "6") == PromptTemplate().verifier_messages("3+3?", "6")  # the Verifier is shown none
    toml = tmp_path / "e.toml"
    toml.write_text('[[examples]]\nquestion = "5-1?"\nsolution = "#### 4"\n')
    assert load_prompt_file(toml, CHAIN_OF_THOUGHT_PROMPTS).examples == (("5-1?", "#### 4"),)
    toml.write_text("examples = []\n")
    none = load_prompt_file(toml, CHAIN_OF_THOUGHT_PROMPTS)
    assert none.examples == () and none.solver_messages("q") == [{"role": "user", "content": none.fill(none.user, "q")}]
    toml.write_text('examples = [["only a question"]]\n')
    with pytest.raises(ConfigError, match=r"e.toml: prompt template: examples\[0\] must be a pair"):
        load_prompt_file(toml, CHAIN_OF_THOUGHT_PROMPTS)
    with pytest.raises(ConfigError, match="examples must be a list"):
        PromptTemplate(examples="1+1? #### 2")


def test_a_rejection_text_restates_the_answer_format_and_reaches_the_orchestra(tmp_path):
    from pipeline.workflows.math.orchestra import MathOrchestra
    from pipeline.workflows.math.orchestra import DEFAULT_REJECTION

    assert ARITHMETIC_PROMPTS.rejection is None and ARITHMETIC_PROMPTS.rejection_template() is None  # the orchestra's own
    template = CHAIN_OF_THOUGHT_PROMPTS.rejection_template()
    said = MathOrchestra(load_task_file(GSM8K_SAMPLE), rejection_template=template).rejection_message(" 3 is wrong {x}. ").text
    assert said.startswith("The verifier rejected your answer: 3 is wrong {x}.\n") and said.endswith(GSM8K_ANSWER_FORMAT)
    boxed = PromptTemplate(answer_format="\\boxed{}", rejection="No: {verifier_text} {answer_format}")
    assert boxed.rejection_template().format(verifier_text="v") == "No: v \\boxed{}"  # braces of the format survive
    with pytest.raises(ConfigError, match=r"rejection must hold the placeholder \{verifier_text\}"):
        PromptTemplate(rejection="Try again.")
    assert "{verifier_text}" in DEFAULT_REJECTION


def test_prompt_files_override_the_tasks_prompts(tmp_path):
    toml = tmp_path / "p.toml"
    toml.write_text('system = "You are a careful solver."\nuser = """Problem: {question}\n\\\\boxed{{}} your answer."""\nverdict = "marked"\n'
                    'verifier_user = "{question} = {solution}?"\n')
    t = make_task("arithmetic", prompt_file=toml)
    p = t.make_problem(12, "+", 30)
    assert t.solver_messages(p) == [{"role": "system", "content": "You are a careful solver."},
                                    {"role": "user", "content": "Problem: 12+30=\n\\boxed{{}} your answer."}]
    assert t.verifier_messages(p, "42") == [{"role": "user", "content": "12+30= = 42?"}]
    assert t.prompts.rejection == ARITHMETIC_PROMPTS.rejection  # keys left out keep the task's
    assert t.parse_verdict("hm.\nVerdict: yes") is True
    js = tmp_path / "p.json"
    js.write_text(json.dumps({"verifier_user": "Solution: {solution}\nOK?", "verifier_system": None}))
    f = load_task_file(GSM8K_SAMPLE, prompt_file=js)
    q = f.problems("train", 1, 0)[0]
    assert f.verifier_messages(q, "x") == [{"role": "user", "content": "Solution: x\nOK?"}]
    assert f.solver_messages(q) == CHAIN_OF_THOUGHT_PROMPTS.solver_messages(q.question)
    assert make_task(str(GSM8K_SAMPLE), prompt_file=js).prompts == f.prompts


@pytest.mark.parametrize(
    "name, content, match",
    [("a.toml", 'usr = "{question}"', r"unknown key\(s\) \['usr'\]"),
     ("b.toml", 'user = "no placeholder"', r"user must hold the placeholder \{question\}"),
     ("c.json", '{"verifier_user": "{question}", "verdict": "marked"}', r"verifier_user must hold the placeholder \{solution\}"),
     ("d.toml", 'verdict = "last_word"', "verdict must be one of"),
     ("i.toml", 'verdict = "marked"', r"verifier_user must hold the placeholder \{solution\}"),  # a yes/no Verifier must see the proposal
     ("e.toml", "user = [1, 2]", "user must be a string"),
     ("f.toml", "user = ", "is not valid TOML"),
     ("g.json", "[1]", "must hold a table"),
     ("h.yaml", "user: x", r"must end in \.toml or \.json")],
)
def test_bad_prompt_files_name_the_file_and_key(tmp_path, name, content, match):
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(ConfigError, match=match) as info:
        load_prompt_file(path, ARITHMETIC_PROMPTS)
    assert name in str(info.value)
    with pytest.raises(ConfigError, match="is not a file"):
        load_prompt_file(tmp_path / "missing.toml", ARITHMETIC_PROMPTS)
    latin = tmp_path / "latin.toml"
    latin.write_bytes('user = "caf\xe9 {question}"'.encode("latin-1"))
    with pytest.raises(ConfigError, match="latin.toml is not UTF-8"):
        load_prompt_file(latin, ARITHMETIC_PROMPTS)


# -- answer checking (math-verify with the exact match) -------------------------------------------
@pytest.mark.parametrize(
    "reference, completion, reward",
    [("72", "24 + 48 = 72\n#### 72", 1.0), ("72", "#### 72.00", 1.0), ("72", "#### 73", 0.0), ("72", "so 48.", 0.0),
     ("0.5", "So x = \\frac{1}{2}.", 1.0), ("1/2", "The answer is $\\boxed{0.5}$", 1.0), ("\\frac{3}{4}", "#### 3/4", 1.0),
     ("\\sqrt{2}", "\\boxed{\\sqrt 2}", 1.0), ("\\sqrt{2}", "\\boxed{2}", 0.0), ("Paris", "it is\nparis", 1.0), ("Paris", "Rome", 0.0),
     ("1234", "The total is 1,234.", 1.0), ("72", "", 0.0)],
)
def test_math_answer_reward(reference, completion, reward):
    assert math_answer_reward(reference, completion) == reward


def test_file_task_rewards_latex_answers_on_a_worker_thread(tmp_path):
    """The rollouts score rewards on a thread (the time-limit guard): math-verify's signal-based
    limits must be off there, or every LaTeX answer would be scored wrong."""
    from pipeline.rollout.rewards import score_attempts

    path = tmp_path / "frac.jsonl"
    path.write_text(json.dumps({"question": "Half of one?", "answer": "\\frac{1}{2}"}) + "\n")
    t = load_task_file(path, split_col=None, heldout_fraction=0.5)
    [p] = t.problems("train", 1, 0) or t.problems("heldout", 1, 0)
    out = score_attempts(t, [(p, "It is $0.5$"), (p, "\\boxed{\\frac{2}{4}}"), (p, "#### 2")], timeout=30.0)
    assert [(o.value, o.error) for o in out] == [(1.0, None), (1.0, None), (0.0, None)]


# -- bad task files ---------------------------------------------------------------------------------
def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("content", [b"", b"\n \n"])
def test_an_empty_task_file_is_named(tmp_path, content):
    path = tmp_path / "empty.jsonl"
    path.write_bytes(content)
    with pytest.raises(DataError, match="empty.jsonl is empty"):
        load_task_file(path)


def test_a_parquet_task_file_without_rows_is_named(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "none.parquet"
    pq.write_table(pa.table({"question": pa.array([], pa.string()), "answer": pa.array([], pa.string())}), path)
    with pytest.raises(DataError, match="none.parquet has no rows"):
        load_task_file(path)


@pytest.mark.parametrize("missing, setting", [("question", "question_col"), ("answer", "answer_col")])
def test_a_missing_column_is_named_with_its_setting(tmp_path, missing, setting):
    row = {"question": "1+1?", "answer": "2"}
    del row[missing]
    path = _write(tmp_path / "cols.jsonl", [row])
    with pytest.raises(ConfigError, match=rf"column '{missing}' not in .*cols.jsonl \({setting}; the file's columns"):
        load_task_file(path)


def test_empty_answers_name_their_rows(tmp_path):
    rows = [{"question": f"{i}+1?", "answer": str(i + 1)} for i in range(14)]
    rows[3]["answer"] = ""
    path = _write(tmp_path / "one.jsonl", rows)
    with pytest.raises(DataError, match=r"one.jsonl: row 3 has an empty 'answer' \(answer_col\)"):
        load_task_file(path)
    for i in (1, 5, 6, 7, 8, 9, 10, 11, 12, 13):
        rows[i]["answer"] = None if i % 2 else "  "
    path = _write(tmp_path / "many.jsonl", rows)
    with pytest.raises(DataError, match=r"many.jsonl: rows 1, 3, 5, 6, 7, 8, 9, 10, 11, 12 and 1 more \(11 in all\) have an empty 'answer'"):
        load_task_file(path)
    rows = [{"question": "", "answer": "1"}, {"question": "2?", "answer": "2"}]
    with pytest.raises(DataError, match=r"row 0 has an empty 'question' \(question_col\)"):
        load_task_file(_write(tmp_path / "q.jsonl", rows))


def test_a_task_file_that_is_not_utf8_names_the_line(tmp_path):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(json.dumps({"question": "1+1?", "answer": "2"}).encode() + b"\n" + '{"question": "caf\xe9?", "answer": "3"}\n'.encode("latin-1"))
    with pytest.raises(DataError, match=r"latin1.jsonl is not UTF-8 text: line 2 \(byte"):
        load_task_file(path)


def test_a_malformed_json_line_is_named(tmp_path):
    path = tmp_path / "broken.jsonl"
    path.write_text('{"question": "1+1?", "answer": "2"}\n\n{"question": \n')
    with pytest.raises(DataError, match=r"broken.jsonl cannot be read as JSON lines: line 3: Expecting value at column 14$"):
        load_task_file(path)
    path.write_text('{"question": "1+1?", "answer": "2"}\n["1+2?", "3"]\n')
    with pytest.raises(DataError, match=r"cannot be read as JSON lines: line 2: a JSON list, not an object"):
        load_task_file(path)


@pytest.mark.parametrize("command", ["run", "rollout"])
def test_bad_task_files_stop_the_cli_with_exit_2_before_anything_is_written(tmp_path, capsys, command):
    from maxit.cli import main

    path = _write(tmp_path / "bad.jsonl", [{"question": "1+1?", "answer": "2"}, {"question": "2+2?", "answer": ""}])
    store = tmp_path / "store"
    argv = [command, "--store", str(store), "--task-file", str(path)] + (["--rounds", "1"] if command == "run" else [])
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"maxit {command}: error:" in err and "bad.jsonl: row 1 has an empty 'answer'" in err
    assert not store.exists()


def test_a_comparing_verifier_may_work_blind():
    # without {solution} only a "compare" Verifier: it never sees the proposal, the comparison reads it
    blind = PromptTemplate(verdict="compare", verifier_user="{question}\nCheck it: work it out again.")
    assert not blind.verifier_sees_solution and PromptTemplate().verifier_sees_solution
    assert ARITHMETIC_PROMPTS.verifier_user == blind.verifier_user  # the arithmetic task's Verifier is blind
    assert blind.verifier_messages("12+30=", "41") == [{"role": "user", "content": "12+30=\nCheck it: work it out again."}]
    assert blind.parse_verdict("42", "41") is False and blind.parse_verdict("42", "42") is True
    assert PromptTemplate(verdict="compare", verifier_user="{question}", verifier_system="Proposal: {solution}").verifier_sees_solution
    for verdict in ("first_word", "marked"):
        with pytest.raises(ConfigError, match=r"verifier_user must hold the placeholder \{solution\}.*compare"):
            PromptTemplate(verdict=verdict, verifier_user="{question}\nCheck it.")
