"""The `Task` protocol and the pieces every task shares: the number reward, the Verifier's
prompt, the split rule, and `MathTask`, the base class of the tasks whose answer is checked by a
parser (the prompts, feedback turn and verdict parsing they all use). Reading a reply (its number,
a verdict) is `pipeline.tasks.answers`'s, re-exported here.

A task is a set of problems with a verifiable answer and its reward beside it. Rewards return
`float | None`; None means "could not score" (the reference itself is unusable), and such rows
are kept out of group statistics downstream.
"""

from __future__ import annotations

import ast
import hashlib
import re
from abc import ABC, abstractmethod
from typing import Callable, Hashable, Protocol, TypeVar, runtime_checkable

from pipeline.errors import ConfigError
from pipeline.types import Message, Problem

from .answers import last_number, numbers_equal, parse_number, parse_verdict
from .prompts import ARITHMETIC_PROMPTS, PromptTemplate

__all__ = [
    "budget_of",
    "Task",
    "MathTask",
    "parse_number",
    "last_number",
    "numbers_equal",
    "number_reward",
    "parse_verdict",
    "verifier_prompt",
    "split_of",
    "canonical_expression",
    "canonical_question",
    "draw_distinct",
    "WRONG_FEEDBACK",
    "RIGHT_FEEDBACK",
]

WRONG_FEEDBACK = ARITHMETIC_PROMPTS.wrong_feedback
"""Feedback turn after an attempt the reward scores below 1 (the arithmetic task's)."""
RIGHT_FEEDBACK = ARITHMETIC_PROMPTS.right_feedback
"""Feedback turn after a right attempt (the second attempt should repeat it)."""


@runtime_checkable
class Task(Protocol):
    """A set of problems with a verifiable answer (docs/CONTRACTS.md)."""

    name: str

    def problems(self, split: str, n: int, seed: int) -> list[Problem]:
        """`n` problems of `split` ("train" | "heldout"), deterministic in `seed`."""
        ...

    def solver_messages(self, problem: Problem) -> list[Message]:
        """The plain first-turn Solver context."""
        ...

    def verifier_messages(self, problem: Problem, solver_text: str) -> list[Message]:
        """The Verifier's context: the question and the Solver's proposed answer."""
        ...

    def feedback_message(self, problem: Problem, attempt_text: str) -> Message:
        """The user turn that follows a Solver attempt in the two-turn feedback strategy."""
        ...

    def reward(self, problem: Problem, completion_text: str) -> float | None:
        """Solver reward: 1.0 right, 0.0 wrong or unparsable, None if the reference is unusable."""
        ...

    def parse_verdict(self, text: str) -> bool | None:
        """Verifier output -> approves? None = unparsable. (A task whose `verdict_reads_solution`
        is True is called as `parse_verdict(text, solution)` with the judged Solver reply.)"""
        ...


def number_reward(reference: float, completion_text: str) -> float:
    """1.0 if the completion's answer (its "#### x", else its last number) equals `reference`,
    0.0 if it is another number or the completion holds none (unparsable is wrong, not unscored)."""
    got = last_number(completion_text)
    return 1.0 if got is not None and numbers_equal(got, reference) else 0.0


def verifier_prompt(question: str, proposed: str) -> str:
    """The Verifier's user message: the question, the proposed answer, and the yes/no request."""
    return f"{question}\nProposed answer: {proposed.strip()}\nIs it right? Answer yes or no."


def split_of(key: str, heldout_fraction: float, salt: str = "") -> str:
    """"heldout" or "train", decided by a hash of `key` alone, so one problem can never be in both."""
    h = int.from_bytes(hashlib.blake2b(f"{salt}{key}".encode(), digest_size=8).digest(), "big")
    return "heldout" if (h / 2**64) < heldout_fraction else "train"


_EXPRESSION_RUN = re.compile(r"[-−(]*\s*\d[\d\s.+\-−*/×÷^()]*")
"""A run of characters that may hold an arithmetic expression (digits, operators, parentheses)."""
_SYMBOLS = str.maketrans({"×": "*", "÷": "/", "−": "-", "^": "**"})
_NON_COMMUTATIVE = {ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%", ast.Pow: "**"}


def canonical_expression(text: str) -> str | None:
    """The canonical form of an arithmetic expression (`text` is one expression and nothing
    else), or None when it is not one: the terms of a chain of + and - as a sorted multiset of
    signed terms, the factors of a chain of * sorted, each term and factor canonical in turn, so
    "57+12", "12+57" and "(12)+57" are one form and "a-b+c" is "a+c-b"; "/", "//", "%" and "**"
    keep their order. It is the key by which problems that are one problem written two ways share
    a split: a trained a+b never has its mirror b+a held out."""
    try:
        tree = ast.parse(text.translate(_SYMBOLS).strip(), mode="eval").body
        if not isinstance(tree, (ast.BinOp, ast.UnaryOp)):
            return None  # a bare number is not an expression
        return _canon(tree)
    except (SyntaxError, ValueError, RecursionError, MemoryError, _NotArithmetic):
        return None  # not an expression, or one too deep to read: the question's text decides


class _NotArithmetic(Exception):
    pass


def _canon(node: ast.AST) -> str:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return repr(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.UAdd):
        return _canon(node.operand)
    if isinstance(node, (ast.BinOp, ast.UnaryOp)) and isinstance(node.op, (ast.Add, ast.Sub, ast.USub)):
        terms: list[tuple[int, str]] = []
        _signed_terms(node, 1, terms)
        ordered = sorted(t for s, t in terms if s > 0) + sorted(t for s, t in terms if s < 0)
        signs = ["+"] * sum(s > 0 for s, _ in terms) + ["-"] * sum(s < 0 for s, _ in terms)
        body = "".join(sign + term for sign, term in zip(signs, ordered))
        return body[1:] if body.startswith("+") else body
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        factors: list[str] = []
        _factors(node, factors)
        return "*".join(sorted(_wrapped(f) for f in factors))
    if isinstance(node, ast.BinOp) and type(node.op) in _NON_COMMUTATIVE:
        return f"{_wrapped(_canon(node.left))}{_NON_COMMUTATIVE[type(node.op)]}{_wrapped(_canon(node.right))}"
    raise _NotArithmetic


def _signed_terms(node: ast.AST, sign: int, out: list[tuple[int, str]]) -> None:
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)):
        _signed_terms(node.left, sign, out)
        _signed_terms(node.right, sign if isinstance(node.op, ast.Add) else -sign, out)
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        _signed_terms(node.operand, -sign if isinstance(node.op, ast.USub) else sign, out)
    else:
        out.append((sign, _wrapped(_canon(node))))


def _factors(node: ast.AST, out: list[str]) -> None:
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        _factors(node.left, out)
        _factors(node.right, out)
    else:
        out.append(_canon(node))


def _wrapped(form: str) -> str:
    """`form` in parentheses unless it is one number (so "(a+b)*c" keeps its meaning)."""
    return form if re.fullmatch(r"\d+(\.\d*)?(e[-+]?\d+)?", form) else f"({form})"


def canonical_question(question: str) -> str:
    """The key a question's split is decided by: "expr:" and the canonical form of the one
    arithmetic expression it holds (`canonical_expression`; the wording around it is not part of
    the problem, so "Calculate 12 + 57." and "What is 57 + 12?" are one), else "text:" and the
    question lower-cased with its spacing and surrounding punctuation normalised."""
    found = set()
    for run in _EXPRESSION_RUN.findall(question):
        run = run.strip().rstrip(".=").strip()
        for candidate in (run, run.rstrip(")"), run.lstrip("(")):
            form = canonical_expression(candidate)
            if form is not None:
                found.add(form)
                break
    if len(found) == 1:
        return "expr:" + found.pop()
    return "text:" + " ".join(question.lower().split()).strip(" .?!:;=")


T = TypeVar("T")


def draw_distinct(n: int, draw: Callable[[], tuple[Hashable, T] | None], keep: Callable[[T], bool], refusal: str, tries_per_item: int = 200) -> list[T]:
    """`n` items with distinct keys, in the order drawn: `draw()` gives (key, item) or None (no
    item this time), `keep(item)` whether it belongs (e.g. its split). After
    `tries_per_item * (n + 10)` draws without enough of them, a `ConfigError` saying `refusal`."""
    out: dict[Hashable, T] = {}
    tries = 0
    while len(out) < n:
        tries += 1
        if tries > tries_per_item * (n + 10):
            raise ConfigError(refusal)
        drawn = draw()
        if drawn is None or drawn[0] in out or not keep(drawn[1]):
            continue
        out[drawn[0]] = drawn[1]
    return list(out.values())


def budget_of(task, setting: int | None, kind: str = "rollout") -> int:
    """A completion budget: `setting` when given, else the task's default for `kind`
    ("rollout": `default_max_tokens`, "eval": `default_eval_max_tokens`; 16 for a task that
    declares none, the arithmetic task's budget)."""
    if setting is not None:
        return int(setting)
    attr = {"rollout": "default_max_tokens", "eval": "default_eval_max_tokens"}[kind]
    return int(getattr(task, attr, 16))


class MathTask(ABC):
    """Base class of the tasks in this package: the Solver and the Verifier see the task's
    `prompts` (a `PromptTemplate`; by default the arithmetic task's: the bare question, and
    `verifier_prompt`), the feedback turn follows the task's own reward, verdicts are read as the
    template says. A subclass gives `name`, `problems` and `reward` (usually on top of
    `number_reward`); it satisfies the `Task` protocol, which stays the contract."""

    name: str
    """The task's name (written with every problem's `meta`)."""
    prompts: PromptTemplate = PromptTemplate()
    """The prompt template (instances may carry their own, e.g. from a prompt file); by default
    the bare question, and a Verifier asked for yes/no and read by its first word."""
    default_max_tokens: int = 16
    """Completion budget of an agent call in rollouts when the `max_tokens` setting is None."""
    default_eval_max_tokens: int = 16
    """Completion budget of the held-out evaluation when the `eval_max_tokens` setting is None."""

    @abstractmethod
    def problems(self, split: str, n: int, seed: int) -> list[Problem]:
        """`n` problems of `split` ("train" | "heldout"), deterministic in `seed`."""

    @abstractmethod
    def reward(self, problem: Problem, completion_text: str) -> float | None:
        """Solver reward: 1.0 right, 0.0 wrong or unparsable, None if the reference is unusable."""

    def solver_messages(self, problem: Problem) -> list[Message]:
        """The template's Solver messages (arithmetic: one user message holding the question)."""
        return self.prompts.solver_messages(problem.question)

    def verifier_messages(self, problem: Problem, solver_text: str) -> list[Message]:
        """The template's Verifier messages (arithmetic: one user message, `verifier_prompt`)."""
        return self.prompts.verifier_messages(problem.question, solver_text)

    def feedback_message(self, problem: Problem, attempt_text: str) -> Message:
        """The template's right feedback when the attempt's reward is 1.0, else its wrong
        feedback (an attempt the task cannot score counts as wrong)."""
        right = self.reward(problem, attempt_text) == 1.0
        text = self.prompts.right_feedback if right else self.prompts.wrong_feedback
        return Message(role="user", content=self.prompts.fill(text, problem.question))

    @property
    def verdict_reads_solution(self) -> bool:
        """True when the template reads a verdict against the judged solution ("compare")."""
        return self.prompts.verdict_reads_solution

    def parse_verdict(self, text: str, solution: str | None = None) -> bool | None:
        """Verifier output -> approves? None = unparsable (by the template's `verdict` style;
        arithmetic: the module's `parse_verdict`; "compare" reads `solution` too)."""
        return self.prompts.parse_verdict(text, solution)
