"""The Verifier's fixed, balanced set of `math_review` (`pipeline.workflows.math.review`): held-out
problems, each once with its right answer and once with a near miss (one carry dropped, one digit
off), fixed by a seed; and the near misses its warm start (`review_model.py`) trains on."""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Sequence

from pipeline.errors import ConfigError
from pipeline.tasks.answers import last_number
from pipeline.types import Problem

__all__ = ["REVIEW_SET_SIZE", "ReviewPair", "near_miss", "balanced_review_set", "review_set_metrics", "verdict_of"]


REVIEW_SET_SIZE = 250
"""Held-out problems in the balanced set (each twice: 250 right answers and 250 near misses)."""


@dataclass(frozen=True)
class ReviewPair:
    """One (problem, proposed answer) pair of the balanced set."""

    problem: Problem
    """A held-out problem."""
    answer: str
    """The proposed answer, as the Solver would write it (a bare number)."""
    right: bool
    """Whether `answer` is the problem's answer."""
    kind: str
    """"right", or how the wrong answer was made: "carry" (one carry dropped) or "digit" (one digit off)."""


_SUM = re.compile(r"^\s*(\d+)\s*([+-])\s*(\d+)\s*=\s*$")


def _carry_positions(a: int, op: str, b: int) -> list[int]:
    """The digit positions (0 = units) whose column of `a op b` carries (borrows) into the next."""
    out, carry, i = [], 0, 0
    while a or b:
        x, y = a % 10, b % 10
        column = x + y + carry if op == "+" else x - y - carry
        carry = int(column >= 10) if op == "+" else int(column < 0)
        if carry:
            out.append(i)
        a, b, i = a // 10, b // 10, i + 1
    return out


def _carry_dropped(a: int, op: str, b: int, rng: random.Random) -> int | None:
    """`a op b` with one of its carries (borrows) dropped, the slip a small model makes in the
    middle digits; None when the sum has no carry."""
    positions = _carry_positions(a, op, b)
    if not positions:
        return None
    i = rng.choice(positions)
    answer = a + b if op == "+" else a - b
    return answer - 10 ** (i + 1) if op == "+" else answer + 10 ** (i + 1)


def _digit_off(answer: int, rng: random.Random) -> int:
    """`answer` with one digit changed (a leading digit never to 0)."""
    digits = list(str(answer))
    i = rng.randrange(len(digits))
    choices = [d for d in "0123456789" if d != digits[i] and not (i == 0 and d == "0" and len(digits) > 1)]
    digits[i] = rng.choice(choices)
    return int("".join(digits))


def near_miss(problem: Problem, rng: random.Random, kind: str | None = None) -> int:
    """A plausible wrong answer to `problem` (an integer answer): one carry dropped ("carry", for
    "a+b=" / "a-b=" questions that carry), else one digit off ("digit"). `kind` None: either, at
    random."""
    return _near_miss(problem, rng, kind)[0]


def _near_miss(problem: Problem, rng: random.Random, kind: str | None) -> tuple[int, str]:
    """`near_miss` and the kind it made."""
    ref = last_number(problem.answer)  # "42.0", "1,234", "#### 42": the number the answer checker reads
    if ref is None or ref != int(ref):
        raise ConfigError(f"near miss: problem {problem.uid!r} has answer {problem.answer!r}, not an integer")
    answer = int(ref)
    kind = kind or rng.choice(("carry", "digit"))
    m = _SUM.match(problem.question)
    if kind == "carry" and m:
        wrong = _carry_dropped(int(m.group(1)), m.group(2), int(m.group(3)), rng)
        if wrong is not None and wrong != answer:
            return wrong, "carry"
    return _digit_off(answer, rng), "digit"


def balanced_review_set(task, size: int = REVIEW_SET_SIZE, seed: int = 0) -> list[ReviewPair]:
    """`size` held-out problems of `task` (integer answers), each twice: with its right answer and
    with a near miss (alternately "carry" and "digit"; a sum without a carry gets a digit off),
    fixed by `seed`. Problems whose reference answer is not an integer are refused (one line)."""
    problems = task.problems("heldout", size, seed=50_000 + seed)
    rng = random.Random(f"review-set:{seed}")
    out: list[ReviewPair] = []
    for i, p in enumerate(problems):
        ref = last_number(p.answer)
        if ref is None or ref != int(ref):
            raise ConfigError(f"balanced review set: problem {p.uid!r} has answer {p.answer!r}, not an integer")
        wrong, made = _near_miss(p, rng, "carry" if i % 2 == 0 else "digit")
        out.append(ReviewPair(p, str(int(ref)), True, "right"))
        out.append(ReviewPair(p, str(wrong), False, made))
    return out


def review_set_metrics(task, pairs: Sequence[ReviewPair], verdicts: Sequence[bool | None]) -> dict[str, float]:
    """The Verifier's accuracy on the right and on the wrong answers of the set (an unparsable
    verdict is wrong), their mean (balanced accuracy) and the share of parsable verdicts."""
    on_right = [v is True for v, pr in zip(verdicts, pairs) if pr.right]
    on_wrong = [v is False for v, pr in zip(verdicts, pairs) if not pr.right]
    if not on_right or not on_wrong:
        raise ConfigError("balanced review set: needs right and wrong answers")
    right, wrong = sum(on_right) / len(on_right), sum(on_wrong) / len(on_wrong)
    return {"right": right, "wrong": wrong, "balanced": (right + wrong) / 2, "parsable": sum(v is not None for v in verdicts) / len(verdicts)}


def verdict_of(task, text: str) -> bool | None:
    """The task's verdict on a Verifier reply; a parser that raises reads as unparsable."""
    try:
        v = task.parse_verdict(text)
    except Exception:  # noqa: BLE001 - a file task's parser may raise anything
        return None
    return v if v in (True, False) else None
