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

__all__ = ["AdvantageConfig", "GROUP_COLUMNS"]

GROUP_COLUMNS = ("agent_id", "turn", "strategy")
"""Columns that may refine the advantage group beyond `uid`."""


@dataclass(frozen=True)
class AdvantageConfig:
    """How group-relative advantages are computed from rewards (DESIGN.md, "Semantics decided here").

    Grouping: the group key is `uid` plus `group_by`. DrMAS (seed 002) = ("agent_id",);
    AT-GRPO (seed 003) = ("agent_id", "turn"); plain GRPO = (); the default adds `strategy` so
    samples drawn under different contexts never share a baseline.
    """

    # --- Parameters that control the groups -------------------------------------------------
    group_by: tuple[str, ...] = GROUP_COLUMNS
    """Columns added to `uid` to form a group; any subset of ("agent_id", "turn", "strategy")."""
    trajectory_mean: bool = False
    """False (DrMAS, `group_by_agent_id=True` in seed 002): every active row is a group member, so
    an agent called k times in a trajectory counts k times. True (the seed's "standard GRPO"):
    each trajectory (`traj_uid`) is one member whose value is the mean reward of its rows in the
    group, and all its rows take that mean as their reward, so they share one advantage."""

    # --- Parameters that control normalization ----------------------------------------------
    normalize: Literal["std", "center"] = "std"
    """"std": A = (r - mean) / (std + eps) with the unbiased (ddof=1) std, as GRPO and DrMAS.
    "center": A = r - mean (Dr. GRPO, the AT-GRPO pseudocode)."""
    eps: float = 1e-6
    """Added to the std before dividing."""
    singleton: Literal["zero", "raw"] = "zero"
    """Groups of one member: "zero" gives A = 0 (there is no baseline to compare against);
    "raw" uses verl's rule mean 0, std 1, so A = r / (1 + eps) (r with "center")."""

    # --- Parameters that control rewards and weights ----------------------------------------
    alpha: float = 1.0
    """Mixing coefficient of AT-GRPO's mixed reward: reward = alpha * global_reward + local_reward,
    recomputed whenever both columns are present (a stored `reward` is then ignored)."""
    strategy_weights: Mapping[str, float] | None = None
    """Mixture weights w_s of the stratified estimator (seed 004). None: every member row weighs 1
    (the plain stratified average). Otherwise w_s is normalized over the strategies present and
    sample_weight = w_s * N / n_s (n_s member rows of strategy s, N all member rows), so the mean
    weight is 1. Every strategy present in the table must have a weight."""

    def __post_init__(self) -> None:
        if isinstance(self.group_by, str):
            raise ConfigError(f"group_by must be a tuple of column names, got the string {self.group_by!r}")
        group_by = tuple(self.group_by)
        bad = [c for c in group_by if c not in GROUP_COLUMNS]
        if bad:
            raise ConfigError(f"group_by: unknown column(s) {bad}; choose from {list(GROUP_COLUMNS)} (uid is always part of the key)")
        if len(set(group_by)) != len(group_by):
            raise ConfigError(f"group_by has duplicates: {list(group_by)}")
        object.__setattr__(self, "group_by", group_by)
        if self.normalize not in ("std", "center"):
            raise ConfigError(f"normalize must be 'std' or 'center', got {self.normalize!r}")
        if self.singleton not in ("zero", "raw"):
            raise ConfigError(f"singleton must be 'zero' or 'raw', got {self.singleton!r}")
        if not (isinstance(self.eps, (int, float)) and math.isfinite(self.eps) and self.eps >= 0):
            raise ConfigError(f"eps must be a finite number >= 0, got {self.eps!r}")
        if not (isinstance(self.alpha, (int, float)) and math.isfinite(self.alpha)):
            raise ConfigError(f"alpha must be a finite number, got {self.alpha!r}")
        if self.strategy_weights is not None:
            weights = dict(self.strategy_weights)
            if not weights:
                raise ConfigError("strategy_weights is empty; pass None for the plain stratified average")
            for name, w in weights.items():
                if not (isinstance(w, (int, float)) and math.isfinite(w) and w > 0):
                    raise ConfigError(f"strategy_weights[{name!r}] must be a finite number > 0, got {w!r}")
            object.__setattr__(self, "strategy_weights", FrozenMapping(weights))

    @property
    def group_key(self) -> list[str]:
        """The full group key: uid + group_by."""
        return ["uid", *self.group_by]

