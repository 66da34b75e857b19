"""What `maxit run` stops with when a round's Dagster run failed: each failed step and the
innermost error its stage raised, one line each (`round_failure`); the whole traces go to stderr,
which a run sends to its store's maxit.log."""

from __future__ import annotations

import sys

from pipeline.errors import MaxitError, RunInterrupted


INTERRUPTS = ("DagsterExecutionInterruptedError", "KeyboardInterrupt")
"""Errors by which Dagster reports a step stopped from outside, not failed."""


def root_error(error):
    """The innermost error of a Dagster failure (`SerializableErrorInfo`): a step's error wraps
    the exception the stage raised in its `cause` chain."""
    while error.cause is not None:
        error = error.cause
    return error


def error_text(error) -> str:
    """`error`'s message without its module path: maxit's own errors as they read, any other as
    "ClassName: message"."""
    text = error.message.strip()
    head, sep, rest = text.partition(": ")
    message = rest if sep and head.rsplit(".", 1)[-1] == error.cls_name else text
    own = head.startswith(("pipeline.", "schemas.", "assets.")) and error.cls_name.endswith("Error")
    return message if own else f"{error.cls_name}: {message}"


def round_failure(round_: int, run_id: str, events, failed_checks=()) -> MaxitError:
    """The error `maxit run` stops with when round `round_`'s Dagster run failed: each failed
    step's name and the innermost error it raised, one line each, or `RunInterrupted` when the run
    was stopped from outside. The whole stack traces go to stderr, which a run sends to
    STORE/maxit.log."""
    causes: list[str] = []
    seen: set[str] = set()
    interrupted = False
    for e in events:
        error = getattr(e.event_specific_data, "error", None) if e.is_failure else None
        if error is None:
            continue
        print(f"{e.message}\n{error.to_string().strip()}", file=sys.stderr)
        root = root_error(error)
        interrupted |= root.cls_name in INTERRUPTS or error.cls_name in INTERRUPTS
        text = error_text(root)
        if text in seen and not e.step_key:  # the run's failure repeats its failed step's error
            continue
        seen.add(text)
        line = f"{e.step_key}: {text}" if e.step_key else text
        if line not in causes:
            causes.append(line)
    if interrupted:
        return RunInterrupted(
            f"round {round_} interrupted (run {run_id}); `maxit run` again with the same --store resumes: "
            f"complete rounds are kept and round {round_} is run again from its start"
        )
    findings = causes + [f"check {c}" for c in failed_checks] or ["no step reported an error (see the Dagster run in the UI)"]
    return MaxitError(f"round {round_} failed (run {run_id}):\n" + "\n".join(f"- {c}" for c in findings))
