"""The records of a round of rollouts while it is sampled, and the `steps` table they become.

An `Episode` is one trajectory (ordinary strategies) or one tree (the tree strategy); a `Row` is
one agent call, mutable until its rewards are known. `build_rows` makes an agent step's rows
from the engine's samples (ids in the module doc of `pipeline.rollout.loop`), `to_table` the
`steps` table from every row of the round, in the order they were made.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import pyarrow as pa

from pipeline.errors import DataError
from pipeline.models.chat import prompt_hash
from pipeline.rollout.agent import Agent
from pipeline.rollout.rewards import Outcome, row_reward
from pipeline.rollout.sampling import RolloutConfig
from pipeline.strategies import Strategy
from pipeline.types import Message, Problem, Sample
from schemas import STEPS, validate

__all__ = ["Row", "Episode", "build_rows", "to_table"]


@dataclass(slots=True)
class Row:
    """One agent call: its ids, its context and sample, and its rewards once known."""

    step_id: str
    strategy: str
    uid: str
    traj_uid: str
    sample_idx: int
    agent_id: str
    policy_id: str
    turn: int
    step: int
    parent_node_id: str | None
    messages: list[Message]
    prompt_ids: list[int]
    sample: Sample
    model_version: str
    engine: str
    seed: int
    selected: bool = True
    verdict: bool | None = None
    global_: Outcome | None = None
    local: Outcome | None = None
    temperature: float | None = None
    """The temperature the call was sampled at, where it is not the round's (a program's request
    that the run lets choose it, `pipeline.rollout.endpoint`); None: `RolloutConfig.temperature`."""


@dataclass(slots=True)
class Episode:
    """One trajectory (ordinary strategies) or one tree (tree strategy); mutable while sampled."""

    problem: Problem
    strategy: Strategy
    traj_uid: str
    """Trajectory id; for a tree, the prefix of its branches' ids."""
    sample_idx: int
    env: object = None
    """The workflow's environment state (`Env`); for a tree, the selected branch's."""
    active: bool = True
    parent: str | None = None
    rows: list[Row] = field(default_factory=list)
    error: str | None = None
    """Why the episode stopped early (the workflow's code raised, hung or returned nonsense):
    its team reward is null with this message in `reward_error`."""
    first_team: Outcome | None = None
    """Feedback episodes: the team reward at the end of the first turn, before the feedback (the
    first attempt's own outcome, the global reward of the first turn's rows)."""

    @property
    def tree(self) -> bool:
        return self.strategy.tree

    @property
    def width(self) -> int:
        return self.strategy.group_size if self.tree else 1


def build_rows(
    episode: Episode, agent: Agent, turn: int, step: int, messages: list[Message], prompt: list[int], seed: int, samples: Sequence[Sample], sampler
) -> list[Row]:
    """The rows of one episode's agent step: one per sample (a tree node's candidates are its
    branches `{traj_uid}-s{c}`), each with the sample verbatim (token ids and logprobs of equal
    length, else a `DataError` naming the step_id)."""
    rows = []
    version, engine_name = sampler.model_version, sampler.engine
    for c, sample in enumerate(samples):
        sample_idx = c if episode.tree else episode.sample_idx
        traj_uid = f"{episode.traj_uid}-s{c}" if episode.tree else episode.traj_uid
        step_id = f"{traj_uid}-{agent.agent_id}-t{turn}"
        if len(sample.token_ids) != len(sample.logprobs):
            raise DataError(
                f"engine {engine_name!r} returned {len(sample.token_ids)} token ids but {len(sample.logprobs)} logprobs for step_id {step_id!r}"
            )
        rows.append(
            Row(
                step_id=step_id, strategy=episode.strategy.strategy_id, uid=episode.problem.uid, traj_uid=traj_uid, sample_idx=sample_idx,
                agent_id=agent.agent_id, policy_id=agent.policy_id, turn=turn, step=step, parent_node_id=episode.parent, messages=messages,
                prompt_ids=prompt, sample=sample, model_version=version, engine=engine_name, seed=seed,
            )
        )
    return rows


def to_table(rows: list[Row], config: RolloutConfig) -> pa.Table:
    """The `steps` table of `rows`, with the mixed reward of `config`, validated against
    `schemas.STEPS` (a workflow's own episodes hand back rows of any making)."""
    cols: dict[str, list] = {f.name: [] for f in STEPS.schema}
    for row in rows:
        rew = row_reward(config.alpha, row.global_, row.local, config.local_weight)
        cols["round"].append(config.round)
        cols["step_id"].append(row.step_id)
        cols["strategy"].append(row.strategy)
        cols["uid"].append(row.uid)
        cols["traj_uid"].append(row.traj_uid)
        cols["sample_idx"].append(row.sample_idx)
        cols["agent_id"].append(row.agent_id)
        cols["policy_id"].append(row.policy_id)
        cols["turn"].append(row.turn)
        cols["step"].append(row.step)
        cols["node_id"].append(row.step_id)
        cols["parent_node_id"].append(row.parent_node_id)
        cols["selected"].append(row.selected)
        cols["active"].append(True)
        cols["sampling_messages"].append(row.messages)
        cols["prompt_hash"].append(prompt_hash(row.prompt_ids))
        cols["prompt_ids"].append(row.prompt_ids)
        cols["completion_ids"].append(list(row.sample.token_ids))
        cols["completion_logprobs"].append(list(row.sample.logprobs))
        cols["completion_text"].append(row.sample.text)
        cols["finish_reason"].append(row.sample.finish_reason)
        cols["global_reward"].append(rew.global_reward)
        cols["local_reward"].append(rew.local_reward)
        cols["reward"].append(rew.reward)
        cols["reward_error"].append(rew.reward_error)
        cols["verdict"].append(row.verdict)
        cols["model_version"].append(row.model_version)
        policy_round = config.policy_rounds.get(row.policy_id)
        cols["policy_round"].append(policy_round)
        cols["staleness"].append(None if policy_round is None else config.staleness.get(row.policy_id))
        cols["engine"].append(row.engine)
        cols["seed"].append(row.seed)
        cols["temperature"].append(float(config.temperature if row.temperature is None else row.temperature))
    arrays = [pa.array(cols[f.name], type=f.type) for f in STEPS.schema]
    return validate(pa.Table.from_arrays(arrays, schema=STEPS.schema), STEPS)
