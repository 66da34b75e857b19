"""Agents (roles, role views, policies) and the orchestras that make them act together."""

from pipeline.agents.agent import ROLES, SHARED_POLICY, SOLVER, VERIFIER, Agent, Utterance, default_agents
from pipeline.agents.orchestra import ENVIRONMENT, FEEDBACK_TURNS, AgentStep, MathOrchestra

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
]
