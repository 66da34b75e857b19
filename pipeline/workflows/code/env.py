"""One episode of the Coder/Tester loop (`CodeEnv`): reading the agents' texts (the Coder's code,
the Tester's tests), running candidates and tests in the sandbox (`Runs`: each result computed
once per program and tests text of a problem), the rewards and the Coder's feedback."""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

from pipeline.rollout.workflow import Env, StepResult, Workflow
from pipeline.types import Message, Problem
from pipeline.workflows.code.problems import CodeSpec, compiles, defines

__all__ = ["CODER", "TESTER", "CHECK_AGAIN", "CHECK_CALL", "CodeEnv", "RunResult", "Runs", "extract_code", "candidate_source", "parse_tester_tests", "tests_key"]

CODER = "coder"
TESTER = "tester"
CHECK_AGAIN = "Check your function against the task and reply with the whole function in a ```python block."
"""What the Coder is told when it has no failing tests to answer: no Tester's tests, or its own
previous attempt (the self-refine baseline, `CodeWorkflow.refine_messages`)."""
CHECK_CALL = "__maxit_check__()"
"""The one test of a HumanEval problem's hidden check."""


# -- reading the agents' texts ----------------------------------------------------------------

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[ \t]*\n(.*?)(?:```|\Z)", re.S)


def extract_code(text: str, entry_point: str) -> str:
    """The code of a Coder's answer: the fenced block that defines the function (else the first
    fenced block; an unclosed fence runs to the end), else the text from its first line starting
    with def/import/from, else the whole text."""
    blocks = [body for _lang, body in _FENCE.findall(text)]
    if blocks:
        for b in blocks:
            if defines(b, entry_point):
                return b.strip("\n")
        return blocks[0].strip("\n")
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if re.match(r"(def|import|from|class)\s", line):
            return "\n".join(lines[i:]).strip("\n")
    return text.strip("\n")


def candidate_source(spec: CodeSpec, code: str) -> str:
    """The program the Coder's code is tested as: the stub continued by the code when the code
    is an indented function body; else the code after the stub when the stub is a program of
    its own (HumanEval's prompt: imports and helpers), else the code alone."""
    first = next((line for line in code.splitlines() if line.strip()), "")
    if spec.stub and first[:1] in (" ", "\t") and not defines(code, spec.entry_point):
        return spec.stub + code + "\n"
    if spec.stub and compiles(spec.stub):
        return spec.stub.rstrip("\n") + "\n\n\n" + code + "\n"
    return code + "\n"


def parse_tester_tests(text: str, entry_point: str, limit: int = 8) -> list:
    """The Tester's tests: lines `assert EXPR == LITERAL` (either side the literal) whose EXPR
    calls `entry_point`, in order, without repeats, at most `limit` (`pipeline.sandbox.TestCase`s)."""
    from pipeline.sandbox import SandboxError, parse_tests

    call = re.compile(rf"\b{re.escape(entry_point)}\s*\(")
    cases, seen = [], set()
    for line in text.splitlines():
        s = line.strip()
        if not s.startswith("assert") or len(s) > 1000:
            continue
        try:
            parsed = parse_tests(s)
        except (SandboxError, RecursionError, MemoryError):
            continue
        for c in parsed:
            key = (c.expr, repr(c.expected))
            if call.search(c.expr) and key not in seen:
                seen.add(key)
                cases.append(c)
        if len(cases) >= limit:
            break
    return cases[:limit]


def tests_key(cases: Sequence) -> str:
    return "\n".join(f"assert {c.expr} == {c.expected!r}" for c in cases)


# -- running programs -------------------------------------------------------------------------


@dataclass(frozen=True)
class RunResult:
    """One program's verdicts on one list of tests (from `pipeline.sandbox.run_tests`)."""

    passed: tuple[bool, ...]
    details: tuple[str | None, ...]
    """Per test: None when it passed, else "got VALUE" or the error."""
    status: str
    reason: str
    load_error: str | None = None

    @property
    def rate(self) -> float:
        return sum(self.passed) / len(self.passed) if self.passed else 0.0

    @property
    def why(self) -> str | None:
        """Why the program did not answer every test (a hang, a crash, an early exit), or None."""
        if self.status == "timeout" or self.status == "killed":
            return self.reason
        if self.load_error:
            return f"raised {self.load_error}"
        if any(d and d.startswith("no result") for d in self.details):
            return f"stopped before every test ran ({self.reason})"
        return None


def _result(report) -> RunResult:
    details = tuple(None if r.passed else (f"got {r.actual}" if r.actual is not None else (r.error or "failed")) for r in report.results)
    return RunResult(tuple(r.passed for r in report.results), details, report.sandbox.status, report.sandbox.reason, report.load_error)


_CHECK_WRAPPER = '''

def __maxit_plain__(v, depth=0):
    t = type(v)
    if v is None or t in (bool, int, float, complex, str, bytes):
        return v
    if depth < 50 and t in (list, tuple, set, frozenset):
        for x in v:
            __maxit_plain__(x, depth + 1)
        return v
    if depth < 50 and t is dict:
        for k, x in v.items():
            __maxit_plain__(k, depth + 1)
            __maxit_plain__(x, depth + 1)
        return v
    raise TypeError("the function returned a %s, not a plain value" % t.__name__)


def __maxit_check__():
    check(lambda *a, **k: __maxit_plain__(ENTRY(*a, **k)))
    return TOKEN
'''


class Runs:
    """The sandbox results of one problem, computed once per (program text, tests text): shared
    by every episode of the problem and the tree's copies (results are pure functions of the texts)."""

    def __init__(self, workflow: Workflow, spec: CodeSpec) -> None:
        self.workflow, self.spec = workflow, spec
        self.results: dict[tuple[str, str], RunResult] = {}
        self.tester: dict[str, tuple[float, float]] = {}
        """tests text -> (validity, catch rate) of a Tester's tests."""
        self.killable: tuple[str, ...] | None = None

    def _job(self, source: str, tests) -> tuple[str, object]:
        if tests is not None:
            return source, tests
        spec = self.spec
        if spec.tests:
            return source, _hidden_cases(spec.tests)
        token = "passed " + secrets.token_hex(8)  # never in the candidate's reach before it runs
        program = source + "\n\n" + spec.check + _CHECK_WRAPPER.replace("ENTRY", spec.entry_point).replace("TOKEN", repr(token))
        return program, [(CHECK_CALL, token)]

    def run(self, jobs: Sequence[tuple[str, Sequence | None]]) -> list[RunResult]:
        """Each (source, tests) job's result; tests None = the hidden reference tests. The jobs
        not cached yet run at once in the sandbox."""
        keys = [(src, "\x00hidden" if tests is None else tests_key(tests)) for src, tests in jobs]
        todo = {}
        for key, (src, tests) in zip(keys, jobs):
            if key not in self.results and key not in todo:
                todo[key] = self._job(src, tests)
        if todo:
            for key, rep in zip(todo, self.workflow.execute(list(todo.values()))):
                if rep.sandbox.status == "error":
                    raise RuntimeError(f"the sandbox could not run a program: {rep.sandbox.reason}")
                self.results[key] = _result(rep)
        return [self.results[k] for k in keys]


@lru_cache(maxsize=8192)
def _hidden_cases(tests: str) -> tuple:
    from pipeline.sandbox import parse_tests

    return tuple(parse_tests(tests))


# -- the environment --------------------------------------------------------------------------


def _fence(code: str, cap: int = 2000) -> str:
    code = code if len(code) <= cap else code[:cap] + "\n# ... (cut)"
    return f"```python\n{code}\n```"


class CodeEnv(Env):
    """One episode of the Coder/Tester loop on one problem."""

    def __init__(self, workflow: Workflow, problem: Problem, spec: CodeSpec, runs: Runs) -> None:
        self.workflow, self.problem, self.spec, self.runs = workflow, problem, spec, runs
        self.turn = 0
        """Tester steps taken (completed turns)."""
        self.code: str | None = None
        """The Coder's latest code (extracted from its text)."""
        self.code_text: str | None = None
        self.hidden: RunResult | None = None
        """The latest code's result on the hidden tests."""
        self.tests_text: str | None = None
        """The Tester's latest text."""
        self.shown_code: str | None = None
        """The code the Tester's latest text answered."""
        self.feedback: str | None = None
        """The Coder's next user message (which of the Tester's tests its code failed)."""

    def copy(self) -> "CodeEnv":
        out = object.__new__(CodeEnv)
        out.__dict__.update(self.__dict__)  # strings, an immutable result, shared caches
        return out

    def _coder_opening(self) -> list[Message]:
        return [Message(role="user", content=f"{self.problem.question}\nReply with the whole function in a ```python block.")]

    def observe(self, agent_id: str) -> list[Message]:
        if agent_id == CODER:
            msgs = self._coder_opening()
            if self.turn and self.code_text is not None:
                msgs += [Message(role="assistant", content=self.code_text), Message(role="user", content=self.feedback or "Check your function.")]
            return msgs
        if agent_id == TESTER:
            entry, limit = self.spec.entry_point, self.workflow.max_tests
            ask = (f"Write up to {limit} tests of `{entry}` for the task above, one per line: "
                   f"assert {entry}(...) == <the right value>")
            if not self.turn or self.tests_text is None:
                return [Message(role="user", content=f"{self.problem.question}\n\nThe Coder wrote:\n{_fence(self.code or '')}\n{ask}")]
            return [
                Message(role="user", content=f"{self.problem.question}\n\nThe Coder wrote:\n{_fence(self.shown_code or '')}\n{ask}"),
                Message(role="assistant", content=self.tests_text),
                Message(role="user", content=f"The Coder revised its code:\n{_fence(self.code or '')}\nWrite your tests again; fix any expected value that is wrong."),
            ]
        raise ValueError(f"code has no agent {agent_id!r}")

    def step(self, agent_id: str, text: str) -> StepResult:
        if agent_id == CODER:
            code = extract_code(text, self.spec.entry_point)
            (hidden,) = self.runs.run([(candidate_source(self.spec, code), None)])
            self.code, self.code_text, self.hidden = code, text, hidden
            return StepResult(hidden.rate, done=self.workflow.team == "coder")  # alone: no tests to answer
        if agent_id != TESTER:
            raise ValueError(f"code has no agent {agent_id!r}")
        wf = self.workflow
        cases = parse_tester_tests(text, self.spec.entry_point, wf.max_tests)
        self.tests_text, self.shown_code = text, self.code
        last = self.turn + 1 >= wf.max_turns
        self.turn += 1
        if not cases:
            self.feedback = f"The Tester wrote no tests of `{self.spec.entry_point}`. {CHECK_AGAIN}"
            return StepResult(0.0, done=last)
        killable = self.workflow.killable(self.runs)
        jobs = [(self.spec.reference, cases), (candidate_source(self.spec, self.code or ""), cases), *((m, cases) for m in killable)]
        ref, mine, *wrong = self.runs.run(jobs)
        validity = sum(ref.passed) / len(cases)
        valid = [i for i, ok in enumerate(ref.passed) if ok]
        if not valid:
            catch = 0.0
        elif not wrong:
            catch = 1.0
        else:
            catch = sum(any(not w.passed[i] for i in valid) for w in wrong) / len(wrong)
        self.runs.tester[tests_key(cases)] = (validity, catch)
        agree = all(mine.passed)
        self.feedback = None if agree else _coder_feedback(self.spec.entry_point, cases, mine)
        return StepResult(validity * catch, done=agree or last)

    def team_reward(self) -> float:
        return self.hidden.rate if self.hidden is not None else 0.0


def _coder_feedback(entry: str, cases: Sequence, run: RunResult, show: int = 3) -> str:
    failed = [(c, d) for c, ok, d in zip(cases, run.passed, run.details) if not ok]
    head = f"Your code failed {len(failed)} of the Tester's {len(cases)} tests"
    why = run.why
    head += f" (it {why})." if why else ":"
    lines = [] if why else [f"assert {c.expr} == {c.expected!r}  # {d}"[:300] for c, d in failed[:show]]
    return "\n".join([head, *lines, f"Fix `{entry}` if it is wrong (a test may be wrong too) and reply with the whole function in a ```python block."])
