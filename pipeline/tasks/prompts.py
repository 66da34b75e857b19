"""A task's prompts: what the Solver and the Verifier are shown, and how the Verifier's reply is read.

`PromptTemplate` holds them as text with placeholders, replaced literally (no `str.format`, so
LaTeX braces such as `\\boxed{}` need no escaping):
- `{question}`: the problem's question (Solver and Verifier templates);
- `{answer_format}`: the template's `answer_format` text (the instruction of how to write the
  final answer, e.g. GSM8K's "#### <number>" line);
- `{solution}`: the Solver's whole reply, stripped (Verifier templates only).

Worked examples (`examples`, (question, solution) pairs) are shown to the Solver as earlier chat
turns: the user template filled with the example's question, then the example's solution as the
assistant's reply, before the problem's own user turn (few-shot in the chat's own turns).

Three templates ship:
- `ARITHMETIC_PROMPTS`, the arithmetic task's: the bare question for the Solver, and
  "<question>\\nCheck it: work it out again." for the Verifier, who is not shown the proposal
  (a blind Verifier) and replies with the sum as it works it out ("168"); its verdict is whether
  that sum equals the proposal (verdict style "compare": see docs/results/verifier.md). The
  embedded default model is warm-started on exactly these texts.
- `REVIEW_PROMPTS`, the `math_review` team's: the arithmetic Solver's prompt, and a Verifier
  shown the proposal ("<question>\\nProposed answer: <a>\\nIs it right?") that writes the sum,
  then its verdict word ("168 no", verdict style "first_word": the first word, digits aside).
- `CHAIN_OF_THOUGHT_PROMPTS`, the file tasks' (GSM8K-style word problems): the Solver is asked
  to solve the problem in a few short steps and end with "#### <number>", after three short
  worked examples (`COT_EXAMPLES`, written for maxit, not taken from any data set) shown as
  earlier chat turns; the Verifier sees the whole solution, is asked to check it and to end with
  a line "Verdict: yes" or "Verdict: no".

Verdicts (`verdict`): "first_word" reads a reply whose first word is yes/no (`parse_verdict`);
"marked" reads the last "Verdict: yes|no" marker anywhere in the reply, else a reply whose first
word or last line is a bare yes/no (`parse_marked_verdict`); "compare" approves when the answer
the Verifier works out itself (its reply's "#### x", else its last number) equals the proposed
solution's answer (`parse_compared_verdict`): the Verifier checks by solving the problem again,
and the comparison is read, not generated.

`load_prompt_file(path, base)` reads a TOML or JSON file whose keys are `PromptTemplate` fields;
keys it leaves out keep `base`'s value (the task's own template); `examples` is a list of
[question, solution] pairs or of {question, solution} tables (`examples = []`: none).
`maxit run --prompt-file FILE`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, fields, replace
from pathlib import Path

from pipeline.errors import ConfigError
from pipeline.types import Message

from .answers import parse_compared_verdict, parse_marked_verdict, parse_verdict

__all__ = [
    "PromptTemplate",
    "ARITHMETIC_PROMPTS",
    "REVIEW_PROMPTS",
    "CHAIN_OF_THOUGHT_PROMPTS",
    "GSM8K_ANSWER_FORMAT",
    "COT_EXAMPLES",
    "load_prompt_file",
    "parse_marked_verdict",
    "parse_compared_verdict",
    "VERDICT_STYLES",
]

VERDICT_STYLES = ("first_word", "marked", "compare")
_PLACEHOLDER = re.compile(r"\{(question|solution|answer_format)\}")


def _examples(value) -> tuple[tuple[str, str], ...]:
    """`examples` as a tuple of (question, solution) string pairs; a pair may be given as a
    2-list or a {question, solution} table (a prompt file's). Else a `ConfigError`."""
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
        raise ConfigError(f"prompt template: examples must be a list of (question, solution) pairs, got {type(value).__name__}")
    out = []
    for i, ex in enumerate(value):
        if isinstance(ex, dict) and set(ex) == {"question", "solution"}:
            ex = (ex["question"], ex["solution"])
        if not (isinstance(ex, (list, tuple)) and len(ex) == 2 and all(isinstance(x, str) and x.strip() for x in ex)):
            raise ConfigError(f"prompt template: examples[{i}] must be a pair of non-empty strings (question, solution), got {ex!r}")
        out.append((ex[0], ex[1]))
    return tuple(out)


@dataclass(frozen=True)
class PromptTemplate:
    """The prompts of a task (see the module docstring for the placeholders)."""

    user: str = "{question}"
    """The Solver's user message; must hold `{question}`."""
    system: str | None = None
    """The Solver's system message, or None for none."""
    answer_format: str = ""
    """How the final answer is to be written; replaces `{answer_format}` in the templates."""
    verifier_user: str = "{question}\nProposed answer: {solution}\nIs it right? Answer yes or no."
    """The Verifier's user message; holds `{solution}` (the Solver's whole reply, stripped), which
    only a "compare" Verifier may leave out: it then works the problem out blind, without seeing
    the proposal, and the comparison reads the proposal (`verifier_sees_solution`)."""
    verifier_system: str | None = None
    """The Verifier's system message, or None for none."""
    verdict: str = "first_word"
    """How the Verifier's reply is read: "first_word" or "marked" (see the module docstring)."""
    wrong_feedback: str = "That is wrong. Try again."
    """The feedback turn after an attempt the reward scores below 1 (feedback strategy)."""
    right_feedback: str = "That is right. Say it again."
    """The feedback turn after a right attempt."""
    rejection: str | None = None
    """The Solver's user turn after the Verifier rejected its attempt; must hold `{verifier_text}`
    (the Verifier's reply) and may hold `{answer_format}`. None: the orchestra's own
    (`pipeline.workflows.math.orchestra.DEFAULT_REJECTION`, "...\nTry again.")."""
    examples: tuple[tuple[str, str], ...] = ()
    """Worked examples, (question, solution) pairs, shown to the Solver as earlier chat turns
    (its user template filled with the question, then the solution as the assistant's reply)."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            optional = f.name in ("system", "verifier_system", "rejection")
            if value is None and optional:
                continue
            if f.name == "examples":
                object.__setattr__(self, "examples", _examples(value))
                continue
            if not isinstance(value, str):
                raise ConfigError(f"prompt template: {f.name} must be a string{' or absent' if optional else ''}, got {type(value).__name__}")
        if "{question}" not in self.user:
            raise ConfigError(f"prompt template: user must hold the placeholder {{question}}, got {self.user!r}")
        if self.verdict not in VERDICT_STYLES:
            raise ConfigError(f"prompt template: verdict must be one of {list(VERDICT_STYLES)}, got {self.verdict!r}")
        if not self.verifier_sees_solution and self.verdict != "compare":
            raise ConfigError(
                f"prompt template: verifier_user must hold the placeholder {{solution}} (only a Verifier whose verdict is "
                f"\"compare\" may work the problem out without seeing the proposal), got {self.verifier_user!r}"
            )
        if self.rejection is not None and "{verifier_text}" not in self.rejection:
            raise ConfigError(f"prompt template: rejection must hold the placeholder {{verifier_text}}, got {self.rejection!r}")
        for name in ("wrong_feedback", "right_feedback"):
            if not getattr(self, name).strip():
                raise ConfigError(f"prompt template: {name} must not be empty")

    def fill(self, text: str, question: str = "", solution: str | None = None) -> str:
        """`text` with its placeholders replaced in one pass (a question or solution that itself
        holds "{question}" is left as written)."""
        values = {"question": question, "answer_format": self.answer_format}
        if solution is not None:
            values["solution"] = solution
        return _PLACEHOLDER.sub(lambda m: values.get(m.group(1), m.group(0)), text)

    def solver_messages(self, question: str) -> list[Message]:
        """The Solver's first-turn messages: the system message (if any) and the user message."""
        msgs = [] if self.system is None else [Message(role="system", content=self.fill(self.system, question))]
        for example_question, solution in self.examples:
            msgs += [Message(role="user", content=self.fill(self.user, example_question)), Message(role="assistant", content=solution)]
        return msgs + [Message(role="user", content=self.fill(self.user, question))]

    def rejection_template(self) -> str | None:
        """`rejection` with `{answer_format}` filled in and every other brace escaped, as
        `str.format(verifier_text=...)` (the orchestra) expects; None when the template has none."""
        if self.rejection is None:
            return None
        text = self.rejection.replace("{verifier_text}", "\0")
        text = self.fill(text).replace("{", "{{").replace("}", "}}")
        return text.replace("\0", "{verifier_text}")

    def verifier_messages(self, question: str, solution: str) -> list[Message]:
        """The Verifier's messages: its system message (if any) and the user message holding the
        question and the Solver's whole reply."""
        solution = solution.strip()
        msgs = [] if self.verifier_system is None else [Message(role="system", content=self.fill(self.verifier_system, question, solution))]
        return msgs + [Message(role="user", content=self.fill(self.verifier_user, question, solution))]

    @property
    def verifier_sees_solution(self) -> bool:
        """False for a blind Verifier: a "compare" template whose Verifier messages do not show
        the proposal (it cannot copy it; its verdict is still the comparison with it)."""
        texts = (self.verifier_user, self.verifier_system or "")
        return any("{solution}" in t for t in texts)

    @property
    def verdict_reads_solution(self) -> bool:
        """True when a verdict is read against the judged solution ("compare")."""
        return self.verdict == "compare"

    def parse_verdict(self, text: str, solution: str | None = None) -> bool | None:
        """The Verifier's reply -> approves? None = unparsable (by the `verdict` style; "compare"
        needs the judged `solution`)."""
        if self.verdict == "compare":
            return parse_compared_verdict(text, solution)
        return parse_verdict(text) if self.verdict == "first_word" else parse_marked_verdict(text)


ARITHMETIC_PROMPTS = PromptTemplate(verdict="compare", verifier_user="{question}\nCheck it: work it out again.")
"""The arithmetic task's prompts (what the default model is warm-started on: a change here
changes the default model, which the build's cache key follows). The Verifier works the sum out
again, blind (it is not shown the proposal, so it cannot copy it), and its verdict is whether its
answer equals the proposal ("compare"). docs/results/verifier.md: shown the proposal, the same
model copied it and stayed at chance on one machine of the CI kind."""

REVIEW_PROMPTS = PromptTemplate(verifier_user="{question}\nProposed answer: {solution}\nIs it right?", verdict="first_word")
"""The arithmetic task's prompts for the `math_review` team (DrMAS's Verifier): the Solver's are
`ARITHMETIC_PROMPTS`' (the default model's), the Verifier is shown the proposal and replies with
the sum as it works it out, then its verdict word ("168 no"); the verdict is that word (the first
word of the reply, digits aside), not a comparison the task makes for it
(`pipeline.workflows.math.review`)."""

GSM8K_ANSWER_FORMAT = 'Write the final answer as a number on the last line, in the form "#### <number>".'
"""GSM8K's answer convention: the final answer after "#### "."""

COT_EXAMPLES = (
    (
        "A baker makes 12 muffins and sells 5 of them. Then he bakes 8 more. How many muffins does he have now?",
        "After selling 5, the baker has 12 - 5 = 7 muffins.\nAfter baking 8 more, he has 7 + 8 = 15 muffins.\n#### 15",
    ),
    (
        "Tom reads 20 pages a day. How many pages does he read in 3 days?",
        "Each day Tom reads 20 pages, so in 3 days he reads 20 * 3 = 60 pages.\n#### 60",
    ),
    (
        "A shirt costs $15 and a hat costs $7. Sam buys 2 shirts and 1 hat. How much does he pay?",
        "Two shirts cost 2 * 15 = 30 dollars.\nWith the hat he pays 30 + 7 = 37 dollars.\n#### 37",
    ),
)
"""The file tasks' worked examples (written for maxit; short, each ending in its "####" line).
With them SmolLM2-135M-Instruct at T=1 ends far more of its GSM8K solutions with a "####" line
(docs/results/real-models.md)."""

CHAIN_OF_THOUGHT_PROMPTS = PromptTemplate(
    user="{question}\n\nSolve the problem in a few short steps. {answer_format}",
    answer_format=GSM8K_ANSWER_FORMAT,
    examples=COT_EXAMPLES,
    verifier_user=(
        "Check a proposed solution to a math problem.\n\n"
        "Problem: {question}\n\n"
        "Proposed solution:\n{solution}\n\n"
        "Check the reasoning and the final answer step by step. Then end your reply with one line, "
        '"Verdict: yes" if the final answer is correct or "Verdict: no" if it is not.'
    ),
    verdict="marked",
    wrong_feedback="That is wrong. Check your work and solve the problem again. {answer_format}",
    right_feedback="That is right. Write the solution again. {answer_format}",
    rejection="The verifier rejected your answer: {verifier_text}\nSolve the problem again in a few short steps. {answer_format}",
)
"""The file tasks' default prompts: chain of thought ending in "#### <number>", a Verifier that
checks the whole solution and ends with "Verdict: yes|no"."""

def load_prompt_file(path: str | Path, base: PromptTemplate) -> PromptTemplate:
    """The template of a TOML (.toml) or JSON (.json) file: its keys are `PromptTemplate` fields
    and replace `base`'s; an unknown key, a bad value or an unreadable file is a `ConfigError`
    naming the file (`prompt_file`) and the key."""
    import tomllib

    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"prompt_file {str(p)!r} is not a file")
    suffix = p.suffix.lower()
    if suffix not in (".toml", ".json"):
        raise ConfigError(f"prompt_file {p} must end in .toml or .json")
    try:
        text = p.read_text(encoding="utf-8")
        data = tomllib.loads(text) if suffix == ".toml" else json.loads(text)
    except UnicodeDecodeError as exc:
        raise ConfigError(f"prompt_file {p} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"prompt_file {p} is not valid {suffix[1:].upper()}: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"prompt_file {p} must hold a table of settings, got {type(data).__name__}")
    known = {f.name for f in fields(PromptTemplate)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"prompt_file {p}: unknown key(s) {unknown}; the keys are {sorted(known)}")
    try:
        return replace(base, **data)
    except ConfigError as exc:
        raise ConfigError(f"prompt_file {p}: {exc}") from None
