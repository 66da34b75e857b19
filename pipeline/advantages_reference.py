"""A straightforward pure-Python reference of `compute_advantages`: one loop over rows, dicts of
lists per group. It defines the semantics in the plainest terms; the property tests check the
Polars engine against it, and `benchmarks/advantages.py` measures the speed-up over it."""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any, Mapping, Sequence

from pipeline.config import AdvantageConfig

__all__ = ["reference_advantages"]


def _std(values: Sequence[float]) -> float:
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def reference_advantages(rows: Sequence[Mapping[str, Any]], config: AdvantageConfig) -> list[dict[str, Any]]:
    """Per input row (in order): reward, group_size, group_mean, group_std, advantage, sample_weight."""
    keys = config.group_key
    rewards: list[float | None] = []
    members: list[bool] = []
    for r in rows:
        if "global_reward" in r:
            g, l = r["global_reward"], r["local_reward"]
            reward = None if g is None or l is None else config.alpha * g + l
        else:
            reward = r["reward"]
        rewards.append(reward)
        members.append(bool(r.get("active", True)) and reward is not None)

    # member values per group
    group_values: dict[tuple, list[float]] = defaultdict(list)
    row_value: list[float | None] = [None] * len(rows)
    if config.trajectory_mean:
        traj: dict[tuple, list[float]] = defaultdict(list)
        for i, r in enumerate(rows):
            if members[i]:
                traj[(tuple(r[k] for k in keys), r["traj_uid"])].append(rewards[i])
        for (gkey, _), vals in traj.items():
            group_values[gkey].append(sum(vals) / len(vals))
        for i, r in enumerate(rows):
            if members[i]:
                vals = traj[(tuple(r[k] for k in keys), r["traj_uid"])]
                row_value[i] = sum(vals) / len(vals)
    else:
        for i, r in enumerate(rows):
            if members[i]:
                group_values[tuple(r[k] for k in keys)].append(rewards[i])
                row_value[i] = rewards[i]

    # stratified weights
    weights: list[float] = [1.0 if m else 0.0 for m in members]
    if config.strategy_weights is not None:
        n_s: dict[str, int] = defaultdict(int)
        for i, r in enumerate(rows):
            if members[i]:
                n_s[r["strategy"]] += 1
        total = sum(n_s.values())
        z = sum(config.strategy_weights[s] for s in n_s)
        for i, r in enumerate(rows):
            if members[i]:
                s = r["strategy"]
                weights[i] = config.strategy_weights[s] / z * total / n_s[s]

    out = []
    for i, r in enumerate(rows):
        vals = group_values.get(tuple(r[k] for k in keys), [])
        n = len(vals)
        mean = std = None
        if n == 1:
            mean, std = (0.0, 1.0) if config.singleton == "raw" else (vals[0], None)
        elif n > 1:
            mean = sum(vals) / n
            std = 0.0 if max(vals) == min(vals) else _std(vals)
        adv = 0.0
        if members[i] and (n > 1 and std != 0.0 or n == 1 and config.singleton == "raw"):
            centered = row_value[i] - mean
            adv = centered / (std + config.eps) if config.normalize == "std" else centered
        out.append(
            {
                "reward": rewards[i],
                "group_size": n,
                "group_mean": mean,
                "group_std": std,
                "advantage": adv,
                "sample_weight": weights[i],
            }
        )
    return out
