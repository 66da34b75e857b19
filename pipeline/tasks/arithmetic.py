"""The default task: synthetic two-digit addition, generated from a seed (by default operands
10..99 and the operator "+"; `max_operand=999` gives three digits, `ops="+-"` adds subtraction).

Formats (what the default model is warm-started on, see `pipeline.workflows.math.warmstart`):
- Solver: one user message with the question, e.g. "12+45="; the answer is the bare number
  ("57") and the assistant turn ends with EOS.
- Verifier: user message "<question>\\nCheck it: work it out again." (it is not shown the
  Solver's answer); it replies with the sum ("57"), and its verdict is whether that sum equals
  the Solver's answer (verdict style "compare").
- Hint (`Problem.hint`, shown by the `prompt_aug` strategy as a system message "Hint: ..."): by
  default the tens digit of the answer ("the tens digit is 5"). Errors of a small model sit in
  the middle digits (the carries), not in the first one, so the hint names exactly the digit
  most often wrong while leaving the rest to the model; `hint="prefix"` gives every digit but
  the last ("5_"), a stronger hint that leaves little to learn from; `hint="none"` gives none.
- Feedback: after a wrong attempt "That is wrong. Try again.", after a right one
  "That is right. Say it again.".
These are `pipeline.tasks.prompts.ARITHMETIC_PROMPTS`; a prompt file (`prompts=`) replaces them,
but the default model only knows these. Budgets: 16 tokens per agent call, in rollouts and in
the evaluation (the answers are a few digits).

Reward: 1.0 when the completion's number equals the answer, 0.0 when it is another number or
no number at all (unparsable answers are wrong answers, so they are scored, not dropped); None
only when the problem's own reference answer is not an integer (a hand-built problem gone bad).

Splits: a problem's split is a hash of its canonical form (`pipeline.tasks.base.canonical_expression`:
the operands of "+" sorted, "-" as written), so "train" and "heldout" can never share a problem,
whatever the seed or the number of problems asked for, and a+b and b+a, one sum written two ways,
are always on the same side (a model trained on 45+12 is never scored on 12+45 as if it were
new). `SPLIT_RULE` names the rule; the default model's cache key holds it, because its warm start
trains on the train split.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

from pipeline.errors import ConfigError
from pipeline.types import Problem

from .base import MathTask, canonical_expression, draw_distinct, number_reward, parse_number, split_of
from .prompts import ARITHMETIC_PROMPTS, PromptTemplate

__all__ = ["ArithmeticConfig", "ArithmeticTask", "make_hint", "SPLIT_RULE"]

SPLITS = ("train", "heldout")

SPLIT_RULE = "canonical-expression"
"""The name of the split rule (a hash of the problem's canonical form). Change it with the rule:
models warm-started on the train split (`pipeline.workflows.math.model`) hash it into their cache
key, so a model trained under another split is never reused."""


@dataclass(frozen=True)
class ArithmeticConfig:
    """Settings of the synthetic arithmetic task."""

    min_operand: int = 10
    """Smallest operand (10 = two digits)."""
    max_operand: int = 99
    """Largest operand (99, the default: two digits, small enough for the embedded default model
    to learn in its warm start on a CPU; 999 gives three digits)."""
    ops: str = "+"
    """Operators to draw from: any of "+" and "-" (default "+"; "+-" adds subtraction).
    Subtractions keep a >= b (no negative answers)."""
    heldout_fraction: float = 0.12
    """Fraction of the problems' canonical forms (a+b and b+a are one) that belong to the held-out
    split. 0.12 and not 0.1: the default range has 4,095 sums up to order, and a tenth of them
    (375 under the hash) is fewer than the 400 distinct held-out problems an evaluation may ask
    for; 0.12 holds 459."""
    hint: Literal["tens", "prefix", "none"] = "tens"
    """What `Problem.hint` holds: the answer's tens digit, all its digits but the last, or nothing."""

    def __post_init__(self) -> None:
        if not 0 <= self.min_operand <= self.max_operand:
            raise ConfigError(
                f"arithmetic.min_operand/max_operand must satisfy 0 <= min <= max, got {self.min_operand}, {self.max_operand}"
            )
        if not self.ops or set(self.ops) - set("+-"):
            raise ConfigError(f"arithmetic.ops must be a non-empty string of '+' and '-', got {self.ops!r}")
        if not 0 < self.heldout_fraction < 1:
            raise ConfigError(f"arithmetic.heldout_fraction must be in (0, 1), got {self.heldout_fraction}")
        if self.hint not in ("tens", "prefix", "none"):
            raise ConfigError(f"arithmetic.hint must be 'tens', 'prefix' or 'none', got {self.hint!r}")


@lru_cache(maxsize=1 << 16)
def _canonical(a: int, op: str, b: int) -> str:
    # cached: the warm start asks for the split of every example it draws
    form = canonical_expression(f"{a}{op}{b}")
    if form is None:  # the config admits only integers and "+", "-": this would be a bug
        raise ConfigError(f"arithmetic: {a}{op}{b} is not an expression")
    return form


def make_hint(answer: int, kind: str) -> str | None:
    """The hint text for `answer` (see the module docstring)."""
    if kind == "none":
        return None
    digits = str(answer)
    if kind == "tens":
        tens = digits[-2] if len(digits) >= 2 else "0"
        return f"the tens digit is {tens}"
    if kind == "prefix":
        return digits[:-1] + "_"
    raise ConfigError(f"unknown hint kind {kind!r}")


class ArithmeticTask(MathTask):
    """Synthetic addition/subtraction; see the module docstring for formats and rewards. Prompts,
    feedback and verdicts are `MathTask`'s."""

    name = "arithmetic"
    prompts = ARITHMETIC_PROMPTS

    def __init__(self, config: ArithmeticConfig | None = None, prompts: PromptTemplate | None = None, **options) -> None:
        if config is not None and options:
            raise ConfigError("pass either an ArithmeticConfig or keyword options, not both")
        self.config = config if config is not None else ArithmeticConfig(**options)
        if prompts is not None:  # else the class's ARITHMETIC_PROMPTS (what the default model knows)
            self.prompts = prompts

    # -- problems ---------------------------------------------------------------------------
    def canonical(self, a: int, op: str, b: int) -> str:
        """The problem's canonical form: "12+45" for 45+12 and 12+45; "45-12" as written."""
        return _canonical(a, op, b)

    def split_of(self, a: int, op: str, b: int) -> str:
        """ "train" or "heldout": a hash of the canonical form, so a+b and b+a share a side."""
        return split_of(self.canonical(a, op, b), self.config.heldout_fraction, salt="arithmetic:")

    def make_problem(self, a: int, op: str, b: int) -> Problem:
        """The problem "a op b=" with its answer, hint and split."""
        answer = a + b if op == "+" else a - b
        question = f"{a}{op}{b}="
        return Problem(
            uid=f"arithmetic:{a}{op}{b}",
            question=question,
            answer=str(answer),
            split=self.split_of(a, op, b),
            hint=make_hint(answer, self.config.hint),
            meta=(("task", self.name), ("op", op)),
        )

    def sample_operands(self, rng: random.Random) -> tuple[int, str, int]:
        c = self.config
        op = rng.choice(c.ops)
        a = rng.randint(c.min_operand, c.max_operand)
        b = rng.randint(c.min_operand, c.max_operand)
        if op == "-" and a < b:
            a, b = b, a
        return a, op, b

    def problems(self, split: str, n: int, seed: int) -> list[Problem]:
        """`n` problems of `split` with distinct canonical forms (never both a+b and b+a),
        drawn uniformly from the operand range with `seed`."""
        if split not in SPLITS:
            raise ConfigError(f"split must be one of {SPLITS}, got {split!r}")
        if n < 0:
            raise ConfigError(f"n must be >= 0, got {n}")
        rng = random.Random(f"arithmetic:{split}:{seed}")

        def draw() -> tuple:
            key = self.sample_operands(rng)
            return self.canonical(*key), key

        keys = draw_distinct(n, draw, lambda key: self.split_of(*key) == split,
                             f"cannot draw {n} distinct {split} problems from the configured operand range")
        return [self.make_problem(*key) for key in keys]

    # -- scoring ----------------------------------------------------------------------------
    def reward(self, problem: Problem, completion_text: str) -> float | None:
        """1.0 if the last number of the completion equals the answer; 0.0 if it differs or
        the completion holds no number; None if the reference answer is not an integer."""
        ref = parse_number(problem.answer)
        if ref is None or ref != int(ref):
            return None
        return number_reward(ref, completion_text)
