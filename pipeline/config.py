"""maxit's configuration: frozen dataclasses, each field documented where it is declared and
validated at construction (an invalid value raises `ConfigError` naming the field).

The Dagster `Config` classes and the CLI flags are a thin layer mapped onto these.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterator, Literal, Mapping

from pipeline.errors import ConfigError


class FrozenMapping(Mapping):
    """A read-only mapping that hashes and pickles (so frozen configs holding one do too)."""

    __slots__ = ("_items", "_dict")

    def __init__(self, data: Mapping):
        self._dict = dict(data)
        self._items = tuple(sorted(self._dict.items()))

    def __getitem__(self, key):
        return self._dict[key]

    def __iter__(self) -> Iterator:
        return iter(self._dict)

    def __len__(self) -> int:
        return len(self._dict)

    def __hash__(self) -> int:
        return hash(self._items)

    def __eq__(self, other) -> bool:
        return isinstance(other, Mapping) and dict(self._dict) == dict(other)

    def __reduce__(self):
        return (FrozenMapping, (self._dict,))

    def __repr__(self) -> str:
        return f"FrozenMapping({self._dict!r})"

__all__ = ["AdvantageConfig", "GROUP_COLUMNS", "BASE_GROUP_KEY"]

BASE_GROUP_KEY = ("uid", "strategy")
"""Columns every advantage group is keyed on: the problem and the strategy that sampled the row.
A group never spans strategies: siblings sampled under one context (a tree node's candidates,
iid samples, prompt-augmented samples, feedback retries) are compared only with each other, so
one strategy's success rate never becomes another's baseline."""

GROUP_COLUMNS = ("agent_id", "turn")
"""Columns that `group_by` may add to `BASE_GROUP_KEY`."""


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class AdvantageConfig:
    """How group-relative advantages are computed from rewards (docs/ALGORITHMS.md).

    Grouping: the group key is `uid` + `strategy` + `group_by` (`group_key`). DrMAS =
    ("agent_id",); AT-GRPO = ("agent_id", "turn") (the default); plain GRPO = (). `strategy` is
    always part of the key, whatever `group_by` says (see `BASE_GROUP_KEY`).

    Reward: reward = alpha * global_reward + local_weight * local_reward. DrMAS (every agent gets
    the team's final reward) is alpha=1, local_weight=0; AT-GRPO's mixed reward is alpha=1,
    local_weight=1; rejection sampling on each call's own correctness is alpha=0, local_weight=1.
    """

    # --- Parameters that control the groups -------------------------------------------------
    group_by: tuple[str, ...] = GROUP_COLUMNS
    """Columns added to `uid` + `strategy` to form a group: any subset of ("agent_id", "turn").
    "strategy" is accepted for compatibility and dropped (it is always in the key), so
    `group_by=("agent_id", "turn", "strategy")` equals the default."""
    trajectory_mean: bool = False
    """False (DrMAS, `group_by_agent_id=True`): every active row is a group member, so an agent
    called k times in a trajectory counts k times. True (DrMAS's "standard GRPO",
    `group_by_agent_id=False`): each trajectory (`traj_uid`) is one member whose value is the mean
    reward of its rows in the group; `group_mean` and `group_std` are taken over those members,
    so a trajectory with many calls weighs no more in the baseline than one with a single call.
    `trajectory_score` says which value each row is then scored with."""
    trajectory_score: Literal["own", "mean"] = "own"
    """With `trajectory_mean=True`, the value a row's advantage is computed from:
    "own": the row's own reward, A = (r_row - mean) / (std + eps), against the trajectory-level
    statistics, as DrMAS's pseudo-code writes it (`advantage_i = (score_i - mean_group) /
    (std_group + eps)` with `score_i` the row's own score). The default: the baseline is per
    trajectory but the credit stays per call, so in a trajectory whose Solver was wrong in loop 0
    and right in loop 1 the wrong call keeps a lower advantage than the right one (they differ by
    their local rewards).
    "mean": every row takes its trajectory's mean as its score, so all rows of a trajectory share
    one advantage (what DrMAS's verl code does); a wrong first attempt is then credited with the
    trajectory's eventual success.
    Either way a group whose trajectory means all agree gets A = 0 (no trajectory beat another),
    and the trajectories' mean advantages average to 0 in every group of two or more. "mean" needs
    `trajectory_mean=True` (without it every row is its own member and scored by its own reward)."""

    # --- Parameters that control normalization ----------------------------------------------
    normalize: Literal["std", "center"] = "std"
    """"std": A = (r - mean) / (std + eps) with the unbiased (ddof=1) std, as GRPO and DrMAS.
    "center": A = r - mean (Dr. GRPO, the AT-GRPO pseudocode)."""
    eps: float = 1e-6
    """Added to the std before dividing."""
    singleton: Literal["zero", "raw"] = "zero"
    """Groups of one member: "zero" gives A = 0 (there is no baseline to compare against);
    "raw" uses verl's rule mean 0, std 1, so A = r / (1 + eps) (r with "center")."""
    baseline: Literal["group", "batch"] = "group"
    """"group": the statistics of the row's group of samples of one problem (GRPO, DrMAS,
    AT-GRPO). "batch": of all the round's rows of the same strategy (and `group_by` columns),
    every problem together: REINFORCE with a mean-reward baseline, so a problem whose samples were
    all right still has a positive advantage (its samples are above the round's mean) where the
    group baseline gives it 0."""

    # --- Parameters that control rewards ----------------------------------------------------
    alpha: float = 1.0
    """Weight of the global (team outcome) reward: reward = alpha * global_reward +
    local_weight * local_reward, recomputed whenever both columns are present (a stored `reward`
    is then ignored; either part null gives a null reward, as at rollout time)."""
    local_weight: float = 1.0
    """Weight of the local (own action) reward in the mixed reward (see `alpha`). 0 with alpha=1
    gives DrMAS's reward: every agent of a trajectory gets the team's final reward. At least one
    of `alpha` and `local_weight` must be non-zero."""

    def __post_init__(self) -> None:
        if isinstance(self.group_by, str):
            raise ConfigError(f"group_by must be a tuple of column names, got the string {self.group_by!r}")
        group_by = tuple(self.group_by)
        allowed = (*GROUP_COLUMNS, "strategy")
        bad = [c for c in group_by if c not in allowed]
        if bad:
            raise ConfigError(
                f"group_by: unknown column(s) {bad}; choose from {list(GROUP_COLUMNS)} "
                f"(uid and strategy are always part of the key)"
            )
        if len(set(group_by)) != len(group_by):
            raise ConfigError(f"group_by has duplicates: {list(group_by)}")
        object.__setattr__(self, "group_by", tuple(c for c in group_by if c != "strategy"))
        if not isinstance(self.trajectory_mean, bool):
            raise ConfigError(f"trajectory_mean must be True or False, got {self.trajectory_mean!r}")
        if self.trajectory_score not in ("own", "mean"):
            raise ConfigError(f"trajectory_score must be 'own' or 'mean', got {self.trajectory_score!r}")
        if self.trajectory_score == "mean" and not self.trajectory_mean:
            raise ConfigError("trajectory_score='mean' needs trajectory_mean=True (without it every row is scored by its own reward)")
        if self.normalize not in ("std", "center"):
            raise ConfigError(f"normalize must be 'std' or 'center', got {self.normalize!r}")
        if self.baseline not in ("group", "batch"):
            raise ConfigError(f"baseline must be 'group' or 'batch', got {self.baseline!r}")
        if self.singleton not in ("zero", "raw"):
            raise ConfigError(f"singleton must be 'zero' or 'raw', got {self.singleton!r}")
        if not (_is_number(self.eps) and self.eps >= 0):
            raise ConfigError(f"eps must be a finite number >= 0, got {self.eps!r}")
        for name in ("alpha", "local_weight"):
            if not _is_number(getattr(self, name)):
                raise ConfigError(f"{name} must be a finite number, got {getattr(self, name)!r}")
        if self.alpha == 0 and self.local_weight == 0:
            raise ConfigError("alpha and local_weight are both 0: every reward would be 0; make at least one non-zero")

    @property
    def group_key(self) -> list[str]:
        """The full group key: uid + strategy + group_by (without uid for the batch baseline)."""
        base = [c for c in BASE_GROUP_KEY if c != "uid"] if self.baseline == "batch" else list(BASE_GROUP_KEY)
        return [*base, *self.group_by]
