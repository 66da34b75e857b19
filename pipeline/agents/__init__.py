"""Agents (ids, policies) and the math Solver/Verifier orchestra (the math workflow's own rules)."""

from pipeline.agents.agent import SHARED_POLICY, Agent
from pipeline.agents.orchestra import (
    ENVIRONMENT,
    FEEDBACK_TURNS,
    ROLES,
    SOLVER,
    VERIFIER,
    AgentStep,
    MathOrchestra,
    Utterance,
    default_agents,
    solver_view,
    verifier_view,
)

__all__ = [
    "Agent",
    "AgentStep",
    "ENVIRONMENT",
    "FEEDBACK_TURNS",
    "MathOrchestra",
    "ROLES",
    "SHARED_POLICY",
    "SOLVER",
    "VERIFIER",
    "Utterance",
    "default_agents",
    "solver_view",
    "verifier_view",
]
