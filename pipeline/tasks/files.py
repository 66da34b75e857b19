"""A task read from a local JSONL or Parquet file (GSM8K-style files work with no code change).

Rows are loaded through `datasets` (`load_dataset("json" | "parquet", data_files=...)`); nothing
is downloaded. The reference answer is extracted from the answer column by `answer_format`:
- "gsm8k": the text after the last "#### " (GSM8K's convention: "...#### 42");
- "plain": the whole cell;
- "auto" (default): "gsm8k" where the cell holds "####", else "plain";
- any other string: a regular expression whose first group (or whole match) is the answer.

Splits: a `split_col` names a column holding "train"/"heldout" (also "test"/"validation" ->
"heldout"); without it, a problem's split is a hash of its question, so the two never overlap.

Reward: numeric answers are compared as numbers (the completion's "#### x" if present, else its
last number; "1,234" and "$5" are understood); non-numeric answers as trimmed, case-folded
strings against the completion's last line. 0.0 for a wrong or unparsable completion, None when
the row's reference answer could not be extracted.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from pathlib import Path

from pipeline.errors import ConfigError, DataError
from pipeline.types import Problem

from .base import MathTask, number_reward, parse_number, split_of

__all__ = ["FileTaskConfig", "FileTask", "load_task_file", "extract_answer"]

_SPLIT_NAMES = {"train": "train", "heldout": "heldout", "test": "heldout", "validation": "heldout", "val": "heldout"}


@dataclass(frozen=True)
class FileTaskConfig:
    """Where a file task's rows come from and how to read them."""

    path: str
    """Local .jsonl/.json or .parquet file."""
    question_col: str = "question"
    """Column holding the question shown to the Solver."""
    answer_col: str = "answer"
    """Column holding the reference answer (possibly with a worked solution before "#### ")."""
    answer_format: str = "auto"
    """"auto", "gsm8k", "plain", or a regular expression (see the module docstring)."""
    hint_col: str | None = None
    """Optional column whose text becomes `Problem.hint`."""
    split_col: str | None = None
    """Optional column holding each row's split; else splits come from a hash of the question."""
    heldout_fraction: float = 0.1
    """Held-out share when splits are hashed."""
    name: str | None = None
    """Task name (default: the file's stem)."""

    def __post_init__(self) -> None:
        if not Path(self.path).is_file():
            raise ConfigError(f"task file path {self.path!r} is not a file")
        if _file_format(self.path) is None:
            raise ConfigError(f"task file path {self.path!r} must end in .jsonl, .json or .parquet")
        if not 0 < self.heldout_fraction < 1:
            raise ConfigError(f"heldout_fraction must be in (0, 1), got {self.heldout_fraction}")
        if self.answer_format not in ("auto", "gsm8k", "plain"):
            try:
                re.compile(self.answer_format)
            except re.error as e:
                raise ConfigError(f"answer_format is neither auto/gsm8k/plain nor a valid regex: {e}") from e


def _file_format(path: str) -> str | None:
    suffix = Path(path).suffix.lower()
    return {".jsonl": "json", ".json": "json", ".parquet": "parquet"}.get(suffix)


def extract_answer(cell: object, answer_format: str = "auto") -> str | None:
    """The reference answer held in an answer cell, or None if it cannot be extracted."""
    if cell is None:
        return None
    text = str(cell)
    fmt = answer_format
    if fmt == "auto":
        fmt = "gsm8k" if "####" in text else "plain"
    if fmt == "gsm8k":
        if "####" not in text:
            return None
        out = text.rsplit("####", 1)[1].strip()
    elif fmt == "plain":
        out = text.strip()
    else:
        m = re.search(fmt, text)
        if not m:
            return None
        out = (m.group(1) if m.groups() else m.group(0)).strip()
    if not out:
        return None
    num = parse_number(out)
    if num is not None:  # canonical numeric form: "1,234" -> "1234", "5.0" -> "5"
        out = str(int(num)) if num == int(num) else repr(num)
    return out


class FileTask(MathTask):
    """Problems from a local file; see the module docstring. Prompts, feedback and verdicts are
    `MathTask`'s."""

    def __init__(self, config: FileTaskConfig) -> None:
        import datasets

        self.config = config
        self.name = config.name or Path(config.path).stem
        ds = datasets.load_dataset(_file_format(config.path), data_files=str(config.path), split="train")
        for col in (config.question_col, config.answer_col, config.hint_col, config.split_col):
            if col is not None and col not in ds.column_names:
                raise ConfigError(f"column {col!r} not in {config.path} (columns: {ds.column_names})")
        self._by_split: dict[str, list[Problem]] = {"train": [], "heldout": []}
        for i, row in enumerate(ds):
            question = row[config.question_col]
            if question is None or not str(question).strip():
                raise DataError(f"row {i} of {config.path} has an empty {config.question_col!r}")
            question = str(question)
            answer = extract_answer(row[config.answer_col], config.answer_format)
            if config.split_col is not None:
                raw = str(row[config.split_col]).lower()
                if raw not in _SPLIT_NAMES:
                    raise DataError(f"row {i} of {config.path}: {config.split_col}={raw!r} is not a split name")
                split = _SPLIT_NAMES[raw]
            else:
                split = split_of(question, config.heldout_fraction, salt=f"{self.name}:")
            hint = row[config.hint_col] if config.hint_col else None
            self._by_split[split].append(
                Problem(
                    uid=f"{self.name}:{i}",
                    question=question,
                    answer="" if answer is None else answer,
                    split=split,
                    hint=None if hint is None else str(hint),
                    meta=(("task", self.name), ("row", str(i))),
                )
            )

    def __len__(self) -> int:
        return sum(len(v) for v in self._by_split.values())

    def problems(self, split: str, n: int, seed: int) -> list[Problem]:
        """Up to `n` distinct problems of `split`, a seeded shuffle of the file's rows (all of
        them when the split holds fewer than `n`)."""
        if split not in self._by_split:
            raise ConfigError(f"split must be 'train' or 'heldout', got {split!r}")
        if n < 0:
            raise ConfigError(f"n must be >= 0, got {n}")
        pool = list(self._by_split[split])
        random.Random(f"{self.name}:{split}:{seed}").shuffle(pool)
        return pool[:n]

    def reward(self, problem: Problem, completion_text: str) -> float | None:
        """Numeric answers: `number_reward`; other answers: 1.0 if the completion's last line
        equals the answer (trimmed, case-folded), else 0.0; None without a reference answer."""
        if not problem.answer:
            return None
        ref = parse_number(problem.answer)
        if ref is not None:
            return number_reward(ref, completion_text)
        lines = [ln for ln in completion_text.strip().splitlines() if ln.strip()]
        if not lines:
            return 0.0
        return 1.0 if lines[-1].strip().casefold() == problem.answer.strip().casefold() else 0.0


def load_task_file(
    path: str | Path,
    question_col: str = "question",
    answer_col: str = "answer",
    answer_format: str = "auto",
    hint_col: str | None = None,
    split_col: str | None = None,
    heldout_fraction: float = 0.1,
    name: str | None = None,
) -> FileTask:
    """A task over the rows of a local JSONL/Parquet file, e.g. `load_task_file("gsm8k/train.jsonl")`."""
    return FileTask(
        FileTaskConfig(
            path=str(path),
            question_col=question_col,
            answer_col=answer_col,
            answer_format=answer_format,
            hint_col=hint_col,
            split_col=split_col,
            heldout_fraction=heldout_fraction,
            name=name,
        )
    )
