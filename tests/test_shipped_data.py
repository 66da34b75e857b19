"""What the docs' commands use ships in the repository: no command or path in the README, docs,
scripts, benchmarks or examples reaches outside the checkout, and the shipped GSM8K files load as
task files."""

from __future__ import annotations

import re
from pathlib import Path

from pipeline.tasks.files import load_task_file

ROOT = Path(__file__).resolve().parents[1]
OUTSIDE = re.compile(r"\.\./shared\b|/work/shared\b")


def outside_references(files: list[Path]) -> list[str]:
    return [f"{p.relative_to(ROOT)}:{i}" for p in files for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if OUTSIDE.search(line)]


def documented_files() -> list[Path]:
    files = [ROOT / "README.md"]
    for folder, pattern in (("docs", "*.md"), ("scripts", "*"), ("benchmarks", "*.py"), ("examples", "*")):
        files += [p for p in (ROOT / folder).rglob(pattern) if p.is_file() and p.suffix in (".md", ".py", ".sh", ".toml", ".yaml", ".json", "")]
    return files


def test_no_documented_command_reaches_outside_the_checkout():
    files = documented_files()
    assert len(files) > 20
    assert outside_references(files) == []


def test_the_check_finds_a_path_outside(tmp_path):
    doc = ROOT / "docs" / "results"
    probe = doc / "_probe_outside.md"
    probe.write_text("run --task-file ../shared/data/gsm8k/train.jsonl\n")
    try:
        assert outside_references([probe]) == ["docs/results/_probe_outside.md:1"]
    finally:
        probe.unlink()


def test_the_shipped_gsm8k_loads_as_task_files():
    for split, n in (("train", 7473), ("test", 1319)):
        path = ROOT / "data" / "gsm8k" / f"{split}.jsonl"
        assert sum(1 for _ in path.open(encoding="utf-8")) == n
    assert (ROOT / "data" / "gsm8k" / "LICENSE").read_text().startswith("MIT")
    task = load_task_file(ROOT / "data" / "gsm8k" / "train.jsonl")
    problems = task.problems("train", 4, seed=0)
    assert len(problems) == 4
    assert task.reward(problems[0], f"#### {problems[0].answer}") == 1.0
