"""How a round's agent steps are sampled: the rollout config, the request seeds, identical prompts
merged into one request, the engine calls per sample count, and the shards a round's problems
split into (`shard_of`, `merge_shards`).

What a request draws depends on the request alone (its prompt, its count and `request_seed`),
never on the other prompts of the engine call, so a round split into shards gives the same rows.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping, Sequence

import pyarrow as pa

from pipeline.config import AdvantageConfig
from pipeline.errors import ConfigError, DataError
from pipeline.types import GenerateCall, Sample, generate_calls
from schemas import STEPS, validate

__all__ = ["RolloutConfig", "CallPlan", "plan_call", "step_seed", "request_seed", "sample_requests", "shard_of", "merge_shards"]


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
    policy_rounds: Mapping[str, int] = field(default_factory=dict)
    """policy_id -> the round of the checkpoint sampling its agents (-1: the starting model),
    written to `policy_round`; a policy not named gets null."""
    staleness: Mapping[str, int] = field(default_factory=dict)
    """policy_id -> how many rounds that checkpoint is older than the one its rows will train
    (written to `staleness`)."""
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


def sample_requests(eng, live, prompts, config: RolloutConfig, step: int, agent_id: str) -> list[tuple[int, list[Sample]]]:
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
