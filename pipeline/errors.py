"""Errors maxit raises on bad input. Each names what is wrong: the column, the row ids, the flag."""

from __future__ import annotations

from schemas import SchemaError

__all__ = ["MaxitError", "ConfigError", "DataError", "RunInterrupted", "SchemaError", "one_line"]


class MaxitError(Exception):
    """Base of maxit's own errors."""


class ConfigError(MaxitError, ValueError):
    """A configuration value is invalid; the message names the field and what it accepts."""


class DataError(MaxitError, ValueError):
    """Table contents are unusable (NaN rewards, empty groups...); the message names the rows."""


class RunInterrupted(MaxitError):
    """A run was stopped from outside (Ctrl-C, SIGTERM) while a round was running; the command
    line exits with 130, as a shell does for Ctrl-C."""


def one_line(err: BaseException) -> str:
    """`err`'s message on one line, for the command line: a heading line followed by one line
    per finding ("  - a", "  - b") becomes "heading: a; b"."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    if not lines:
        return type(err).__name__
    head, rest = lines[0], [line.removeprefix("- ") for line in lines[1:]]
    if not rest:
        return head
    return head + (" " if head.endswith(":") else ": ") + "; ".join(rest)
