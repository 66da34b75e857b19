"""What the sandbox returns: a program's outcome (`SandboxResult`), tests and their verdicts
(`TestCase`, `TestResult`, `TestReport`), and the sandbox's own errors."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from pipeline.errors import MaxitError

__all__ = ["STATUSES", "SandboxError", "SandboxUnavailable", "SandboxResult", "TestCase", "TestResult", "TestReport"]

STATUSES = ("ok", "failed", "timeout", "killed", "error")


class SandboxError(MaxitError, ValueError):
    """Bad arguments to the sandbox (a limit out of range, a test that cannot be checked)."""


class SandboxUnavailable(MaxitError, RuntimeError):
    """The sandbox refuses to start: the network isolation it needs is missing here."""


@dataclass(frozen=True)
class SandboxResult:
    """One program's outcome. status: ok (exit 0), failed (nonzero exit or an uncaught
    exception), timeout (wall clock or CPU time limit), killed (a signal, or the memory limit),
    error (the sandbox itself could not start the program). exit_code: the program's exit code,
    -N when signal N ended it, None when it never ran. reason: a short named reason."""

    status: str
    exit_code: int | None
    seconds: float
    reason: str
    stdout: str = ""
    stderr: str = ""
    isolation: str = "none"
    user: str = ""
    truncated: bool = False
    cpu_seconds: float | None = None

    def summary(self) -> dict:
        """status, exit_code, seconds, reason, isolation, user: the one-line record."""
        return {
            "status": self.status,
            "exit_code": self.exit_code,
            "seconds": round(self.seconds, 3),
            "reason": self.reason,
            "isolation": self.isolation,
            "user": self.user,
        }

    def to_json(self) -> str:
        """`summary()` as one line of JSON (no stdout/stderr)."""
        return json.dumps(self.summary(), separators=(", ", ": "))

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class TestCase:
    """`expr` is evaluated in the candidate's namespace inside the sandbox; `expected` stays in
    the parent and is never shown to the candidate."""

    __test__ = False  # not a pytest class
    expr: str
    expected: Any


@dataclass(frozen=True)
class TestResult:
    __test__ = False
    expr: str
    expected: str  # repr
    passed: bool
    actual: str | None = None  # repr of the value the candidate produced
    error: str | None = None  # why it failed, when it did not produce a comparable value


@dataclass(frozen=True)
class TestReport:
    """Per-test verdicts decided in the parent by comparing the candidate's values with the
    expected values (plain Python values on both sides); see `run_tests`."""

    __test__ = False
    results: tuple[TestResult, ...]
    sandbox: SandboxResult
    load_error: str | None = None

    @property
    def total(self) -> int:
        return len(self.results)

    @property
    def passed(self) -> int:
        return sum(r.passed for r in self.results)

    @property
    def all_passed(self) -> bool:
        return bool(self.results) and self.passed == self.total

    @property
    def fraction(self) -> float:
        return self.passed / self.total if self.results else 0.0

    def summary(self) -> dict:
        return {
            "passed": self.passed,
            "total": self.total,
            "tests": [r.passed for r in self.results],
            "load_error": self.load_error,
            **{f"sandbox_{k}": v for k, v in self.sandbox.summary().items()},
        }

    def to_json(self) -> str:
        return json.dumps(self.summary(), separators=(", ", ": "))
