"""The workflow contract: one Python object describes a team and its environment.

A `Workflow` names its agents (any number, any ids, each with a policy id), draws problems, and
makes an `Env` for one problem: the environment's state for one episode. The rollout engine
(`pipeline.rollouts.run_rollouts`) drives every workflow the same way:

    env = workflow.reset(problem, strategy)
    for turn in range(max_turns):
        for agent_id in workflow.turn_order:
            messages = env.observe(agent_id)          # what the agent sees, as chat messages
            text = <sampled from the agent's policy>  # one `steps` row per call
            result = env.step(agent_id, text)         # local reward, done, verdict
            if result.done: stop
    team reward = env.team_reward()                   # the global reward of every row

Every agent call is one `steps` row with its tokens and logprobs; the search strategies apply
to any workflow:
- `iid`: `group_size` independent episodes per problem;
- `prompt_aug`: the problem's hint is shown to the agents in `workflow.hinted_agents` (a system
  message, `pipeline.strategies.PromptAug.augment`) and dropped from their training context;
- `feedback`: the workflow's environment gives privileged feedback after the first attempt of
  `workflow.feedback_agent` (workflows that support it say so with `supports_feedback`); that
  agent's second-turn context must be its opening + (attempt, feedback), the shape the training
  transform cuts (`pipeline.strategies.split_opening`);
- `tree` (AT-GRPO): at each agent step N candidates are sampled from one state, each steps its
  own `env.copy()`, the best by the mixed reward (alpha * team reward after the step + local)
  is selected and its state becomes the state of every branch.

User code is hostile input: `observe`, `step`, `team_reward`, `copy` and `feedback` run guarded.
A call that raises, hangs past the reward timeout or returns nonsense (a reward that is not a
finite number, messages that are not chat messages) ends that episode: its row gets a null
reward and `reward_error` names what went wrong, and the round goes on. A workflow that breaks
the contract where it can be checked before sampling (no agents, repeated ids, a turn order
naming an unknown agent, a strategy it does not support) is a one-line `ConfigError` naming the
workflow (`check_workflow`).
"""

from __future__ import annotations

import copy as _copy
import math
from dataclasses import dataclass, replace
from typing import ClassVar, Mapping, Sequence

from pipeline.agents.agent import SHARED_POLICY, Agent
from pipeline.errors import ConfigError
from pipeline.types import Message, Problem

__all__ = ["StepResult", "Env", "Workflow", "check_workflow", "with_policies"]


@dataclass(frozen=True)
class StepResult:
    """What the environment says after one agent call."""

    reward: float | None
    """The agent's local reward for this call (None: unknown; the row's reward is then null)."""
    done: bool = False
    """Whether the episode ends after this call (no agent acts again)."""
    verdict: bool | None = None
    """An optional yes/no decision the call made (a checker's approval), stored in the `verdict`
    column; None when the agent makes no such decision or it could not be read."""
    error: str | None = None
    """Why `reward` is None, written to the row's `reward_error` (the episode goes on)."""


class Env:
    """The environment's state for one problem, one episode. Subclass it; the tree strategy
    copies it (`copy`, by default a deep copy) and continues from the selected copy."""

    def observe(self, agent_id: str) -> list[Message]:
        """The chat messages the agent sees before its call (its whole context)."""
        raise NotImplementedError

    def step(self, agent_id: str, text: str) -> StepResult:
        """Take the agent's completion text; return its local reward and whether the episode ends."""
        raise NotImplementedError

    def team_reward(self) -> float | None:
        """The global (team) reward of the state as it is now (read at the end of an episode, and
        right after every tree candidate's step)."""
        raise NotImplementedError

    def copy(self) -> "Env":
        """An independent copy of this state (the tree's broadcast of the selected branch)."""
        return _copy.deepcopy(self)


class Workflow:
    """A team and its environment. Subclass it and set `name` and `agents`; implement
    `problems` and `reset`. Everything else has a default."""

    name: ClassVar[str] = ""
    """Short name, shown by `maxit run` and written to the run's record."""
    agents: tuple[Agent, ...] = ()
    """The team: one `Agent(agent_id, policy_id)` per member (equal policy ids share weights)."""
    max_turns: int = 1
    """Turns at most per episode (every agent of `turn_order` acts once per turn)."""
    supports_feedback: ClassVar[bool] = False
    """Whether `reset(problem, Feedback(...))` gives an environment that runs the two-turn
    feedback strategy (privileged feedback after `feedback_agent`'s first attempt)."""

    # -- what a subclass provides ---------------------------------------------------------
    def problems(self, split: str, n: int, seed: int) -> list[Problem]:
        """`n` problems of `split` ("train" or "heldout"; the two never share a problem)."""
        raise NotImplementedError

    def reset(self, problem: Problem, strategy) -> Env:
        """A fresh environment for one episode of `problem` under `strategy`
        (a `pipeline.strategies.Strategy`; most environments ignore it)."""
        raise NotImplementedError

    # -- defaults -------------------------------------------------------------------------
    @property
    def turn_order(self) -> tuple[str, ...]:
        """Agent ids in the order they act within one turn (default: `agents` order)."""
        return tuple(a.agent_id for a in self.agents)

    @property
    def hinted_agents(self) -> tuple[str, ...]:
        """Agents shown the problem's hint under `prompt_aug` (default: the first to act)."""
        return self.turn_order[:1]

    @property
    def feedback_agent(self) -> str:
        """The agent whose second attempt the feedback strategy trains context-swapped."""
        return self.turn_order[0]

    def max_tokens(self, agent_id: str, kind: str = "rollout") -> int | None:
        """Completion budget of the agent's calls (kind "rollout" or "eval"); None = the run's."""
        return None

    def default_model(self):
        """The embedded model a run starts from when no model directory is given (a local HF
        model directory), or None when the workflow has none (then `--model` is required)."""
        return None

    def evaluate(self, samplers, tokenizers, config, round_: int):
        """The `evaluation` rows of one round (default: `pipeline.evaluation.evaluate_workflow`,
        the team on held-out problems, team success and each agent's mean local reward)."""
        from pipeline.evaluation import evaluate_workflow

        return evaluate_workflow(self, samplers, tokenizers, config, round_)

    table_metrics: ClassVar[tuple[tuple[str, str, str], ...]] = (
        ("team", "success", "success"),
        ("team", "success_greedy", "greedy"),
    )
    """(agent_id, metric, column) of the evaluation metrics the round table shows."""

    @property
    def policy_ids(self) -> tuple[str, ...]:
        """The team's policies, in the order of their first agent."""
        return tuple(dict.fromkeys(a.policy_id for a in self.agents))

    def describe(self) -> str:
        """One line: the workflow's name and its agents with their policies."""
        team = ", ".join(f"{a.agent_id}@{a.policy_id}" for a in self.agents)
        return f"{self.name or type(self).__name__} ({team})"


def with_policies(workflow: Workflow, shared: bool) -> Workflow:
    """`workflow` with every agent on the one policy "shared" (`shared=True`) or each on its own
    policy named after it; a workflow whose agents already name other policies keeps them."""
    ids = {a.policy_id for a in workflow.agents}
    if ids - {SHARED_POLICY} and ids != {a.agent_id for a in workflow.agents}:
        return workflow
    agents = tuple(replace(a, policy_id=SHARED_POLICY if shared else a.agent_id) for a in workflow.agents)
    if agents == tuple(workflow.agents):
        return workflow
    clone = _copy.copy(workflow)
    try:
        clone.agents = agents
    except AttributeError as err:  # a frozen dataclass workflow
        raise ConfigError(f"workflow {workflow.name!r}: cannot set its agents' policies ({err})") from None
    return clone


def check_workflow(workflow: object, strategies: Sequence = ()) -> Workflow:
    """Check what can be checked before sampling; a broken contract is one `ConfigError` line
    naming the workflow and what is wrong."""
    name = getattr(workflow, "name", "") or type(workflow).__name__

    def bad(what: str) -> ConfigError:
        return ConfigError(f"workflow {name!r}: {what}")

    for method in ("problems", "reset"):
        if not callable(getattr(workflow, method, None)):
            raise bad(f"has no method {method}()")
    agents = getattr(workflow, "agents", None)
    if not isinstance(agents, (tuple, list)) or not agents:
        raise bad("agents must be a non-empty tuple of pipeline.agents.Agent")
    for a in agents:
        if not isinstance(a, Agent):
            raise bad(f"agents must be pipeline.agents.Agent records, got {type(a).__name__}")
    ids = [a.agent_id for a in agents]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise bad(f"agent ids must be unique; repeated: {dup}")
    if any(i in ("team", "*") for i in ids):
        raise bad("'team' and '*' are reserved and cannot be agent ids")
    order = tuple(workflow.turn_order)
    if not order:
        raise bad("turn_order is empty")
    unknown = sorted(set(order) - set(ids))
    if unknown:
        raise bad(f"turn_order names unknown agent(s) {unknown}; the agents are {ids}")
    if len(set(order)) != len(order):
        raise bad(f"turn_order lists an agent twice: {list(order)} (an agent acts once per turn)")
    turns = workflow.max_turns
    if isinstance(turns, bool) or not isinstance(turns, int) or turns < 1:
        raise bad(f"max_turns must be an integer >= 1, got {turns!r}")
    for agent_id in workflow.hinted_agents:
        if agent_id not in ids:
            raise bad(f"hinted_agents names unknown agent {agent_id!r}")
    for s in strategies:
        if getattr(s, "strategy_id", None) == "feedback":
            if not workflow.supports_feedback:
                raise bad("does not support the feedback strategy (its supports_feedback is False); drop 'feedback' from the strategies")
            if workflow.feedback_agent not in ids:
                raise bad(f"feedback_agent {workflow.feedback_agent!r} is not one of its agents {ids}")
    return workflow


def finite_reward(value: object, what: str) -> float | None:
    """A reward value as a float, None for None; anything else that is not a finite number is a
    ValueError naming `what` (the rollout engine turns it into the row's `reward_error`)."""
    if value is None:
        return None
    if isinstance(value, bool) or isinstance(value, (str, bytes)):
        raise ValueError(f"{what} returned {value!r}, expected a number or None")
    try:
        v = float(value)  # numpy scalars too
    except (TypeError, ValueError):
        raise ValueError(f"{what} returned {type(value).__name__}, expected a number or None") from None
    if not math.isfinite(v):
        raise ValueError(f"{what} returned {v}")
    return v


def check_messages(messages: object, what: str) -> list[Message]:
    """`messages` as a list of chat messages ({"role": system|user|assistant, "content": str});
    anything else is a ValueError naming `what`."""
    if not isinstance(messages, (list, tuple)) or not messages:
        raise ValueError(f"{what} returned {type(messages).__name__ if not isinstance(messages, (list, tuple)) else 'no messages'}, expected a non-empty list of chat messages")
    out = []
    for m in messages:
        if not isinstance(m, Mapping) or m.get("role") not in ("system", "user", "assistant") or not isinstance(m.get("content"), str):
            raise ValueError(f"{what} returned a message that is not {{'role': system|user|assistant, 'content': str}}: {str(m)[:80]!r}")
        out.append(Message(role=m["role"], content=m["content"]))
    return out
