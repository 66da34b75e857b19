"""The part of the workflow contract that the rollout engine drives: an episode's `Env`, what
its step returns (`StepResult`), and the checks run on a workflow before sampling
(`check_workflow`) and on what its code returns (`check_messages`, `finite_reward`).

`pipeline.rollout.workflow` builds the `Workflow` base class on these (and re-exports them); its
docstring describes the whole contract. They sit below the engine and the evaluation, which
import them, while `Workflow`'s default `evaluate` calls the evaluation.
"""

from __future__ import annotations

import copy as _copy
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Mapping, Sequence

from pipeline.rollout.agent import Agent
from pipeline.errors import ConfigError, DataError
from pipeline.types import Message

__all__ = ["StepResult", "Env", "check_workflow", "check_messages", "finite_reward", "team_value", "side_value"]


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

    def team_reward(self) -> float | Mapping[str, float | None] | None:
        """The global (team) reward of the state as it is now (read at the end of an episode, and
        right after every tree candidate's step). A competitive game may return one value per
        side instead, a mapping from agent id to that agent's reward (self-play's game result for
        each player): each row then gets its own agent's value, and an agent the mapping leaves
        out gets a null reward saying so. An evaluation that needs one number per episode (the
        team's `success`, the baselines) reads the first agent of `turn_order`'s."""
        raise NotImplementedError

    def copy(self) -> "Env":
        """An independent copy of this state (the tree's broadcast of the selected branch)."""
        return _copy.deepcopy(self)


def check_workflow(workflow: object, strategies: Sequence = ()) -> object:
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
        raise bad("agents must be a non-empty tuple of pipeline.rollout.agent.Agent")
    for a in agents:
        if not isinstance(a, Agent):
            raise bad(f"agents must be pipeline.rollout.agent.Agent records, got {type(a).__name__}")
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
        if getattr(s, "strategy_id", None) == "tree" and not getattr(workflow, "supports_tree", True):
            raise bad("cannot run the tree strategy (it branches copies of one environment state, and this workflow has no state to copy); drop 'tree' from the strategies")
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


def team_value(value: object, what: str) -> float | dict[str, float | None] | None:
    """A `team_reward()` value checked: one number or None (`finite_reward`), or a mapping from
    agent id (a string) to a number or None, one per side; anything else is a ValueError naming
    `what`."""
    if isinstance(value, Mapping):
        out: dict[str, float | None] = {}
        for key, v in value.items():
            if not isinstance(key, str):
                raise ValueError(f"{what} returned a mapping with the key {key!r}, expected agent ids")
            out[key] = finite_reward(v, f"{what}[{key!r}]")
        return out
    return finite_reward(value, what)


def side_value(value: float | Mapping[str, float | None] | None, agent_id: str) -> tuple[float | None, str | None]:
    """(reward, why it is None) of `agent_id` from a checked team value (`team_value`): the value
    itself, or the agent's entry of a per-side mapping."""
    if not isinstance(value, Mapping):
        return value, None if value is not None else "team_reward returned None"
    if agent_id not in value:
        return None, f"team_reward gave no value for agent {agent_id!r} (it gave {sorted(value)})"
    v = value[agent_id]
    return v, None if v is not None else f"team_reward gave None for agent {agent_id!r}"


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


def jsonl_objects(path: str | Path, label: str, expected: str) -> Iterator[tuple[int, dict, Callable[[str], DataError]]]:
    """(line number, object, bad) for each non-blank line of a workflow's JSONL task file, where
    `bad(what)` is the DataError naming the file and the line. A missing file is a ConfigError;
    text that is not UTF-8, a line that is not JSON or not a JSON object (`expected` says what
    it should hold) a DataError, all prefixed with `label` ("grid task_file")."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{label} {p}: no such file")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise DataError(f"{label} {p}: not UTF-8 text ({err.reason} at byte {err.start})") from None
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue

        def bad(what: str, lineno: int = lineno) -> DataError:
            return DataError(f"{label} {p} line {lineno}: {what}")

        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise bad(f"not JSON ({err.msg})") from None
        if not isinstance(row, dict):
            raise bad(f"expected a JSON object with {expected}, got {type(row).__name__}")
        yield lineno, row, bad

