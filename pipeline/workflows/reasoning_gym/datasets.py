"""reasoning-gym's datasets as a maxit task: the one place that imports `reasoning_gym`.

- `import_reasoning_gym()`: the library, or a one-line `ConfigError` naming the `envs` extra.
- `dataset_names()`, `dataset_options(name)`: what exists (the factory's registry, the fields of
  a dataset's config class); `generator_options(name, options)` checks and converts options
  given as `--workflow-options` values (a list option may be given as "a,b,c").
- `ReasoningGymTask`: a `MathTask` whose problems are the dataset's items and whose reward is
  1.0 when the dataset's own `score_answer(answer, entry)` is full marks or the answer is the
  reference itself, else 0.0.

Splits: item i of a dataset is generated with `Random(seed + i)`, so datasets of nearby seeds are
shifted copies of each other, and small generator spaces repeat questions under any seeds. An
item's split is therefore a hash of its question's canonical form
(`pipeline.tasks.base.canonical_question`: the one arithmetic expression it holds, its sums' terms
and its products' factors sorted, else the normalised text), and a split's problems have distinct
canonical forms: train and held-out never share a question, nor "Calculate 12 + 57." and
"Calculate 57 + 12.", whatever the seeds asked for. A question whose canonical form is a problem
of the arithmetic task ("12+57": two operands in its default range, its operator) takes that
task's split instead: the embedded reasoning-gym model starts from the math default model, whose
warm start trained on the arithmetic train split, so a sum held out here must be held out there.

Rewards: reasoning-gym's scorers give partial credit (basic_arithmetic's gives "1410" 0.75 when
the reference is "141", and "141.0" 0.6); a reward that high would count as a right answer (the
correctness rule is reward >= 0.5, `pipeline.rollout.rewards.is_correct`) and flatter every
success rate, so the reward is binary: a partly right answer is a wrong one.

Rewards from the stored rows: a problem's `answer` holds the dataset's entry minus its question,
as JSON (`{"answer": ..., "metadata": ...}`), so the `problems` table alone rebuilds the entry
the scorer needs; `rescore_steps` recomputes the answering agent's rewards of a `steps` table.
"""

from __future__ import annotations

import dataclasses
import json
import random
import re
from typing import Any, Mapping

from pipeline.errors import ConfigError, DataError
from pipeline.tasks.answers import numbers_equal, parse_number
from pipeline.tasks.base import MathTask, canonical_question, draw_distinct, split_of
from pipeline.tasks.prompts import ARITHMETIC_PROMPTS
from pipeline.types import Problem

__all__ = [
    "EXTRA", "SPLIT_RULE", "import_reasoning_gym", "dataset_names", "dataset_options", "generator_options", "extract_answer",
    "answers_agree", "ReasoningGymTask",
]

EXTRA = "envs"
"""The pyproject extra that installs reasoning-gym."""

SPLIT_RULE = "canonical-question, arithmetic problems by the arithmetic split; reward full marks or nothing"
"""The names of the split rule and the reward (`ReasoningGymTask.split_of`, `.reward`). Change it
with either: a model warm-started on the train split and stopped by the reward
(`pipeline.workflows.reasoning_gym.model`) should hash it into its cache key."""

_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.S)


def import_reasoning_gym():
    """The `reasoning_gym` module, or a one-line `ConfigError` saying how to install it."""
    try:
        import warnings

        with warnings.catch_warnings():  # a dependency's module warns on import (`is` with a literal)
            warnings.simplefilter("ignore", SyntaxWarning)
            import reasoning_gym
            import reasoning_gym.factory  # noqa: F401
    except ImportError as err:
        raise ConfigError(
            f"workflow 'reasoning_gym' needs the {EXTRA!r} extra (reasoning-gym): pip install -e .[{EXTRA}] "
            f"(scripts/setup.sh installs it); importing it failed: {err}"
        ) from None
    return reasoning_gym


def dataset_names() -> list[str]:
    """Every dataset reasoning-gym registers, sorted."""
    return sorted(import_reasoning_gym().factory.DATASETS)


def dataset_options(name: str) -> dict[str, dataclasses.Field]:
    """The options of dataset `name` (its config class's fields; `seed` and `size` are the
    workflow's), or a `ConfigError` listing the datasets."""
    registry = import_reasoning_gym().factory.DATASETS
    if name not in registry:
        raise ConfigError(f"workflow 'reasoning_gym': unknown dataset {name!r}; the datasets are: {', '.join(sorted(registry))}")
    return {f.name: f for f in dataclasses.fields(registry[name][1]) if f.name not in ("seed", "size")}


def _default_of(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def generator_options(name: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """`options` checked against dataset `name`'s config (a `ConfigError` naming the unknown
    ones and listing those it takes); a string given for a list or tuple option is split at
    commas ("+,-"). The config class itself then checks the values (`ReasoningGymTask`)."""
    fields = dataset_options(name)
    unknown = [k for k in options if k not in fields]
    if unknown:
        raise ConfigError(
            f"workflow 'reasoning_gym': dataset {name!r} has no option{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))} "
            f"(it takes: {', '.join(fields) or 'none'})"
        )
    out = {}
    for key, value in options.items():
        default = _default_of(fields[key])
        if isinstance(value, str) and isinstance(default, (list, tuple)):
            value = type(default)(v.strip() for v in value.split(",") if v.strip())
        out[key] = value
    return out


def extract_answer(text: str) -> str:
    """The answer an agent gave: the last `<answer>...</answer>` (reasoning-gym's convention for
    models that reason first), else the whole text; stripped."""
    tagged = _ANSWER_TAG.findall(text)
    return (tagged[-1] if tagged else text).strip()


def answers_agree(a: str, b: str) -> bool:
    """Whether two answers say the same: equal text, or equal numbers where both are one number."""
    a, b = extract_answer(a), extract_answer(b)
    if a and a == b:
        return True
    x, y = parse_number(a), parse_number(b)
    return x is not None and y is not None and numbers_equal(x, y)


class ReasoningGymTask(MathTask):
    """One reasoning-gym dataset as a task. The Solver sees the question alone; the Verifier
    works it out again blind ("compare", the arithmetic task's template, which the embedded
    model knows) and approves when its answer agrees with the Solver's (`answers_agree`)."""

    prompts = ARITHMETIC_PROMPTS

    def __init__(self, dataset: str, options: Mapping[str, Any] | None = None, heldout_fraction: float = 0.2, max_tokens: int = 16) -> None:
        self.dataset = dataset
        self.options = generator_options(dataset, dict(options or {}))
        self.name = f"reasoning_gym:{dataset}"
        if not (isinstance(heldout_fraction, (int, float)) and not isinstance(heldout_fraction, bool) and 0 < heldout_fraction < 1):
            raise ConfigError(f"workflow 'reasoning_gym': heldout_fraction must be in (0, 1), got {heldout_fraction!r}")
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise ConfigError(f"workflow 'reasoning_gym': max_tokens must be an integer >= 1, got {max_tokens!r}")
        self.heldout_fraction = float(heldout_fraction)
        self.default_max_tokens = self.default_eval_max_tokens = max_tokens
        self._scorer = self._make(seed=0, size=1)  # the options are checked here, once

    def _make(self, seed: int, size: int):
        rg = import_reasoning_gym()
        try:
            return rg.create_dataset(self.dataset, seed=seed, size=size, **self.options)
        except Exception as err:  # noqa: BLE001 - a generator's config may reject a value in any way
            msg = str(err).splitlines()[0] if str(err) else type(err).__name__
            raise ConfigError(f"workflow 'reasoning_gym': dataset {self.dataset!r} refused its options {self.options}: {type(err).__name__}: {msg}") from None

    # -- problems ---------------------------------------------------------------------------
    def split_of(self, question: str) -> str:
        """ "train" or "heldout": the arithmetic task's split where the question is one of its
        problems (module docstring), else a hash of the question's canonical form
        (`canonical_question`) at `heldout_fraction`."""
        form = canonical_question(question)
        return _arithmetic_split(form) or split_of(form, self.heldout_fraction, salt=f"reasoning_gym:{self.dataset}:")

    def problem_of(self, entry: Mapping[str, Any]) -> Problem:
        """The problem of one dataset entry: its question, and the rest of the entry as JSON."""
        question = str(entry["question"])
        stored = json.dumps({"answer": entry.get("answer"), "metadata": entry.get("metadata", {})}, sort_keys=True, default=str)
        uid = f"rg:{self.dataset}:{_digest(question)}"
        return Problem(uid=uid, question=question, answer=stored, split=self.split_of(question), meta=(("task", self.name),))

    def stream(self, split: str, seed: int):
        """The problems of `split` among the dataset's items from a seed drawn from `seed`, in
        order (a question may come again); it ends after 10,000 items in a row of the other split."""
        base = random.Random(f"reasoning_gym:{self.dataset}:{split}:{seed}").randrange(2**31)
        ds = self._make(seed=base, size=10**9)  # items are generated on access
        misses = 0
        for i in range(10**9):
            entry = _generate(ds, i)
            if entry is None:
                continue
            p = self.problem_of(entry)
            if p.split == split:
                misses = 0
                yield p
            else:
                misses += 1
                if misses >= 10_000:
                    return

    def problems(self, split: str, n: int, seed: int) -> list[Problem]:
        """`n` questions of `split` with distinct canonical forms (`stream`)."""
        if split not in ("train", "heldout"):
            raise ConfigError(f"split must be 'train' or 'heldout', got {split!r}")
        if n < 0:
            raise ConfigError(f"n must be >= 0, got {n}")
        items = self.stream(split, seed)

        def draw() -> tuple:
            p = next(items, None)
            return None if p is None else (canonical_question(p.question), p)

        return draw_distinct(n, draw, lambda p: True,
                             f"workflow 'reasoning_gym': dataset {self.dataset!r} with options {self.options} has too few distinct {split} questions for {n}", 20)

    # -- scoring ----------------------------------------------------------------------------
    def entry(self, problem: Problem) -> dict:
        """The dataset entry `score_answer` takes, rebuilt from the problem (a stored row's)."""
        try:
            stored = json.loads(problem.answer)
        except (json.JSONDecodeError, TypeError):
            raise DataError(f"problem {problem.uid!r}: its answer is not the JSON of a reasoning-gym entry: {str(problem.answer)[:80]!r}") from None
        if not isinstance(stored, dict) or "answer" not in stored:
            raise DataError(f"problem {problem.uid!r}: its answer is not the JSON of a reasoning-gym entry: {str(problem.answer)[:80]!r}")
        return {"question": problem.question, "answer": stored["answer"], "metadata": stored.get("metadata") or {}}

    def reference(self, problem: Problem) -> str:
        """The dataset's reference answer of `problem`."""
        return str(self.entry(problem)["answer"])

    def score(self, problem: Problem, completion_text: str) -> float:
        """The dataset's own score of the completion's answer (`extract_answer`), 0.0 .. 1.0,
        partial credit included."""
        return float(self._scorer.score_answer(answer=extract_answer(completion_text), entry=self.entry(problem)))

    def reward(self, problem: Problem, completion_text: str) -> float | None:
        """1.0 when the completion's answer is the dataset's reference (`extract_answer`, exact
        text) or the dataset scores it full marks, else 0.0: partial credit is a wrong answer."""
        entry, answer = self.entry(problem), extract_answer(completion_text)
        if answer and answer == str(entry["answer"]).strip():
            return 1.0
        return 1.0 if float(self._scorer.score_answer(answer=answer, entry=entry)) >= 1.0 else 0.0

    def parse_verdict(self, text: str, solution: str | None = None) -> bool | None:
        """The blind Verifier approves when its own answer agrees with the Solver's; None when
        it wrote nothing."""
        if not extract_answer(text):
            return None
        return answers_agree(text, solution or "")


ITEM_SECONDS = 2.0
"""An item whose generation takes longer is skipped (some generators, e.g. number_sequence's,
now and then build enormous integers for half a minute before discarding them)."""


class _SlowItem(Exception):
    pass


def _generate(ds, i: int) -> dict | None:
    """Item `i` of `ds`, or None when it takes over `ITEM_SECONDS` (timed with SIGALRM, so only
    where this runs in the main thread; elsewhere the item is waited for)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        return ds[i]

    def expire(signum, frame):
        raise _SlowItem

    import time

    previous = signal.signal(signal.SIGALRM, expire)
    outer, _ = signal.setitimer(signal.ITIMER_REAL, ITEM_SECONDS)  # an outer timer (pytest-timeout's) is put back after
    t0 = time.monotonic()
    try:
        return ds[i]
    except _SlowItem:
        return None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if outer:
            signal.setitimer(signal.ITIMER_REAL, max(outer - (time.monotonic() - t0), 1e-3))


_ARITHMETIC_FORM = re.compile(r"expr:(\d+)([+-])(\d+)")


def _arithmetic_split(form: str) -> str | None:
    """The default arithmetic task's split of a canonical form that is one of its problems, else None."""
    from pipeline.tasks.arithmetic import ArithmeticTask

    m = _ARITHMETIC_FORM.fullmatch(form)
    if m is None:
        return None
    task = ArithmeticTask()
    a, op, b, c = int(m[1]), m[2], int(m[3]), task.config
    if op not in c.ops or not (c.min_operand <= a <= c.max_operand and c.min_operand <= b <= c.max_operand):
        return None
    return task.split_of(a, op, b)


def _digest(text: str) -> str:
    import hashlib

    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()
