"""Tasks: problems with a verifiable answer, each with its reward beside it. Both subclass
`MathTask` (`pipeline.tasks.base`: the shared prompts, feedback turn and verdict parsing) and
keep only their problems and reward; the `Task` protocol is the contract the pipeline relies on.

- `arithmetic` (default): synthetic 2-3 digit addition/subtraction, no download
  (`pipeline.tasks.arithmetic`).
- `file`: problems from a local JSONL/Parquet file, GSM8K-style files included
  (`pipeline.tasks.files.load_task_file`).
"""

from __future__ import annotations

from pathlib import Path

from pipeline.errors import ConfigError

from .arithmetic import ArithmeticConfig, ArithmeticTask
from .base import MathTask, Task, number_reward, parse_verdict
from .files import FileTask, FileTaskConfig, extract_answer, load_task_file

__all__ = [
    "Task",
    "MathTask",
    "ArithmeticTask",
    "ArithmeticConfig",
    "FileTask",
    "FileTaskConfig",
    "load_task_file",
    "extract_answer",
    "parse_verdict",
    "number_reward",
    "make_task",
    "TASK_NAMES",
]

TASK_NAMES = ("arithmetic", "file")


def make_task(name: str = "arithmetic", **options) -> Task:
    """Build a task by name: `make_task("arithmetic", hint="prefix")`,
    `make_task("file", path="gsm8k.jsonl", answer_format="gsm8k")`; a name that is itself a
    path to a .jsonl/.json/.parquet file loads that file (`make_task("data/gsm8k.jsonl")`)."""
    if name == "arithmetic":
        return ArithmeticTask(**options)
    if name == "file":
        if "path" not in options:
            raise ConfigError("task 'file' needs a path= option")
        return load_task_file(**options)
    if Path(name).suffix.lower() in (".jsonl", ".json", ".parquet"):
        return load_task_file(name, **options)
    raise ConfigError(f"unknown task {name!r}; choose from {list(TASK_NAMES)} or give a .jsonl/.parquet path")
