"""The evaluation cannot leak or flatter: a trained problem's mirror is never held out (a+b and
b+a, "Calculate 12 + 57." and "Calculate 57 + 12.", a tic-tac-toe board and its rotations), no
held-out game starts at a position a training game can reach or starts before, nothing the
default models are warm-started on is held out (and their cache keys follow the split), and a
partly right answer is not a success.

Each check is written against a plain reference (sorted operands, explicit board symmetries as
bit masks), not against the code's own canonical form."""

from __future__ import annotations

import inspect
import json
import random
import re
from dataclasses import dataclass

import pytest

from pipeline.rollout.rewards import Outcome, is_correct
from pipeline.tasks.arithmetic import ArithmeticTask
from pipeline.types import Problem

# -- arithmetic ---------------------------------------------------------------------------------


def test_no_sum_and_its_mirror_on_different_sides_of_the_split():
    """Every pair a, b < 100: a+b and b+a have one split."""
    task = ArithmeticTask()
    across = [(a, b) for a in range(100) for b in range(a + 1, 100) if task.split_of(a, "+", b) != task.split_of(b, "+", a)]
    assert across == []
    subtraction = ArithmeticTask(ops="+-")
    assert all(subtraction.split_of(a, "+", b) == subtraction.split_of(b, "+", a) for a in range(10, 100) for b in range(10, 100))


def test_the_held_out_side_holds_400_distinct_sums_and_no_drawn_problem_mirrors_a_train_one():
    task = ArithmeticTask()
    c = task.config
    groups = {(min(a, b), max(a, b)) for a in range(c.min_operand, c.max_operand + 1) for b in range(c.min_operand, c.max_operand + 1)}
    held = [g for g in groups if task.split_of(g[0], "+", g[1]) == "heldout"]
    assert len(held) >= 400
    heldout = task.problems("heldout", 400, 0)  # an evaluation of 400 distinct sums exists
    from pipeline.config import EvalConfig
    from pipeline.workflows.math.model import evaluate_solver

    # what the default model's build and the evaluation ask of the held-out split fits in it
    for n in (inspect.signature(evaluate_solver).parameters["n"].default, EvalConfig().problems):
        assert len(task.problems("heldout", n, 1)) == n
    sums = {tuple(sorted(map(int, p.question.rstrip("=").split("+")))) for p in heldout}
    assert len(sums) == 400  # distinct up to order: never both a+b and b+a among them
    train = {tuple(sorted(map(int, p.question.rstrip("=").split("+")))) for s in range(3) for p in task.problems("train", 2000, s)}
    assert not sums & train


def test_the_math_warm_start_trains_on_train_sums_only_and_its_cache_key_follows_the_split(monkeypatch):
    from pipeline.models.build import ModelConfig
    from pipeline.tasks import arithmetic
    from pipeline.workflows.math import model
    from pipeline.workflows.math.warmstart import WarmStartConfig, sft_examples

    task = ArithmeticTask()
    held = {(a, b) for a in range(10, 100) for b in range(10, 100) if task.split_of(a, "+", b) == "heldout"}
    examples = sft_examples(task, random.Random(0), 3000, WarmStartConfig())
    seen = set()
    for messages, _ in examples:
        question = next(m["content"] for m in messages if m["role"] == "user").split("\n")[0]
        a, b = question.rstrip("=").split("+")
        seen.add((int(a), int(b)))
    assert len(seen) > 1000 and not seen & held
    corpus = " ".join(model.tokenizer_corpus(0, 500))
    assert not any(f"{a}+{b}={a + b}" in corpus for a, b in held)
    key = model._build_key(ModelConfig(), WarmStartConfig())
    monkeypatch.setattr(arithmetic, "SPLIT_RULE", "another rule")
    assert model._build_key(ModelConfig(), WarmStartConfig()) != key
    monkeypatch.undo()

    @dataclass(frozen=True)
    class Wider(arithmetic.ArithmeticConfig):
        heldout_fraction: float = 0.3

    monkeypatch.setattr(arithmetic, "ArithmeticConfig", Wider)
    assert model._build_key(ModelConfig(), WarmStartConfig()) != key


# -- reasoning-gym ------------------------------------------------------------------------------

STUDY_OPTIONS = {"min_terms": 2, "max_terms": 2, "min_digits": 2, "max_digits": 2, "operators": "+", "allow_parentheses": False}
"""basic_arithmetic as the teams study runs it (docs/results/teams.md)."""


def rg_task(**options):
    pytest.importorskip("reasoning_gym", reason="the envs extra (scripts/setup.sh installs it)")
    from pipeline.workflows.reasoning_gym import ReasoningGymTask

    return ReasoningGymTask("basic_arithmetic", {**STUDY_OPTIONS, **options})


def test_a_partly_right_answer_is_not_a_success():
    """reasoning-gym's scorer gives "1410" 0.75 for the reference "141" (and "141.0" 0.6): the
    reward is then 0, and the one correctness rule calls it wrong; the reference itself is right."""
    task = rg_task()
    from pipeline.workflows.reasoning_gym import import_reasoning_gym

    entry = {"question": "Calculate 57 + 84.", "answer": "141", "metadata": {}}
    p = Problem(uid="rg:x", question=entry["question"], answer=json.dumps({"answer": "141", "metadata": {}}))
    scorer = import_reasoning_gym().create_dataset("basic_arithmetic", size=1, seed=0, **task.options)
    assert scorer.score_answer("1410", entry) == 0.75  # what the dataset's scorer says
    for partly in ("1410", "141.0", "14", "<answer>1410</answer>"):
        reward = task.reward(p, partly)
        assert reward == 0.0 and not is_correct(Outcome(reward)), partly
    for right in ("141", " 141 ", "<answer>141</answer>", "57 + 84 is <answer>141</answer>"):
        assert task.reward(p, right) == 1.0 and is_correct(Outcome(1.0)), right


def test_reasoning_gym_sums_and_their_mirrors_share_a_split_and_400_are_held_out():
    task = rg_task()
    across = [(a, b) for a in range(100) for b in range(a + 1, 100)
              if task.split_of(f"Calculate {a} + {b}.") != task.split_of(f"Calculate {b} + {a}.")]
    assert across == []
    # the wording is not the problem either
    assert all(task.split_of(f"Calculate {a} + {b}.") == task.split_of(f"What is {b}+{a}?") for a in range(10, 40) for b in range(10, 40))
    heldout = task.problems("heldout", 400, 0)
    sums = {tuple(sorted(int(x) for x in p.question.removeprefix("Calculate ").rstrip(".").split(" + "))) for p in heldout}
    assert len(sums) == 400
    train = {tuple(sorted(int(x) for x in p.question.removeprefix("Calculate ").rstrip(".").split(" + "))) for p in task.problems("train", 1500, 0)}
    assert not sums & train
    # the embedded model starts from the math model, warm-started on the arithmetic train split:
    # none of these sums is one of its train problems (the generator also writes sums outside the
    # arithmetic task's operands, e.g. 100 + 3, which that warm start never saw)
    arithmetic = ArithmeticTask()
    c = arithmetic.config
    shared = [(a, b) for a, b in sums if c.min_operand <= a <= c.max_operand and c.min_operand <= b <= c.max_operand]
    assert len(shared) > 200 and all(arithmetic.split_of(a, "+", b) == "heldout" for a, b in shared)


# -- tic-tac-toe --------------------------------------------------------------------------------

_ROT = (6, 3, 0, 7, 4, 1, 8, 5, 2)  # cell i of the rotated board is cell _ROT[i] of the board
_FLIP = (2, 1, 0, 5, 4, 3, 8, 7, 6)


def _images(cells: str) -> set[str]:
    """The board's 8 rotations and reflections."""
    out, board = set(), cells
    for _ in range(4):
        out |= {board, "".join(board[j] for j in _FLIP)}
        board = "".join(board[j] for j in _ROT)
    return out


def _masks(cells: str) -> tuple[int, int]:
    return (sum(1 << i for i, c in enumerate(cells) if c == "x"), sum(1 << i for i, c in enumerate(cells) if c == "o"))


def _contains(big: tuple[int, int], small: tuple[int, int]) -> bool:
    """Every mark of `small` is on `big` (a game at `small` can reach `big` only if this holds)."""
    return big[0] & small[0] == small[0] and big[1] & small[1] == small[1]


def _cells(workflow, problem) -> str:
    return str(workflow.table(problem).state).replace("\n", "")


def _size(workflow, split: str) -> int:
    """How many positions `split` holds (the count its refusal of too many names)."""
    from pipeline.errors import ConfigError

    with pytest.raises(ConfigError) as refused:
        workflow.problems(split, 10**6, 0)
    return int(re.search(rf"{split} has (\d+) positions", str(refused.value)).group(1))


def test_no_held_out_tic_tac_toe_start_is_a_train_start_its_mirror_or_reachable_from_one():
    """The rule (`position_splits`): no held-out start, nor any rotation or reflection of it, is a
    train start, a position a game from a train start can reach (its marks a superset of the
    train start's), or a position before a train start (a subset). 200 held-out positions exist
    (the evaluation's default), and the train split holds a round at the game's own budget."""
    pytest.importorskip("pyspiel", reason="the games extra (scripts/setup.sh installs it)")
    from pipeline.workflows import load_workflow

    wf = load_workflow("tic_tac_toe")
    held, train = (wf.problems(split, _size(wf, split), 0) for split in ("heldout", "train"))
    assert len(held) >= 200 and len(train) >= 320
    train_masks = {_masks(_cells(wf, p)) for p in train}
    for p in held:
        for image in _images(_cells(wf, p)):
            m = _masks(image)
            assert not any(_contains(m, t) or _contains(t, m) for t in train_masks), (p.question, image)


def test_the_tic_tac_toe_warm_start_never_trains_at_a_held_out_start_or_its_mirror():
    pytest.importorskip("pyspiel", reason="the games extra (scripts/setup.sh installs it)")
    from pipeline.workflows import load_workflow
    from pipeline.workflows.games.model import TTTWarmStartConfig, ttt_sft_examples

    wf = load_workflow("tic_tac_toe")
    held = {image for p in wf.problems("heldout", 200, 0) for image in _images(_cells(wf, p))}
    examples = ttt_sft_examples(random.Random(0), 3000, TTTWarmStartConfig())
    boards = {"".join(c[0] for c in m[0]["content"].split("\n")[1].removeprefix("cells: ").split()) for m, _ in examples}
    assert sum(b.count("x") + b.count("o") == 4 for b in boards) > 100  # it does train at that depth
    assert not boards & held


# -- the canonical form -------------------------------------------------------------------------


@pytest.mark.parametrize(("one", "other", "same"), [
    ("57+12", "12+57", True), ("(12)+57", "57 + 12", True), ("5-3+2", "2+5-3", True), ("-3+5+2", "5+2-3", True),
    ("4*3", "3*4", True), ("(1+2)*3", "3*(2+1)", True), ("2×3", "3*2", True),
    ("5-3", "3-5", False), ("6/2", "2/6", False), ("2^3", "3^2", False), ("(1+2)*3", "1+2*3", False), ("12+57", "12+58", False),
])
def test_the_canonical_form_merges_one_problem_written_two_ways_and_nothing_else(one, other, same):
    from pipeline.tasks.base import canonical_expression

    assert canonical_expression(one) is not None and (canonical_expression(one) == canonical_expression(other)) is same


def test_a_question_without_one_readable_expression_falls_back_to_its_text():
    from pipeline.tasks.base import canonical_question

    assert canonical_question("Calculate 12 + 57.") == canonical_question("What is 57+12?") == "expr:12+57"
    assert canonical_question("How many legs do 3 cats have?") == canonical_question("how many  legs do 3 cats have") == "text:how many legs do 3 cats have"
    assert canonical_question("Add 1 + 2, then 3 + 4.").startswith("text:")  # two expressions: the text decides
    deep = "Calculate " + "+".join(["1"] * 5000) + "."  # too deep for Python's parser: no crash
    assert canonical_question(deep).startswith("text:")
