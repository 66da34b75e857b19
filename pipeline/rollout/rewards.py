"""Rewards of rollout rows: the environment's global reward, each role's local reward, and the
mixed reward `reward = alpha * global_reward + local_weight * local_reward` (AT-GRPO,
docs/ALGORITHMS.md#mixed-reward).

- global_reward: the environment reward of the team's final answer. Ordinary trajectories
  (`iid`, `prompt_aug`, `feedback`): `task.reward(problem, final Solver attempt)` on every row of
  the trajectory (DrMAS: all agents share the final outcome, docs/ALGORITHMS.md#the-drmas-reward). Tree candidates (`tree`): the
  reward of the environment state right after the candidate's step (its own attempt for a
  Solver candidate, the judged attempt for a Verifier candidate), as AT-GRPO scores each branch
  immediately; the non-selected branches have no later state.
- local_reward, by role:
  Solver: `task.reward(problem, its own attempt)` (1 right, 0 wrong or unparsable);
  Verifier: 1.0 when its verdict matches the judged attempt's correctness
  (reward >= `CORRECT_THRESHOLD`), 0.0 when it does not or when the verdict is unparsable; a
  Verifier that checks by solving again (verdict style "compare") also needs its own answer right.
- reward: `alpha * global + local_weight * local`; null when either part is null.

User code (the task's `reward` and `parse_verdict`) is run through `safe_map`: an exception, a
non-finite or non-numeric value, or a call running past the timeout gives a null value and a
message for the `reward_error` column instead of a crashed round.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

__all__ = [
    "CORRECT_THRESHOLD",
    "is_correct",
    "Outcome",
    "RowReward",
    "safe_map",
    "score_attempts",
    "parse_verdicts",
    "global_reward",
    "solver_local_reward",
    "verifier_local_reward",
    "mixed_reward",
    "row_reward",
]

CORRECT_THRESHOLD = 0.5
"""An attempt whose reward is >= this counts as correct when judging a verdict."""


@dataclass(frozen=True)
class Outcome:
    """The result of one guarded call of user code."""

    value: Any
    """What the call returned (None when it failed)."""
    error: str | None = None
    """Why it failed (exception, timeout, bad value), or None."""

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True)
class RowReward:
    """The four reward columns of one `steps` row."""

    global_reward: float | None
    """Environment reward shared by the trajectory (see module doc)."""
    local_reward: float | None
    """Role reward of this agent call."""
    reward: float | None
    """alpha * global_reward + local_weight * local_reward; None when either is None."""
    reward_error: str | None
    """Why a reward is null (joined messages), or None."""


class _Worker(threading.Thread):
    """Runs `fn(*calls[i])` for i from `start` on, in order, recording results; abandoned (and
    silenced) by the caller when one call outlives the timeout."""

    def __init__(self, fn: Callable, calls: Sequence[tuple], start: int, results: list, cond: threading.Condition):
        super().__init__(daemon=True, name="maxit-reward")
        self.fn, self.calls, self.index, self.results, self.cond = fn, calls, start, results, cond
        self.started_at = time.monotonic()
        self.abandoned = False

    def run(self) -> None:
        while self.index < len(self.calls):
            i = self.index
            try:
                out = Outcome(self.fn(*self.calls[i]))
            except BaseException as exc:  # noqa: BLE001 - user code may raise anything
                out = Outcome(None, f"{type(exc).__name__}: {exc}")
            with self.cond:
                if self.abandoned:
                    return
                self.results[i] = out
                self.index = i + 1
                self.started_at = time.monotonic()
                self.cond.notify_all()


def safe_map(fn: Callable, calls: Sequence[tuple], timeout: float | None, label: str = "reward") -> list[Outcome]:
    """`[fn(*args) for args in calls]`, each guarded: an exception becomes an `Outcome` with an
    error, and (when `timeout` is not None) a call running longer than `timeout` seconds becomes
    "`label` timed out after ...s" while the next calls go on in a fresh worker thread.

    Calls run one after another on a daemon thread (one thread per batch, not per call, so a
    cheap function costs microseconds). Python cannot stop a thread: a timed-out call keeps
    running in the background until it returns, and its result is discarded."""
    n = len(calls)
    if timeout is None:
        out = []
        for args in calls:
            try:
                out.append(Outcome(fn(*args)))
            except Exception as exc:  # noqa: BLE001 - user code may raise anything
                out.append(Outcome(None, f"{type(exc).__name__}: {exc}"))
        return out
    results: list[Outcome | None] = [None] * n
    cond = threading.Condition()
    start = 0
    while start < n:
        worker = _Worker(fn, calls, start, results, cond)
        with cond:
            worker.start()
            while worker.index < n:
                left = worker.started_at + timeout - time.monotonic()
                if left <= 0:
                    worker.abandoned = True
                    results[worker.index] = Outcome(None, f"{label} timed out after {timeout:g}s")
                    break
                cond.wait(left)
            start = worker.index + 1 if worker.abandoned else n
    return results  # type: ignore[return-value]


def _as_reward(out: Outcome, label: str) -> Outcome:
    if not out.ok:
        return out
    v = out.value
    if v is None:
        return Outcome(None, f"{label} returned None")
    if not isinstance(v, (int, float)):
        try:
            if isinstance(v, (str, bytes)):
                raise TypeError(v)
            v = float(v)  # numpy scalars
        except (TypeError, ValueError):
            return Outcome(None, f"{label} returned {type(out.value).__name__}, expected a number")
    v = float(v)
    if not math.isfinite(v):
        return Outcome(None, f"{label} returned {v}")
    return Outcome(v)


def score_attempts(task, items: Sequence[tuple[Any, str]], timeout: float | None) -> list[Outcome]:
    """`task.reward(problem, text)` for each (problem, text), guarded; identical (problem uid,
    text) pairs are scored once (rewards are pure functions of the problem and the text)."""
    keys: dict[tuple[str, str], int] = {}
    unique: list[tuple[Any, str]] = []
    index = []
    for problem, text in items:
        key = (problem.uid, text)
        if key not in keys:
            keys[key] = len(unique)
            unique.append((problem, text))
        index.append(keys[key])
    scored = [_as_reward(o, "reward") for o in safe_map(task.reward, unique, timeout, "reward")]
    return [scored[i] for i in index]


def parse_verdicts(task, texts: Sequence[str], timeout: float | None, solutions: Sequence[str] | None = None) -> list[Outcome]:
    """`task.parse_verdict(text)` for each Verifier output, guarded; a value other than
    True/False/None is an error. A task whose `verdict_reads_solution` is True is called as
    `parse_verdict(text, solution)` with the judged Solver reply of each output (`solutions`)."""
    if getattr(task, "verdict_reads_solution", False):
        if solutions is None or len(solutions) != len(texts):
            raise ValueError("parse_verdicts: this task reads verdicts against the judged solutions; pass one per text")
        args = list(zip(texts, solutions))
    else:
        args = [(t,) for t in texts]
    out = []
    for o in safe_map(task.parse_verdict, args, timeout, "parse_verdict"):
        if o.ok and o.value not in (True, False, None):
            o = Outcome(None, f"parse_verdict returned {o.value!r}, expected True, False or None")
        out.append(o)
    return out


def is_correct(attempt: Outcome) -> bool:
    """The one correctness rule: an attempt is right when its reward is known and >=
    `CORRECT_THRESHOLD` (rollouts, verdict rewards and the held-out evaluation all use it)."""
    return attempt.ok and attempt.value is not None and attempt.value >= CORRECT_THRESHOLD


def global_reward(final_attempt: Outcome) -> Outcome:
    """The environment reward of a trajectory: the reward of its final Solver attempt."""
    return final_attempt


def solver_local_reward(own_attempt: Outcome) -> Outcome:
    """The Solver's role reward: the reward of its own attempt."""
    return own_attempt


def verifier_local_reward(verdict: Outcome, judged_attempt: Outcome, own_answer: Outcome | None = None) -> Outcome:
    """The Verifier's role reward: 1.0 if its verdict (approve = True) equals whether the judged
    attempt is correct, 0.0 if not or if the verdict is unparsable (None). Null when the verdict
    parser failed or the judged attempt has no reward. With `own_answer` (the reward of the answer
    a "compare" Verifier worked out itself) a right verdict counts only when that answer is right
    too: a verdict reached by a wrong computation (the proposal wrong and its own answer another
    wrong number) is not rewarded."""
    if own_answer is not None and not own_answer.ok:
        return Outcome(None, f"own answer: {own_answer.error}")
    if not verdict.ok:
        return Outcome(None, f"verdict: {verdict.error}")
    if not judged_attempt.ok:
        return Outcome(None, f"judged attempt: {judged_attempt.error}")
    if verdict.value is None:
        return Outcome(0.0)
    correct = judged_attempt.value >= CORRECT_THRESHOLD
    right = bool(verdict.value) == correct
    if own_answer is not None:
        right = right and own_answer.value >= CORRECT_THRESHOLD
    return Outcome(1.0 if right else 0.0)


def mixed_reward(alpha: float, global_value: float | None, local_value: float | None, local_weight: float = 1.0) -> float | None:
    """alpha * global + local_weight * local, or None when either is None."""
    if global_value is None or local_value is None:
        return None
    return alpha * global_value + local_weight * local_value


def row_reward(alpha: float, global_: Outcome, local: Outcome, local_weight: float = 1.0) -> RowReward:
    """The reward columns of a row from its global and local outcomes."""
    errors = []
    if not global_.ok:
        errors.append(f"global_reward: {global_.error}")
    if not local.ok:
        errors.append(f"local_reward: {local.error}")
    g = global_.value if global_.ok else None
    l = local.value if local.ok else None
    return RowReward(g, l, mixed_reward(alpha, g, l, local_weight), "; ".join(errors) if errors else None)
