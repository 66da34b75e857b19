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

Splits: a problem's split is a hash of its operands and operator, so "train" and "heldout" can
never share a problem, whatever the seed or the number of problems asked for.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal

from pipeline.errors import ConfigError
from pipeline.types import Problem

from .base import MathTask, draw_distinct, number_reward, parse_number, split_of
from .prompts import ARITHMETIC_PROMPTS, PromptTemplate

__all__ = ["ArithmeticConfig", "ArithmeticTask", "make_hint"]

SPLITS = ("train", "heldout")


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
    heldout_fraction: float = 0.1
    """Fraction of all (a, op, b) triples that belong to the held-out split."""
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
    def split_of(self, a: int, op: str, b: int) -> str:
        return split_of(f"{a}{op}{b}", self.config.heldout_fraction, salt="arithmetic:")

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
        """`n` distinct problems of `split`, drawn uniformly from the operand range with `seed`."""
        if split not in SPLITS:
            raise ConfigError(f"split must be one of {SPLITS}, got {split!r}")
        if n < 0:
            raise ConfigError(f"n must be >= 0, got {n}")
        rng = random.Random(f"arithmetic:{split}:{seed}")

        def draw() -> tuple:
            key = self.sample_operands(rng)
            return key, key

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
