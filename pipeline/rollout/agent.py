"""Agents: who acts, under which policy.

An `Agent` is a member of a team (`pipeline.workflows.Workflow.agents`): its id, written to the
`agent_id` column, an optional role label, and the policy that samples it (written to
`policy_id`; agents with equal policy ids share weights and are trained together). What an agent
sees and what its calls earn is its workflow's business (`pipeline.workflows`); the math
Solver/Verifier team's role views live with that workflow (`pipeline.workflows.math.orchestra`).
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.errors import ConfigError

__all__ = ["SHARED_POLICY", "Agent"]

SHARED_POLICY = "shared"
"""Policy id used when all agents share one set of weights."""


@dataclass(frozen=True)
class Agent:
    """One member of a team: its id, its role in its workflow and the policy that samples it."""

    agent_id: str
    """Written to the `agent_id` column; unique within a team."""
    role: str | None = None
    """What the agent does in its workflow (a free label its workflow reads); None = its id."""
    policy_id: str = SHARED_POLICY
    """Written to the `policy_id` column; agents with equal policy ids are trained together and
    sampled from the same engine."""

    def __post_init__(self) -> None:
        if not self.agent_id or not isinstance(self.agent_id, str):
            raise ConfigError(f"Agent.agent_id must be a non-empty string, got {self.agent_id!r}")
        if self.role is None:
            object.__setattr__(self, "role", self.agent_id)
        if not self.role or not isinstance(self.role, str):
            raise ConfigError(f"Agent.role must be a non-empty string or None, got {self.role!r}")
        if not self.policy_id or not isinstance(self.policy_id, str):
            raise ConfigError(f"Agent.policy_id must be a non-empty string, got {self.policy_id!r}")
