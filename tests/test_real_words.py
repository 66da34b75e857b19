"""The word-problem task file generator (pipeline.tasks.words): the learning task for a real model."""

from __future__ import annotations

import json
import re

import pytest

from pipeline.errors import ConfigError
from pipeline.tasks import load_task_file
from pipeline.tasks.words import main, word_problems, write_word_problems


def test_rows_are_distinct_deterministic_and_right():
    rows = word_problems(300, seed=3, max_operand=20)
    assert rows == word_problems(300, seed=3, max_operand=20)
    assert rows != word_problems(300, seed=4, max_operand=20)
    assert len({r["question"] for r in rows}) == 300
    ops = set()
    for r in rows:
        work, final = r["answer"].split("\n")
        a, op, b, _, c = work.split()
        ops.add(op)
        value = int(a) + int(b) if op == "+" else int(a) - int(b)
        assert value == int(c) == int(final.removeprefix("#### ")) >= 0
        assert 1 <= int(b) <= 20 and int(a) <= 20
        # the question states both numbers and asks one question
        assert re.search(rf"\b{a}\b", r["question"]) and re.search(rf"\b{b}\b", r["question"])
        assert r["question"].endswith("?")
    assert ops == {"+", "-"}


def test_written_file_is_a_task_file_with_both_splits(tmp_path):
    path = write_word_problems(tmp_path / "words.jsonl", 400, seed=0)
    task = load_task_file(path)
    held = task.problems("heldout", 1000, seed=0)
    train = task.problems("train", 1000, seed=0)
    assert len(held) + len(train) == 400 and 10 <= len(held) <= 80
    assert not {p.question for p in held} & {p.question for p in train}
    p = held[0]
    assert task.reward(p, f"Adding them up.\n#### {p.answer}") == 1.0
    assert task.reward(p, f"#### {int(p.answer) + 1}") == 0.0
    assert "####" in task.solver_messages(p)[-1]["content"]


def test_bad_arguments_are_named(tmp_path, capsys):
    with pytest.raises(ConfigError, match="--n"):
        word_problems(0)
    with pytest.raises(ConfigError, match="distinct problems"):
        word_problems(10_000, max_operand=3)
    assert main(["--out", str(tmp_path / "w.txt"), "--n", "5"]) == 2
    assert "--out" in capsys.readouterr().err
    assert main(["--out", str(tmp_path / "w.jsonl"), "--n", "5"]) == 0
    assert len((tmp_path / "w.jsonl").read_text().splitlines()) == 5
    assert all(json.loads(line)["answer"] for line in (tmp_path / "w.jsonl").read_text().splitlines())
