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
    # uid + strategy + group_by, and the round when the rows carry one (rounds never share a group)
    keys = config.group_key + (["round"] if rows and "round" in rows[0] else [])

    def group_of(r: Mapping[str, Any]) -> tuple:
        return tuple(r[k] for k in keys)

    rewards: list[float | None] = []
    members: list[bool] = []
    for r in rows:
        if "global_reward" in r:
            g, l = r["global_reward"], r["local_reward"]
            reward = None if g is None or l is None else config.alpha * g + config.local_weight * l
        else:
            reward = r["reward"]
        rewards.append(reward)
        members.append(bool(r.get("active", True)) and reward is not None)

    # member values per group, and the score each member row's advantage is computed from
    group_values: dict[tuple, list[float]] = defaultdict(list)
    score: list[float | None] = [rewards[i] if members[i] else None for i in range(len(rows))]
    if config.trajectory_mean:
        traj: dict[tuple, list[float]] = defaultdict(list)
        for i, r in enumerate(rows):
            if members[i]:
                traj[(group_of(r), r["traj_uid"])].append(rewards[i])
        for (gkey, _), vals in traj.items():
            group_values[gkey].append(sum(vals) / len(vals))
        if config.trajectory_score == "mean":
            for i, r in enumerate(rows):
                if members[i]:
                    vals = traj[(group_of(r), r["traj_uid"])]
                    score[i] = sum(vals) / len(vals)
    else:
        for i, r in enumerate(rows):
            if members[i]:
                group_values[group_of(r)].append(rewards[i])

    out = []
    for i, r in enumerate(rows):
        vals = group_values.get(group_of(r), [])
        n = len(vals)
        mean = std = None
        if n == 1:
            mean, std = (0.0, 1.0) if config.singleton == "raw" else (vals[0], None)
        elif n > 1:
            mean = sum(vals) / n
            std = 0.0 if max(vals) == min(vals) else _std(vals)
        adv = 0.0
        if members[i] and (n > 1 and std != 0.0 or n == 1 and config.singleton == "raw"):
            centered = score[i] - mean
            adv = centered / (std + config.eps) if config.normalize == "std" else centered
        out.append(
            {
                "reward": rewards[i],
                "group_size": n,
                "group_mean": mean,
                "group_std": std,
                "advantage": adv,
                # membership weight: stratified strategy weights belong to the training view
                "sample_weight": 1.0 if members[i] else 0.0,
            }
        )
    return out
