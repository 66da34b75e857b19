"""One round of multi-agent rollouts -> the `steps` table.

`run_rollouts(problems, workflow, strategies, sampler, config)` lets a workflow's team act on
every problem under every search strategy and returns one row per agent call (every candidate of
a tree step is a row), validated against `schemas.STEPS`; the store's table owner (`pipeline.store.Tables`) writes it.
The workflow contract (what an environment observes, steps and
rewards) is in `pipeline.rollout.workflow`.

`run_rollouts` is a loop over named steps: set-up (`_start`: the episodes and their resets), the
schedule (`_schedule`), then per agent step tokenising (`_prompts`), sampling
(`pipeline.rollout.sampling.sample_requests`), row building (`pipeline.rollout.rows.build_rows`),
env stepping (`step_envs`), tree selection (`select_candidate`) and, at the end of the first turn,
the feedback credit (`credit_first_attempts`); the final rewards (`final_rewards`) close the
round. These last steps, which run the environments' code, are `pipeline.rollout.env_steps`.
The rollout config, request seeds and shards live in `pipeline.rollout.sampling` (re-exported
here), the rows and the table in `pipeline.rollout.rows`.

Strategies (pipeline.strategies) and what they sample:
- `iid`, `prompt_aug`, `feedback`: `group_size` independent episodes per problem (`sample_idx`
  0..K-1), each from its own `workflow.reset(problem, strategy)`. Under `prompt_aug` the agents
  in `workflow.hinted_agents` see `strategy.augment(observation, problem)`.
- `tree` (AT-GRPO, docs/ALGORITHMS.md#tree-sampling): one tree per problem. At each agent step the
  current state (one node) gets N = `group_size` candidates from the same context (`prompt_hash`
  equal); every candidate is a row and steps its own copy of the environment (`env.copy()`);
  its immediate reward is alpha * the team reward right after its step + local_weight * its
  local reward; the best (greedy argmax, first on ties, nulls last; candidate 0 when
  `greedy=False`) is marked `selected` and its environment state is the state of all N branches
  for the next step. Branch i's rows share `traj_uid=...-s{i}` and `sample_idx=i`; the next
  step's rows have `parent_node_id` = the selected row's `node_id`, so a (uid, agent_id, turn)
  group of the tree is exactly the N siblings of one node.

Rewards: `local_reward` is what `env.step` returned for the call; `global_reward` is the
episode's team reward at its end (`env.team_reward()`; where it gives one value per side, a
competitive game's, the row's own agent's) on every row of an ordinary trajectory,
the team reward right after the step on a tree row, and on the first turn's rows of a feedback
episode the team reward at the end of that turn (the first attempt's own outcome: the second
attempt, made after privileged feedback, is not the first attempt's credit). Workflow code runs guarded (`safe_map`,
the reward timeout per call): a call that raises, hangs or returns nonsense ends its episode, the
row it happened on gets a null reward with the message in `reward_error`, and the round goes on.

Batching and seeds: the schedule is `workflow.max_turns` turns of `workflow.turn_order` (agent
step `step = turn * len(turn_order) + position`). At each agent step every active trajectory and
tree node of every strategy and problem is sampled. Identical prompts of one problem are merged
into one request (so the K samples of a first turn go out as one prompt with n=K, a tree node as
one prompt with n=N), and each request carries its own seed (`request_seed`: run seed, round,
step and the request's first `traj_uid`). Requests are sent in one engine call per distinct
sample count. What a request draws depends on the request alone, not on the other prompts of
the call, so splitting a round's problems into shards (`shard_of`, `merge_shards`) gives the
same rows.

A workflow that plays whole episodes itself rather than through `Env` steps (a program of
OpenAI API calls, `pipeline.workflows.program`) has a method `run_episodes(problems, strategies,
samplers, tokenizers, config) -> list[Row]`: `run_rollouts` checks the inputs as for any
workflow, hands it the samplers and tokenizers by policy id, and makes the table of its rows.

Row ids (deterministic): `traj_uid = r{round}-{strategy}-{uid}-s{sample}`,
`step_id = node_id = {traj_uid}-{agent_id}-t{turn}`; `parent_node_id` is the previous row of
the trajectory (in a tree, the selected candidate of the previous step), null at the first step.

Columns the rows carry for context swaps (docs/ALGORITHMS.md#the-context-swap): `sampling_messages`
are the exact messages the call was rendered from, `prompt_ids == encode_prompt(tokenizer,
sampling_messages)` are the exact ids sent to the engine, `completion_ids`/`completion_logprobs`
are the engine's Sample verbatim (equal lengths, checked). `active` is True on every row: an
episode that is done simply has no later rows. `seed` is the request's seed (`request_seed`);
the engine draws sample j of it with its own seed derived from it
(`pipeline.engines.config.sample_seeds`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

import pyarrow as pa

from pipeline.errors import ConfigError, DataError
from pipeline.models.chat import encode_prompt
from pipeline.rollout.agent import Agent
from pipeline.rollout.contract import check_messages, check_workflow
from pipeline.rollout.env_steps import credit_first_attempts, final_rewards, follow, select_candidate, step_envs
from pipeline.rollout.rewards import safe_map
from pipeline.rollout.rows import Episode, Row, build_rows, to_table
from pipeline.rollout.sampling import RolloutConfig, sample_requests
from pipeline.strategies import Feedback, Strategy
from pipeline.types import Message, Problem, Sampler

__all__ = ["run_rollouts", "make_episodes"]


def run_rollouts(
    problems: Sequence[Problem],
    workflow,
    strategies: Sequence[Strategy],
    sampler: Sampler | Mapping[str, Sampler],
    config: RolloutConfig,
    *,
    tokenizer=None,
) -> pa.Table:
    """Run one round of `workflow` (`pipeline.workflows.Workflow`) and return its `steps` table
    (validated).

    `sampler` is one engine for every policy, or a mapping policy_id -> engine when agents have
    their own policies. `tokenizer` renders prompts (`encode_prompt`); by default the sampler's
    `tokenizer` attribute, else `pipeline.models.load_tokenizer(sampler.model_dir)`.

    A workflow that plays whole episodes itself (`run_episodes`, a program's: see the module
    doc) gets the checked inputs and returns the rows; the table is made and validated by `to_table`."""
    if callable(getattr(workflow, "run_episodes", None)):
        return _run_episodes(problems, workflow, strategies, sampler, config, tokenizer)
    round_ = _start(problems, workflow, strategies, sampler, config, tokenizer)
    for turn, step, agent_id in _schedule(workflow):
        live = [e for e in round_.episodes if e.active]
        if not live:
            break
        _agent_step(round_, live, turn, step, agent_id)
    final_rewards(round_.episodes, config.reward_timeout)
    return to_table(round_.rows, config)


def _run_episodes(problems, workflow, strategies, sampler, config, tokenizer) -> pa.Table:
    """The rows of a workflow that plays its episodes itself: `workflow.run_episodes(problems,
    strategies, samplers, tokenizers, config)` with the samplers and tokenizers by policy id."""
    if not isinstance(config, RolloutConfig):
        raise ConfigError(f"config must be a RolloutConfig, got {type(config).__name__}")
    _check_inputs(problems, workflow, strategies)
    samplers = _samplers(sampler, workflow.agents)
    tokenizers = {pid: tokenizer if tokenizer is not None else _tokenizer_of(eng) for pid, eng in samplers.items()}
    rows = workflow.run_episodes(list(problems), list(strategies), samplers, tokenizers, config)
    return to_table(rows, config)


@dataclass
class _Round:
    """What one `run_rollouts` call carries from agent step to agent step."""

    config: RolloutConfig
    agents: dict[str, Agent]
    samplers: dict[str, Sampler]
    tokenizer: object
    """The caller's tokenizer, or None (each policy's sampler's, loaded at its first step)."""
    hinted: frozenset[str]
    last_agent: str
    episodes: list[Episode]
    tokenizers: dict[str, object] = field(default_factory=dict)
    encoded: dict[tuple, list[int]] = field(default_factory=dict)
    """(policy_id, messages) -> prompt ids: identical contexts are tokenised once."""
    rows: list[Row] = field(default_factory=list)
    """Every row of the round, in the order they were sampled."""


def _start(problems, workflow, strategies, sampler, config, tokenizer) -> _Round:
    """Set-up: check the inputs, make every episode and reset its environment (guarded)."""
    if not isinstance(config, RolloutConfig):
        raise ConfigError(f"config must be a RolloutConfig, got {type(config).__name__}")
    _check_inputs(problems, workflow, strategies)
    episodes = make_episodes(problems, strategies, config.round)
    resets = safe_map(workflow.reset, [(e.problem, e.strategy) for e in episodes], config.reward_timeout, label="reset")
    for e, env in zip(episodes, resets):
        if env.ok and env.value is not None:
            e.env = env.value
        else:
            e.active, e.error = False, f"reset: {env.error or 'returned None'}"
    return _Round(
        config=config, agents={a.agent_id: a for a in workflow.agents}, samplers=_samplers(sampler, workflow.agents), tokenizer=tokenizer,
        hinted=frozenset(workflow.hinted_agents), last_agent=tuple(workflow.turn_order)[-1], episodes=episodes,
    )


def make_episodes(problems: Sequence[Problem], strategies: Sequence[Strategy], round_: int) -> list[Episode]:
    """Every strategy's episodes, strategy by strategy, problem by problem: one tree per problem,
    or `group_size` trajectories."""
    episodes: list[Episode] = []
    for strategy in strategies:
        sid = strategy.strategy_id
        for problem in problems:
            if strategy.tree:
                episodes.append(Episode(problem, strategy, f"r{round_}-{sid}-{problem.uid}", 0))
            else:
                for k in range(strategy.group_size):
                    episodes.append(Episode(problem, strategy, f"r{round_}-{sid}-{problem.uid}-s{k}", k))
    return episodes


def _schedule(workflow) -> list[tuple[int, int, str]]:
    """(turn, step, agent_id) of every agent step: `max_turns` turns of `turn_order`."""
    order = tuple(workflow.turn_order)
    return [(t, t * len(order) + i, agent_id) for t in range(int(workflow.max_turns)) for i, agent_id in enumerate(order)]


def _agent_step(round_: _Round, live: list[Episode], turn: int, step: int, agent_id: str) -> None:
    """One agent step of every live episode: its context, its samples, its rows, the
    environments' steps and, in a tree, the selected candidate."""
    config = round_.config
    agent = round_.agents[agent_id]
    eng = round_.samplers[agent.policy_id]
    acting, contexts, prompts = _prompts(round_, live, agent, turn)
    if not acting:
        return
    drawn = sample_requests(eng, acting, prompts, config, step, agent_id)
    new_rows = [build_rows(e, agent, turn, step, msgs, prompt, seed, samples, eng) for e, msgs, prompt, (seed, samples) in zip(acting, contexts, prompts, drawn)]
    for e, rows in zip(acting, new_rows):
        round_.rows.extend(rows)
        e.rows.extend(rows)
    stepped = step_envs(acting, new_rows, agent_id, config.reward_timeout)
    for e, rows, results in zip(acting, new_rows, stepped):
        best = select_candidate(e, rows, config)
        follow(e, rows[best], results[best])
    if turn == 0 and agent_id == round_.last_agent:
        credit_first_attempts(acting, config.reward_timeout)


def _prompts(round_: _Round, live: list[Episode], agent: Agent, turn: int) -> tuple[list[Episode], list[list[Message]], list[list[int]]]:
    """Tokenising: what each live episode's agent sees (workflow code, guarded; the hinted agents
    see the strategy's augmentation) and its prompt ids. An episode whose `observe` failed ends;
    the others are returned as (acting episodes, their messages, their prompt ids)."""
    agent_id = agent.agent_id
    tok = _tokenizer(round_, agent.policy_id)
    seen = safe_map(_observe, [(e.env, agent_id) for e in live], round_.config.reward_timeout, label="observe")
    acting: list[Episode] = []
    contexts: list[list[Message]] = []
    prompts: list[list[int]] = []
    for e, out in zip(live, seen):
        if not out.ok:
            e.active, e.error = False, f"observe({agent_id!r}) at turn {turn}: {out.error}"
            continue
        msgs = e.strategy.augment(out.value, e.problem) if agent_id in round_.hinted else out.value
        key = (agent.policy_id, tuple((m["role"], m["content"]) for m in msgs))
        if key not in round_.encoded:
            round_.encoded[key] = encode_prompt(tok, msgs)
        acting.append(e)
        contexts.append(msgs)
        prompts.append(round_.encoded[key])
    return acting, contexts, prompts


def _tokenizer(round_: _Round, policy_id: str):
    """The tokenizer of `policy_id`'s prompts: the caller's, else its sampler's (loaded once)."""
    if policy_id not in round_.tokenizers:
        round_.tokenizers[policy_id] = round_.tokenizer if round_.tokenizer is not None else _tokenizer_of(round_.samplers[policy_id])
    return round_.tokenizers[policy_id]


def _samplers(sampler: Sampler | Mapping[str, Sampler], agents: Sequence[Agent]) -> dict[str, Sampler]:
    if isinstance(sampler, Mapping):
        missing = sorted({a.policy_id for a in agents} - set(sampler))
        if missing:
            raise ConfigError(f"sampler: no sampler for policy id(s) {missing}; got {sorted(sampler)}")
        return dict(sampler)
    return {a.policy_id: sampler for a in agents}


def _tokenizer_of(sampler: Sampler):
    tok = getattr(sampler, "tokenizer", None)
    if tok is not None:
        return tok
    from pipeline.models import load_tokenizer

    return load_tokenizer(sampler.model_dir)


def _check_inputs(problems: Sequence[Problem], workflow, strategies: Sequence[Strategy]) -> None:
    if not strategies:
        raise ConfigError("strategies: at least one strategy is needed")
    ids = [s.strategy_id for s in strategies]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise ConfigError(f"strategies: each strategy id may appear once per round; repeated: {dup}")
    for s in strategies:
        if not isinstance(s, Strategy):
            raise ConfigError(f"strategies: expected Strategy records, got {type(s).__name__}")
    check_workflow(workflow, strategies)
    for s in strategies:
        if isinstance(s, Feedback) and s.agent_id is not None and s.agent_id != workflow.feedback_agent:
            raise ConfigError(
                f"strategies: the feedback strategy trains agent {s.agent_id!r} context-swapped, but workflow "
                f"{workflow.name!r} gives feedback to {workflow.feedback_agent!r}"
            )
    uids = [p.uid for p in problems]
    if len(set(uids)) != len(uids):
        dup = sorted({u for u in uids if uids.count(u) > 1})
        raise DataError(f"problems: uids must be unique within a round; repeated: {dup[:10]}")


def _observe(env, agent_id: str) -> list[Message]:
    return check_messages(env.observe(agent_id), "observe")
