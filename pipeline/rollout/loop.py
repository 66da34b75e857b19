"""One round of multi-agent rollouts -> the `steps` table.

`run_rollouts(problems, workflow, strategies, sampler, config)` lets a workflow's team act on
every problem under every search strategy and returns one row per agent call (every candidate of
a tree step is a row), validated against `schemas.STEPS`. `write_steps` stores it atomically at
`<store>/round=<r>/steps.parquet`. The workflow contract (what an environment observes, steps and
rewards) is in `pipeline.rollout.workflow`.

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
episode's team reward at its end (`env.team_reward()`) on every row of an ordinary trajectory,
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

import hashlib
import math
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Mapping, Sequence

import pyarrow as pa

from pipeline.rollout.agent import Agent
from pipeline.config import AdvantageConfig
from pipeline.errors import ConfigError, DataError
from pipeline.models.chat import encode_prompt, prompt_hash
from pipeline.rollout.rewards import Outcome, row_reward, safe_map
from pipeline.store import table_path, write_table
from pipeline.strategies import Feedback, Strategy
from pipeline.rollout.contract import StepResult, check_messages, check_workflow, finite_reward
from pipeline.types import GenerateCall, Message, Problem, Sample, Sampler, generate_calls
from schemas import STEPS, validate

__all__ = ["RolloutConfig", "CallPlan", "run_rollouts", "write_steps", "plan_call", "step_seed", "request_seed", "shard_of", "merge_shards"]


@dataclass(frozen=True)
class RolloutConfig:
    """How one round of rollouts is sampled and scored."""

    round: int = 0
    """Expert-iteration round (written to `round`, part of every id)."""
    temperature: float = 1.0
    """Sampling temperature of every agent call (the stored logprobs are under it)."""
    max_tokens: int = 64
    """Completion budget of an agent call, for agents not in `max_tokens_by_agent`."""
    max_tokens_by_agent: Mapping[str, int] = field(default_factory=dict)
    """Per-agent completion budgets, e.g. {"verifier": 16}."""
    alpha: float = AdvantageConfig.alpha
    """Mixed reward: reward = alpha * global_reward + local_weight * local_reward (the run passes
    its advantage settings' values; the tree strategy selects its best candidate by it). The
    default is `AdvantageConfig`'s, the default run's."""
    local_weight: float = AdvantageConfig.local_weight
    """Weight of the local reward in the mixed reward (default: `AdvantageConfig`'s)."""
    seed: int = 0
    """Base seed; each request of an agent step gets a seed derived from it, the round, the step
    and the request's trajectory (`request_seed`), recorded in the `seed` column."""
    reward_timeout: float | None = 10.0
    """Seconds one call of the task's reward or verdict parser may take before its reward is
    null with a `reward_error`; None runs them unguarded by time (exceptions are still caught)."""

    def __post_init__(self) -> None:
        def whole(name: str, value, low: int) -> None:
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ConfigError(f"RolloutConfig.{name} must be an integer >= {low}, got {value!r}")

        whole("round", self.round, 0)
        whole("max_tokens", self.max_tokens, 1)
        whole("seed", self.seed, 0)
        if isinstance(self.temperature, bool) or not isinstance(self.temperature, (int, float)) or not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ConfigError(f"RolloutConfig.temperature must be a finite number >= 0, got {self.temperature!r}")
        for name in ("alpha", "local_weight"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ConfigError(f"RolloutConfig.{name} must be a finite number, got {value!r}")
        if self.reward_timeout is not None and (
            isinstance(self.reward_timeout, bool) or not isinstance(self.reward_timeout, (int, float)) or not self.reward_timeout > 0 or not math.isfinite(self.reward_timeout)
        ):
            raise ConfigError(f"RolloutConfig.reward_timeout must be a finite number of seconds > 0 or None, got {self.reward_timeout!r}")
        if not isinstance(self.max_tokens_by_agent, Mapping):
            raise ConfigError(f"RolloutConfig.max_tokens_by_agent must be a mapping agent_id -> int, got {self.max_tokens_by_agent!r}")
        budgets = dict(self.max_tokens_by_agent)
        for agent_id, value in budgets.items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"RolloutConfig.max_tokens_by_agent[{agent_id!r}] must be an integer >= 1, got {value!r}")
        object.__setattr__(self, "max_tokens_by_agent", MappingProxyType(budgets))

    def max_tokens_for(self, agent_id: str) -> int:
        """The completion budget of `agent_id`."""
        return self.max_tokens_by_agent.get(agent_id, self.max_tokens)


def step_seed(seed: int, round_: int, step: int) -> int:
    """The engine seed of agent step `step` of round `round_` (stable across runs, < 2**31)."""
    digest = hashlib.blake2b(f"{seed}/{round_}/{step}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % (2**31 - 1)


def request_seed(seed: int, round_: int, step: int, traj_uid: str) -> int:
    """The engine seed of one request: the samples agent step `step` of round `round_` draws for
    the trajectory (or tree) `traj_uid` and the requests merged with it (identical prompts of one
    problem, keyed by the first one's `traj_uid`). It depends on the request alone, never on its
    place in an engine call, so a round split into shards draws the same samples (< 2**31)."""
    digest = hashlib.blake2b(f"{seed}/{round_}/{step}/{traj_uid}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % (2**31 - 1)


def shard_of(uid: str, shards: int) -> int:
    """The shard (0..shards-1) of problem `uid`: a stable hash of the uid (not Python's salted
    `hash`), so every row of a problem, and so every advantage group and tree, is in one shard."""
    if isinstance(shards, bool) or not isinstance(shards, int) or shards < 1:
        raise ConfigError(f"shards must be an integer >= 1, got {shards!r}")
    digest = hashlib.blake2b(str(uid).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % shards


def _sample_requests(eng, live, prompts, config: "RolloutConfig", step: int, agent_id: str) -> list[tuple[int, list[Sample]]]:
    """Draw every live episode's samples of one agent step: (request seed, its `width` samples)
    per episode, in `live` order.

    Identical prompts of one problem (the K first attempts of a group, say) are merged into one
    request of count c (the sum of their widths) with one seed (`request_seed` of the first
    one's traj_uid) and handed out in episode order. Requests are sent in one engine call per
    distinct count (n = c), each with its own seed: what a request draws depends only on the
    request, not on which other problems share the call (sharding cannot change a row). An engine
    that batches several calls (`generate_calls`) runs a step's counts as one batch."""
    r = config.round
    groups: dict[tuple[str, tuple[int, ...]], int] = {}
    group_prompt: list[list[int]] = []
    group_count: list[int] = []
    group_seed: list[int] = []
    member: list[int] = []
    for e, p in zip(live, prompts):
        key = (e.problem.uid, tuple(p))
        g = groups.get(key)
        if g is None:
            g = groups[key] = len(group_prompt)
            group_prompt.append(p)
            group_count.append(0)
            group_seed.append(request_seed(config.seed, r, step, e.traj_uid))
        group_count[g] += e.width
        member.append(g)
    drawn: list[list[Sample]] = [[] for _ in group_prompt]
    by_count: dict[int, list[int]] = {}
    for g, c in enumerate(group_count):
        by_count.setdefault(c, []).append(g)
    counts = sorted(by_count.items())
    calls = [GenerateCall([group_prompt[g] for g in gs], n, float(config.temperature), config.max_tokens_for(agent_id), [group_seed[g] for g in gs]) for n, gs in counts]
    for (n, gs), out in zip(counts, generate_calls(eng, calls)):
        if len(out) != len(gs) or any(len(o) != n for o in out):
            raise DataError(
                f"engine {eng.engine!r} returned {[len(o) for o in out][:8]}... samples for {len(gs)} prompts "
                f"with n={n} at round {r} step {step}"
            )
        for g, samples in zip(gs, out):
            drawn[g] = list(samples)
    taken = [0] * len(group_prompt)
    result = []
    for e, g in zip(live, member):
        result.append((group_seed[g], drawn[g][taken[g] : taken[g] + e.width]))
        taken[g] += e.width
    return result


def merge_shards(tables: Sequence[pa.Table], problem_uids: Sequence[str], strategy_ids: Sequence[str]) -> pa.Table:
    """The `steps` tables of a round's shards as the one table `run_rollouts` gives on all the
    problems at once: concatenated, then in its row order (agent step, strategy, problem in the
    problems table's order, sample). Validated; a step_id in two shards is an error."""
    tables = [t for t in tables if t.num_rows] or list(tables[:1])
    if not tables:
        raise DataError("merge_shards: no shard tables")
    table = pa.concat_tables(tables)
    ids = table.column("step_id").to_pylist()
    if len(set(ids)) != len(ids):
        raise DataError("merge_shards: a step_id appears in two shards (a problem was sampled twice)")
    strategy_pos = {s: i for i, s in enumerate(strategy_ids)}
    uid_pos = {u: i for i, u in enumerate(problem_uids)}
    keys = list(zip(
        table.column("step").to_pylist(),
        [strategy_pos[s] for s in table.column("strategy").to_pylist()],
        [uid_pos[u] for u in table.column("uid").to_pylist()],
        table.column("sample_idx").to_pylist(),
    ))
    order = sorted(range(len(keys)), key=keys.__getitem__)
    return validate(table.take(pa.array(order, type=pa.int64())), STEPS)


@dataclass(frozen=True)
class CallPlan:
    """One engine call serving many requests (see `plan_call`)."""

    prompts: list[list[int]]
    """The prompts sent, distinct prompts repeated count/n times."""
    n: int
    """Samples per prompt."""
    slots: list[list[tuple[int, int]]]
    """For each request, the (prompt index, sample index) of each of its samples."""


def plan_call(requests: Sequence[tuple[Sequence[int], int]]) -> CallPlan:
    """Merge requests (prompt_ids, count) into one `generate(prompts, n)` call: identical prompts
    are merged, n = gcd of the merged counts, each distinct prompt repeated count/n times."""
    order: dict[tuple[int, ...], int] = {}
    ids: list[list[int]] = []
    counts: list[int] = []
    for prompt, count in requests:
        if count < 1:
            raise ValueError(f"a request needs at least one sample, got {count}")
        key = tuple(prompt)
        if key not in order:
            order[key] = len(ids)
            ids.append(list(prompt))
            counts.append(0)
        counts[order[key]] += count
    if not ids:
        return CallPlan([], 1, [])
    n = math.gcd(*counts)
    prompts: list[list[int]] = []
    pool: list[list[tuple[int, int]]] = []
    for d, count in enumerate(counts):
        slots = []
        for _ in range(count // n):
            slots.extend((len(prompts), j) for j in range(n))
            prompts.append(ids[d])
        pool.append(slots)
    taken = [0] * len(ids)
    out = []
    for prompt, count in requests:
        d = order[tuple(prompt)]
        out.append(pool[d][taken[d] : taken[d] + count])
        taken[d] += count
    return CallPlan(prompts, n, out)


@dataclass(slots=True)
class _Row:
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


@dataclass(slots=True)
class _Episode:
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
    rows: list[_Row] = field(default_factory=list)
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


def _best(rewards: Sequence[float | None], greedy: bool) -> int:
    """AT-GRPO's best-of-N: argmax of the immediate rewards (first on ties, nulls last), or 0."""
    if not greedy:
        return 0
    best_i, best_v = 0, -math.inf
    for i, v in enumerate(rewards):
        if v is not None and v > best_v:
            best_i, best_v = i, v
    return best_i


def _observe(env, agent_id: str) -> list[Message]:
    return check_messages(env.observe(agent_id), "observe")


def _advance(env, agent_id: str, text: str, branch: bool):
    """One guarded unit of workflow code: step `env` (a copy of it for a tree candidate) with
    the agent's text; a tree candidate also reads its team reward right after the step."""
    if branch:
        env = env.copy()
        if env is None:
            raise ValueError("copy returned None")
    result = env.step(agent_id, text)
    if not isinstance(result, StepResult):
        raise ValueError(f"step returned {type(result).__name__}, expected a StepResult")
    reward = finite_reward(result.reward, "step")
    if result.verdict not in (True, False, None):
        raise ValueError(f"step returned verdict {result.verdict!r}, expected True, False or None")
    team = finite_reward(env.team_reward(), "team_reward") if branch else None
    return env, result, reward, team


def _team_reward(env):
    return finite_reward(env.team_reward(), "team_reward")


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
    `tokenizer` attribute, else `pipeline.models.load_tokenizer(sampler.model_dir)`."""
    if not isinstance(config, RolloutConfig):
        raise ConfigError(f"config must be a RolloutConfig, got {type(config).__name__}")
    _check_inputs(problems, workflow, strategies)
    agents = {a.agent_id: a for a in workflow.agents}
    samplers = _samplers(sampler, workflow.agents)
    tokenizers: dict[str, object] = {}
    r = config.round
    timeout = config.reward_timeout
    order = tuple(workflow.turn_order)
    hinted = set(workflow.hinted_agents)
    max_turns = int(workflow.max_turns)

    episodes: list[_Episode] = []
    for strategy in strategies:
        sid = strategy.strategy_id
        for problem in problems:
            if strategy.tree:
                episodes.append(_Episode(problem, strategy, f"r{r}-{sid}-{problem.uid}", 0))
            else:
                for k in range(strategy.group_size):
                    episodes.append(_Episode(problem, strategy, f"r{r}-{sid}-{problem.uid}-s{k}", k))
    resets = safe_map(workflow.reset, [(e.problem, e.strategy) for e in episodes], timeout, label="reset")
    for e, env in zip(episodes, resets):
        if env.ok and env.value is not None:
            e.env = env.value
        else:
            e.active, e.error = False, f"reset: {env.error or 'returned None'}"

    all_rows: list[_Row] = []
    encoded: dict[tuple, list[int]] = {}
    schedule = [(t, t * len(order) + i, agent_id) for t in range(max_turns) for i, agent_id in enumerate(order)]
    for turn, step, agent_id in schedule:
        live = [e for e in episodes if e.active]
        if not live:
            break
        agent = agents[agent_id]
        eng = samplers[agent.policy_id]
        if agent.policy_id not in tokenizers:
            tokenizers[agent.policy_id] = tokenizer if tokenizer is not None else _tokenizer_of(eng)
        tok = tokenizers[agent.policy_id]

        # what each live episode's agent sees (workflow code: guarded)
        seen = safe_map(_observe, [(e.env, agent_id) for e in live], timeout, label="observe")
        contexts: list[list[Message]] = []
        prompts: list[list[int]] = []
        acting: list[_Episode] = []
        for e, out in zip(live, seen):
            if not out.ok:
                e.active, e.error = False, f"observe({agent_id!r}) at turn {turn}: {out.error}"
                continue
            msgs = e.strategy.augment(out.value, e.problem) if agent_id in hinted else out.value
            key = (agent.policy_id, tuple((m["role"], m["content"]) for m in msgs))
            if key not in encoded:
                encoded[key] = encode_prompt(tok, msgs)
            acting.append(e)
            contexts.append(msgs)
            prompts.append(encoded[key])
        if not acting:
            continue

        drawn = _sample_requests(eng, acting, prompts, config, step, agent_id)
        version, engine_name = eng.model_version, eng.engine

        new_rows: list[list[_Row]] = []
        for e, msgs, prompt, (seed, samples) in zip(acting, contexts, prompts, drawn):
            rows = []
            for c, sample in enumerate(samples):
                sample_idx = c if e.tree else e.sample_idx
                traj_uid = f"{e.traj_uid}-s{c}" if e.tree else e.traj_uid
                step_id = f"{traj_uid}-{agent_id}-t{turn}"
                if len(sample.token_ids) != len(sample.logprobs):
                    raise DataError(
                        f"engine {engine_name!r} returned {len(sample.token_ids)} token ids but {len(sample.logprobs)} logprobs for step_id {step_id!r}"
                    )
                rows.append(
                    _Row(
                        step_id=step_id, strategy=e.strategy.strategy_id, uid=e.problem.uid, traj_uid=traj_uid, sample_idx=sample_idx,
                        agent_id=agent_id, policy_id=agent.policy_id, turn=turn, step=step, parent_node_id=e.parent, messages=msgs,
                        prompt_ids=prompt, sample=sample, model_version=version, engine=engine_name, seed=seed,
                    )
                )
            new_rows.append(rows)
            all_rows.extend(rows)
            e.rows.extend(rows)

        # the environment takes every completion (workflow code: guarded, one batch)
        calls = [(e.env, agent_id, row.sample.text, e.tree) for e, rows in zip(acting, new_rows) for row in rows]
        outcomes = iter(safe_map(_advance, calls, timeout, label="step"))
        for e, rows in zip(acting, new_rows):
            results = []
            for row in rows:
                out = next(outcomes)
                if not out.ok:
                    row.local = Outcome(None, f"step({agent_id!r}): {out.error}")
                    row.global_ = Outcome(None, "the episode ended at this step")
                    results.append(None)
                    continue
                env, result, reward, team = out.value
                row.local = Outcome(reward, result.error) if reward is not None else Outcome(None, result.error or "step returned reward None")
                row.verdict = result.verdict
                if e.tree:
                    row.global_ = Outcome(team) if team is not None else Outcome(None, "team_reward returned None")
                results.append((env, result))
            if e.tree:
                mixed = [row_reward(config.alpha, row.global_, row.local, config.local_weight).reward for row in rows]
                best = _best(mixed, getattr(e.strategy, "greedy", True))
                for i, row in enumerate(rows):
                    row.selected = i == best
                chosen, outcome = rows[best], results[best]
            else:
                chosen, outcome = rows[0], results[0]
            e.parent = chosen.step_id
            if outcome is None:
                e.active, e.error = False, chosen.local.error
                continue
            e.env = outcome[0]
            if outcome[1].done:
                e.active = False

        if turn == 0 and agent_id == order[-1]:
            # the feedback strategy's first attempt is an episode of its own that ends here: its
            # rows are credited with the outcome before the feedback, not with the second attempt's
            firsts = [e for e in acting if isinstance(e.strategy, Feedback) and e.error is None]
            for e, out in zip(firsts, safe_map(_team_reward, [(e.env,) for e in firsts], timeout, label="team_reward")):
                e.first_team = _team_outcome(out)

    _final_rewards(episodes, timeout)
    return validate(_to_table(all_rows, r, config), STEPS)


def _final_rewards(episodes: list[_Episode], timeout: float | None) -> None:
    """Ordinary trajectories: every row gets the episode's team reward at its end as its global
    reward (tree rows were scored right after their step)."""
    ordinary = [e for e in episodes if not e.tree and e.rows]
    live = [e for e in ordinary if e.error is None]
    teams = dict(zip(map(id, live), safe_map(_team_reward, [(e.env,) for e in live], timeout, label="team_reward")))
    for e in ordinary:
        final = Outcome(None, e.error) if e.error is not None else _team_outcome(teams[id(e)])
        for row in e.rows:
            row.global_ = e.first_team if e.first_team is not None and row.turn == 0 else final


def _team_outcome(out: Outcome) -> Outcome:
    """A guarded `team_reward()` call as the global reward of rows (None is named)."""
    if out.ok and out.value is None:
        return Outcome(None, "team_reward returned None")
    return out


def _to_table(rows: list[_Row], round_: int, config: RolloutConfig) -> pa.Table:
    cols: dict[str, list] = {f.name: [] for f in STEPS.schema}
    for row in rows:
        rew = row_reward(config.alpha, row.global_, row.local, config.local_weight)
        cols["round"].append(round_)
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
        cols["engine"].append(row.engine)
        cols["seed"].append(row.seed)
        cols["temperature"].append(float(config.temperature))
    arrays = [pa.array(cols[f.name], type=f.type) for f in STEPS.schema]
    return pa.Table.from_arrays(arrays, schema=STEPS.schema)


def write_steps(table: pa.Table, store: str | Path, round_: int) -> Path:
    """Validate `table` against STEPS and write it atomically to `<store>/round=<r>/steps.parquet`.
    Every row must belong to round `round_`."""
    validate(table, STEPS)
    rounds = set(table.column("round").to_pylist()) if table.num_rows else set()
    if rounds - {int(round_)}:
        raise DataError(f"write_steps(round={round_}): the table holds rows of round(s) {sorted(rounds)}")
    return write_table(table, table_path(store, round_, "steps"), schema=STEPS)
