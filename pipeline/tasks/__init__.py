"""Tasks: problems with a verifiable answer, each with its reward beside it. Both subclass
`MathTask` (`pipeline.tasks.base`: the shared prompts, feedback turn and verdict parsing) and
keep only their problems and reward; the `Task` protocol is the contract the pipeline relies on.

- `arithmetic` (default): synthetic two-digit addition (three digits and subtraction as
  options), no download (`pipeline.tasks.arithmetic`).
- `file`: problems from a local JSONL/Parquet file, GSM8K-style files included
  (`pipeline.tasks.files.load_task_file`).

Each task carries its prompts (`pipeline.tasks.prompts.PromptTemplate`: the arithmetic task's
bare question, the file tasks' chain of thought), replaceable by a TOML/JSON prompt file
(`prompt_file=`), and its completion budgets (`default_max_tokens`, `default_eval_max_tokens`:
arithmetic 16, file tasks 512), used where the settings leave them None (`budget_of`).
"""

from __future__ import annotations

from pathlib import Path

from pipeline.errors import ConfigError

from .arithmetic import ArithmeticConfig, ArithmeticTask
from .base import MathTask, Task, budget_of, number_reward, parse_verdict
from .files import FileTask, FileTaskConfig, extract_answer, load_task_file, math_answer_reward
from .prompts import ARITHMETIC_PROMPTS, CHAIN_OF_THOUGHT_PROMPTS, PromptTemplate, load_prompt_file, parse_marked_verdict

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
    "build_task",
    "budget_of",
    "math_answer_reward",
    "PromptTemplate",
    "ARITHMETIC_PROMPTS",
    "CHAIN_OF_THOUGHT_PROMPTS",
    "load_prompt_file",
    "parse_marked_verdict",
    "TASK_NAMES",
]

TASK_NAMES = ("arithmetic", "file")


def make_task(name: str = "arithmetic", prompt_file: str | Path | None = None, **options) -> Task:
    """Build a task by name: `make_task("arithmetic", hint="prefix")`,
    `make_task("file", path="gsm8k.jsonl", answer_format="gsm8k")`; a name that is itself a
    path to a .jsonl/.json/.parquet file loads that file (`make_task("data/gsm8k.jsonl")`).
    `prompt_file`: a TOML/JSON prompt file over the task's own prompts."""
    if name == "arithmetic":
        prompts = load_prompt_file(prompt_file, ARITHMETIC_PROMPTS) if prompt_file is not None else None
        return ArithmeticTask(prompts=prompts, **options)
    if prompt_file is not None:
        options["prompt_file"] = prompt_file
    if name == "file":
        if "path" not in options:
            raise ConfigError("task 'file' needs a path= option")
        return load_task_file(**options)
    if Path(name).suffix.lower() in (".jsonl", ".json", ".parquet"):
        return load_task_file(name, **options)
    raise ConfigError(f"unknown task {name!r}; choose from {list(TASK_NAMES)} or give a .jsonl/.parquet path")


def build_task(task: str = "arithmetic", task_file: str | None = None, prompt_file: str | None = None) -> Task:
    """The task of a run's settings (`task`, `task_file`, `prompt_file`): the file task when
    `task_file` is given, else the named task. Loading it checks the file (a bad one is a
    `DataError`/`ConfigError` naming it), so the command line calls it before anything is written."""
    if task_file:
        return load_task_file(task_file, prompt_file=prompt_file)
    return make_task(task, prompt_file=prompt_file)
