"""A task read from a local JSONL or Parquet file (GSM8K-style files work with no code change).

Rows are loaded through `datasets` (`load_dataset("json" | "parquet", data_files=...)`); nothing
is downloaded. The reference answer is extracted from the answer column by `answer_format`:
- "gsm8k": the text after the last "#### " (GSM8K's convention: "...#### 42");
- "plain": the whole cell;
- "auto" (default): "gsm8k" where the cell holds "####", else "plain";
- any other string: a regular expression whose first group (or whole match) is the answer.

Splits: a `split_col` names a column holding "train"/"heldout" (also "test"/"validation"/"val" ->
"heldout"); without it, a problem's split is a hash of its question, so the two never overlap.

Reward (`math_answer_reward`): 1.0 when the completion's answer equals the reference, checked
two ways, either of which suffices:
- exactly: numeric references as numbers (the completion's "#### x" if present, else its last
  number; "1,234" and "$5" are understood), other references as trimmed, case-folded strings
  against the completion's last line;
- mathematically, with HF's math-verify (`parse` + `verify`): the completion's final answer (the
  text after its last "####", else the whole completion: a `\boxed{}` or its last expression)
  against the reference read as LaTeX, so "\frac{1}{2}", "0.5" and "1/2" are one answer, as
  are "72" and "72.00". Its own signal-based time limits only work on the main thread: off it
  (the rollouts score rewards on a worker thread) they are off and the rollouts' guard
  (`pipeline.rollout.rewards.safe_map`, `reward_timeout`) bounds the call instead, turning a hang into a
  null reward with a `reward_error`.
0.0 for a wrong or unparsable completion, None when the row's reference answer could not be
extracted by `answer_format`.

Prompts: `pipeline.tasks.prompts.CHAIN_OF_THOUGHT_PROMPTS` (step by step, "#### <number>"; a
Verifier that checks the whole solution and ends with "Verdict: yes|no"), or a prompt file's.
Budgets: 512 tokens per agent call in rollouts and in the evaluation (room for the reasoning),
unless the `max_tokens` / `eval_max_tokens` settings say otherwise.

Bad files are `DataError`s naming the file and the row or column: an empty file (or one without
rows), text that is not UTF-8 (with the line), a missing question/answer column (also a
`ConfigError` naming `question_col`/`answer_col`), an empty question or answer cell (the rows).
"""

from __future__ import annotations

import logging
import random
import re
import threading
from dataclasses import dataclass
from pathlib import Path

from pipeline.errors import ConfigError, DataError
from pipeline.types import Problem

from .base import MathTask, number_reward, parse_number, split_of
from .prompts import CHAIN_OF_THOUGHT_PROMPTS, PromptTemplate, load_prompt_file

__all__ = ["FileTaskConfig", "FileTask", "load_task_file", "extract_answer", "math_answer_reward", "math_verify_equal"]

MATH_VERIFY_SECONDS = 5
"""math-verify's own time limit per parse/verify call (main thread only, see the module docstring)."""
_MAX_NAMED_ROWS = 10

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


def _final_answer_text(completion_text: str) -> str:
    """The part of a completion that states its final answer: the rest of the line after its
    last "####", else the whole completion."""
    if "####" in completion_text:
        rest = completion_text.rsplit("####", 1)[1].strip()
        return rest.splitlines()[0] if rest else ""
    return completion_text


class _GuardedTimeoutNotice(logging.Filter):
    """Drops math-verify's warning that its time limit is off: off the main thread the rollouts'
    guard (`reward_timeout`) bounds every reward call instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Timeout is disabled" not in record.getMessage()


for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).addFilter(_GuardedTimeoutNotice())


def math_verify_equal(reference: str, completion_text: str) -> bool:
    """Whether math-verify finds the completion's final answer equal to `reference` (read as
    LaTeX). Off the main thread its signal-based time limits are off (see the module docstring)."""
    from math_verify import parse, verify

    limit = MATH_VERIFY_SECONDS if threading.current_thread() is threading.main_thread() else None
    answer = _final_answer_text(completion_text)
    if not answer.strip():
        return False
    gold = parse(reference if "$" in reference else f"${reference}$", parsing_timeout=limit)
    if not gold:
        return False
    pred = parse(answer, parsing_timeout=limit)
    return bool(pred) and bool(verify(gold, pred, timeout_seconds=limit))


def math_answer_reward(reference: str, completion_text: str) -> float:
    """1.0 when the completion's answer equals `reference` exactly (numbers as numbers, other
    answers as the last line, case-folded) or by math-verify; else 0.0 (see the module docstring)."""
    ref = parse_number(reference)
    if ref is not None:
        if number_reward(ref, completion_text) == 1.0:
            return 1.0
    else:
        lines = [ln for ln in completion_text.strip().splitlines() if ln.strip()]
        if lines and lines[-1].strip().casefold() == reference.strip().casefold():
            return 1.0
    return 1.0 if math_verify_equal(reference, completion_text) else 0.0


def _rows_text(rows: list[int]) -> str:
    """"row 3", or "rows 1, 4, 9 (3 in all)" (the first ten named); rows count from 0."""
    if len(rows) == 1:
        return f"row {rows[0]}"
    shown = ", ".join(map(str, rows[:_MAX_NAMED_ROWS]))
    more = f" and {len(rows) - _MAX_NAMED_ROWS} more" if len(rows) > _MAX_NAMED_ROWS else ""
    return f"rows {shown}{more} ({len(rows)} in all)"


def check_task_file_text(path: str | Path) -> None:
    """The checks a JSONL/JSON task file's bytes must pass before parsing: not empty, UTF-8 (a
    `DataError` naming the file, and the line and byte of the first bad byte)."""
    p = Path(path)
    data = p.read_bytes()
    if not data.strip():
        raise DataError(f"task file {p} is empty")
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise DataError(f"task file {p} is not UTF-8 text: line {line} (byte {exc.start}): {exc.reason}") from None


def bad_json_line(path: str | Path) -> str | None:
    """"line N: <what is wrong>" for the first non-blank line of a JSON-lines file that is not a
    JSON object, or None when every line is one (the file may then be a JSON document spanning
    lines, whose error the reader names)."""
    import json

    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                value = json.loads(line.rstrip("\r\n"))
            except json.JSONDecodeError as exc:
                return f"line {n}: {exc.msg} at column {exc.colno}"
            if not isinstance(value, dict):
                return f"line {n}: a JSON {type(value).__name__}, not an object with the question and answer columns"
    return None


def check_parquet_file(path: str | Path) -> None:
    """A Parquet task file must be non-empty, readable as Parquet and hold rows (a `DataError`
    naming the file otherwise); its footer alone is read."""
    import pyarrow.parquet as pq

    p = Path(path)
    if p.stat().st_size == 0:
        raise DataError(f"task file {p} is empty")
    try:
        rows = pq.ParquetFile(p).metadata.num_rows
    except Exception as exc:  # noqa: BLE001 - pyarrow's errors for a damaged file vary
        raise DataError(f"task file {p} cannot be read as Parquet: {type(exc).__name__}: {exc}") from None
    if rows == 0:
        raise DataError(f"task file {p} has no rows")


class FileTask(MathTask):
    """Problems from a local file; see the module docstring. Prompts: `prompts` (default: the
    chain-of-thought template); feedback and verdicts follow them (`MathTask`)."""

    prompts = CHAIN_OF_THOUGHT_PROMPTS
    default_max_tokens = 512
    default_eval_max_tokens = 512

    def __init__(self, config: FileTaskConfig, prompts: PromptTemplate | None = None) -> None:
        import datasets

        self.config = config
        self.name = config.name or Path(config.path).stem
        if prompts is not None:
            self.prompts = prompts
        fmt = _file_format(config.path)
        if fmt == "json":
            check_task_file_text(config.path)
        else:
            check_parquet_file(config.path)
        try:
            datasets.disable_progress_bars()  # a task file's "Generating train split" bars are not the run's progress
            ds = datasets.load_dataset(fmt, data_files=str(config.path), split="train")
        except Exception as exc:  # noqa: BLE001 - arrow and datasets fail in many ways on a bad file
            where = bad_json_line(config.path) if fmt == "json" else None
            raise DataError(
                f"task file {config.path} cannot be read as {'JSON lines' if fmt == 'json' else 'Parquet'}: "
                + (where or f"{type(exc).__name__}: {exc}")
            ) from None
        if ds.num_rows == 0:
            raise DataError(f"task file {config.path} has no rows")
        for setting in ("question_col", "answer_col", "hint_col", "split_col"):
            col = getattr(config, setting)
            if col is not None and col not in ds.column_names:
                raise ConfigError(f"column {col!r} not in {config.path} ({setting}; the file's columns: {ds.column_names})")
        questions, answers = ds[config.question_col], ds[config.answer_col]
        for setting, cells in (("question_col", questions), ("answer_col", answers)):
            empty = [i for i, cell in enumerate(cells) if cell is None or not str(cell).strip()]
            if empty:
                verb = "has" if len(empty) == 1 else "have"
                raise DataError(f"task file {config.path}: {_rows_text(empty)} {verb} an empty {getattr(config, setting)!r} ({setting})")
        self._by_split: dict[str, list[Problem]] = {"train": [], "heldout": []}
        for i, row in enumerate(ds):
            question = str(row[config.question_col])
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
        """`math_answer_reward` against the reference; None without a reference answer (one
        `answer_format` could not extract)."""
        if not problem.answer:
            return None
        return math_answer_reward(problem.answer, completion_text)


def load_task_file(
    path: str | Path,
    question_col: str = "question",
    answer_col: str = "answer",
    answer_format: str = "auto",
    hint_col: str | None = None,
    split_col: str | None = None,
    heldout_fraction: float = 0.1,
    name: str | None = None,
    prompts: PromptTemplate | None = None,
    prompt_file: str | Path | None = None,
) -> FileTask:
    """A task over the rows of a local JSONL/Parquet file, e.g. `load_task_file("gsm8k/train.jsonl")`.
    `prompts` or `prompt_file` (TOML/JSON, over the chain-of-thought template) set its prompts."""
    if prompt_file is not None:
        prompts = load_prompt_file(prompt_file, prompts or CHAIN_OF_THOUGHT_PROMPTS)
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
        ),
        prompts=prompts,
    )
