"""The data the docs' commands use ships in the repository (tests/test_layout.py keeps their paths
inside the checkout): the shipped GSM8K files load as task files."""

from __future__ import annotations

from pathlib import Path

from pipeline.tasks.files import load_task_file

ROOT = Path(__file__).resolve().parents[1]


def test_the_shipped_gsm8k_loads_as_task_files():
    for split, n in (("train", 7473), ("test", 1319)):
        path = ROOT / "data" / "gsm8k" / f"{split}.jsonl"
        assert sum(1 for _ in path.open(encoding="utf-8")) == n
    assert (ROOT / "data" / "gsm8k" / "LICENSE").read_text().startswith("MIT")
    task = load_task_file(ROOT / "data" / "gsm8k" / "train.jsonl")
    problems = task.problems("train", 4, seed=0)
    assert len(problems) == 4
    assert task.reward(problems[0], f"#### {problems[0].answer}") == 1.0
