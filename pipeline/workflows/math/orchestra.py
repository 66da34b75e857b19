"""The DrMAS math orchestra (docs/ALGORITHMS.md#the-math-orchestra): the Solver answers, the Verifier judges, approved samples
stop and the others loop, up to `max_loop_num` loops.

One loop (`turn` t) is two agent steps: the Solver's attempt t, then the Verifier's verdict on it.
What the Solver sees in loop t > 0 (its role view, `solver_view`):

    opening (strategy-augmented problem) | attempt 0 | reply 0 | ... | attempt t-1 | reply t-1

where reply i is
- for `iid`, `prompt_aug` and `tree`: the Verifier's rejection, a user message written by
  `MathOrchestra.rejection_message` that quotes the Verifier's output. The Verifier is part of
  the team at test time too, so this context is legitimate and is trained as sampled;
- for `feedback`: the task's `feedback_message(problem, attempt)`, the environment's privileged
  feedback, which the feedback strategy's training transform drops (the expert-iteration plan's 2-turn feedback).

Stopping:
- `iid`, `prompt_aug`, `tree`: a sample stops when the Verifier approves
  (`task.parse_verdict(text) is True`; an unparsable verdict counts as a rejection) or after
  `max_loop_num` loops. In `tree` the selected Verifier candidate's verdict decides.
- `feedback`: exactly two Solver turns for every sample (attempt1 -> feedback -> attempt2),
  whatever the Verifier said and whatever `max_loop_num` is. Every sample gets an attempt2, so
  the (uid, solver, turn 1, feedback) group always has `group_size` members, all trained under
  the same training context, and no selection bias (only-after-a-wrong-attempt) enters it. The
  Verifier still judges both attempts (its rows are ordinary Verifier rows).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from pipeline.rollout.agent import Agent
from pipeline.errors import ConfigError
from pipeline.strategies import Feedback, Strategy
from pipeline.types import Message, Problem

__all__ = [
    "AgentStep",
    "MathOrchestra",
    "FEEDBACK_TURNS",
    "ENVIRONMENT",
    "SOLVER",
    "VERIFIER",
    "ROLES",
    "Utterance",
    "solver_view",
    "verifier_view",
    "default_agents",
]

SOLVER = "solver"
"""Role (and default agent id) of the agent that answers the problem."""
VERIFIER = "verifier"
"""Role (and default agent id) of the agent that judges the Solver's answer."""
ROLES = (SOLVER, VERIFIER)


@dataclass(frozen=True)
class Utterance:
    """One message said to the Solver after its first turn, in the order it happened."""

    speaker: str
    """The agent id that produced it, or "environment" for the task's feedback."""
    text: str
    """The message content exactly as the listener receives it."""


def solver_view(opening: Sequence[Message], attempts: Sequence[str], replies: Sequence[Utterance]) -> list[Message]:
    """The Solver's context: `opening` (its first-turn sampling context), then each of its own
    attempts as an assistant turn followed by the reply it got as a user turn. The Verifier
    never appears as the Solver's own turn, and the Solver's words never as the Verifier's.

    `attempts[i]` is answered by `replies[i]`; there must be one reply per attempt."""
    if len(replies) != len(attempts):
        raise ValueError(f"solver_view needs one reply per attempt, got {len(attempts)} attempts and {len(replies)} replies")
    out = [Message(role=m["role"], content=m["content"]) for m in opening]
    for attempt, reply in zip(attempts, replies):
        out.append(Message(role="assistant", content=attempt))
        out.append(Message(role="user", content=reply.text))
    return out


def verifier_view(task, problem: Problem, solver_text: str) -> list[Message]:
    """The Verifier's context: the task's verification prompt, with the Solver's answer inside a
    user message (never as the Verifier's own assistant turn)."""
    return [Message(role=m["role"], content=m["content"]) for m in task.verifier_messages(problem, solver_text)]


def default_agents(shared_policy: bool = True) -> tuple[Agent, Agent]:
    """The math team: Solver and Verifier, sharing the policy "shared" (default) or each on its
    own policy (policy id = agent id)."""
    if shared_policy:
        return Agent(SOLVER, SOLVER), Agent(VERIFIER, VERIFIER)
    return Agent(SOLVER, SOLVER, policy_id=SOLVER), Agent(VERIFIER, VERIFIER, policy_id=VERIFIER)

FEEDBACK_TURNS = 2
"""Solver turns of the `feedback` strategy: attempt1 and attempt2."""
ENVIRONMENT = "environment"
"""Speaker of the task's feedback messages."""

DEFAULT_REJECTION = "The verifier rejected your answer: {verifier_text}\nTry again."


@dataclass(frozen=True)
class AgentStep:
    """One position of the orchestra's schedule: which role acts in which loop."""

    step: int
    """Index in the schedule (written to the `step` column)."""
    turn: int
    """Loop index (written to the `turn` column)."""
    role: str
    """"solver" or "verifier"."""


@dataclass(frozen=True)
class MathOrchestra:
    """Solver/Verifier loop over one task (DrMAS's math orchestra, docs/ALGORITHMS.md#the-math-orchestra)."""

    task: object
    """The task (pipeline.tasks Task protocol): prompts, feedback, verdict parsing, reward."""
    rejection_template: str = DEFAULT_REJECTION
    """User message the Solver gets after a rejection; `{verifier_text}` is the Verifier's output."""
    roles: tuple[str, ...] = (SOLVER, VERIFIER)
    """The order in which the roles act within one loop (fixed for this orchestra)."""
    quotes_verifier: bool = True
    """Whether the rejection quotes the Verifier's reply (`rejection_template` must then hold
    `{verifier_text}`). False: the Solver is told only that its answer was rejected, in words it
    was warm-started on (`math_review`, whose Solver answers nothing after a message it has never
    seen)."""

    def __post_init__(self) -> None:
        for name in ("solver_messages", "verifier_messages", "feedback_message", "reward", "parse_verdict"):
            if not callable(getattr(self.task, name, None)):
                raise ConfigError(f"MathOrchestra.task must implement the Task protocol; it has no method {name!r}")
        if self.quotes_verifier and "{verifier_text}" not in self.rejection_template:
            raise ConfigError("MathOrchestra.rejection_template must contain '{verifier_text}'")
        if tuple(self.roles) != (SOLVER, VERIFIER):
            raise ConfigError(f"MathOrchestra.roles must be ('solver', 'verifier'), got {self.roles!r}")

    def schedule(self, max_loop_num: int, strategies: Sequence[Strategy]) -> list[AgentStep]:
        """All agent steps of a round, in order. Long enough for the longest strategy: the
        `feedback` strategy needs `FEEDBACK_TURNS` loops even when `max_loop_num` is smaller."""
        loops = max_loop_num
        if any(isinstance(s, Feedback) for s in strategies):
            loops = max(loops, FEEDBACK_TURNS)
        return [AgentStep(step=t * len(self.roles) + i, turn=t, role=r) for t in range(loops) for i, r in enumerate(self.roles)]

    def opening(self, strategy: Strategy, problem: Problem) -> list[Message]:
        """The Solver's first-turn sampling context under `strategy`."""
        return strategy.augment(self.task.solver_messages(problem), problem)

    def rejection_message(self, verifier_text: str) -> Utterance:
        """What the Solver is told after the Verifier rejected its attempt."""
        return Utterance(speaker=VERIFIER, text=self.rejection_template.format(verifier_text=verifier_text.strip()))

    def reply(self, strategy: Strategy, problem: Problem, attempt: str, verifier_text: str) -> Utterance:
        """The user turn the Solver gets after `attempt` before its next turn (see module doc)."""
        if isinstance(strategy, Feedback):
            msg = self.task.feedback_message(problem, attempt)
            return Utterance(speaker=ENVIRONMENT, text=msg["content"])
        return self.rejection_message(verifier_text)

    def continues(self, strategy: Strategy, turn: int, approved: bool, max_loop_num: int) -> bool:
        """Whether a sample whose Verifier step of loop `turn` just ended has another loop."""
        if isinstance(strategy, Feedback):
            return turn + 1 < FEEDBACK_TURNS
        return (not approved) and turn + 1 < max_loop_num
