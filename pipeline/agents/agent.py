"""Agents: who acts, under which policy, and how each one sees the conversation (its role view).

An agent's role view decides whose words are "assistant" for it. The Solver's own attempts are
its assistant turns and everything addressed to it (a Verifier's rejection, the task's feedback)
arrives as user turns. The Verifier never sees the Solver's words as its own turns: it judges
the Solver's latest answer shown inside a user message built by the task
(`task.verifier_messages(problem, solver_text)`), as in the twenty-questions setting where each
player's context holds only its own moves as assistant turns.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Sequence

from pipeline.errors import ConfigError
from pipeline.types import Message, Problem

__all__ = [
    "SOLVER",
    "VERIFIER",
    "ROLES",
    "SHARED_POLICY",
    "Agent",
    "Utterance",
    "default_agents",
]

SOLVER = "solver"
"""Role (and default agent id) of the agent that answers the problem."""
VERIFIER = "verifier"
"""Role (and default agent id) of the agent that judges the Solver's answer."""
ROLES = (SOLVER, VERIFIER)
SHARED_POLICY = "shared"
"""Policy id used when all agents share one set of weights."""

Role = Literal["solver", "verifier"]


@dataclass(frozen=True)
class Utterance:
    """One message said to the Solver after its first turn, in the order it happened."""

    speaker: str
    """The agent id that produced it, or "environment" for the task's feedback."""
    text: str
    """The message content exactly as the listener receives it."""


@dataclass(frozen=True)
class Agent:
    """One member of a team: its id, its role in the orchestra and the policy that samples it."""

    agent_id: str
    """Written to the `agent_id` column; unique within a team."""
    role: Role
    """"solver" or "verifier": which role view and which rewards apply to this agent."""
    policy_id: str = SHARED_POLICY
    """Written to the `policy_id` column; agents with equal policy ids are trained together and
    sampled from the same engine."""

    def __post_init__(self) -> None:
        if not self.agent_id or not isinstance(self.agent_id, str):
            raise ConfigError(f"Agent.agent_id must be a non-empty string, got {self.agent_id!r}")
        if self.role not in ROLES:
            raise ConfigError(f"Agent.role must be one of {list(ROLES)}, got {self.role!r}")
        if not self.policy_id or not isinstance(self.policy_id, str):
            raise ConfigError(f"Agent.policy_id must be a non-empty string, got {self.policy_id!r}")

    def solver_view(self, opening: Sequence[Message], attempts: Sequence[str], replies: Sequence[Utterance]) -> list[Message]:
        """The Solver's context: `opening` (its first-turn sampling context), then each of its own
        attempts as an assistant turn followed by the reply it got as a user turn.

        `attempts[i]` is answered by `replies[i]`; there is one attempt more than replies while a
        reply is pending, never fewer replies than attempts when building the next context."""
        if self.role != SOLVER:
            raise ConfigError(f"agent {self.agent_id!r} has role {self.role!r}; solver_view is the Solver's")
        if len(replies) != len(attempts):
            raise ValueError(f"solver_view needs one reply per attempt, got {len(attempts)} attempts and {len(replies)} replies")
        out = [Message(role=m["role"], content=m["content"]) for m in opening]
        for attempt, reply in zip(attempts, replies):
            out.append(Message(role="assistant", content=attempt))
            out.append(Message(role="user", content=reply.text))
        return out

    def verifier_view(self, task, problem: Problem, solver_text: str) -> list[Message]:
        """The Verifier's context: the task's verification prompt, with the Solver's answer inside
        a user message (never as the Verifier's own assistant turn)."""
        if self.role != VERIFIER:
            raise ConfigError(f"agent {self.agent_id!r} has role {self.role!r}; verifier_view is the Verifier's")
        return [Message(role=m["role"], content=m["content"]) for m in task.verifier_messages(problem, solver_text)]


def default_agents(shared_policy: bool = True) -> tuple[Agent, Agent]:
    """The default team: Solver and Verifier, sharing the policy "shared" (default) or each on
    its own policy (policy id = agent id)."""
    if shared_policy:
        return Agent(SOLVER, SOLVER), Agent(VERIFIER, VERIFIER)
    return Agent(SOLVER, SOLVER, policy_id=SOLVER), Agent(VERIFIER, VERIFIER, policy_id=VERIFIER)
