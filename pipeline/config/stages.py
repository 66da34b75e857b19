"""The configs of the stages a run composes: how advantages are computed (`AdvantageConfig`),
which rows a policy trains on (`ViewConfig`) and what the held-out evaluation samples
(`EvalConfig`). Frozen dataclasses, each field documented where it is declared and validated at
construction (an invalid value raises `ConfigError` naming the field); their defaults are the
default run's (`maxit run` with no flags), so a stage called with its default config in a notebook
(`compute_advantages(steps)`) computes what that run computes."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterator, Literal, Mapping

from pipeline.config.fields import check_count, check_declared, setting
from pipeline.config.loss import LossConfig
from pipeline.errors import ConfigError

__all__ = ["AdvantageConfig", "ViewConfig", "EvalConfig", "FrozenMapping", "GROUP_COLUMNS", "BASE_GROUP_KEY", "ZERO_ADVANTAGE_ROWS"]


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

BASE_GROUP_KEY = ("uid", "strategy")
"""Columns every advantage group is keyed on: the problem and the strategy that sampled the row.
A group never spans strategies: siblings sampled under one context (a tree node's candidates,
iid samples, prompt-augmented samples, feedback retries) are compared only with each other, so
one strategy's success rate never becomes another's baseline."""

GROUP_COLUMNS = ("agent_id", "turn")
"""Columns that `group_by` may add to `BASE_GROUP_KEY`."""

ZERO_ADVANTAGE_ROWS = ("drop", "keep")
"""The `zero_advantage_rows` setting: `ViewConfig.drop_zero_advantage` True or False."""


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
    local_weight=1; rejection sampling on each call's own correctness is alpha=0, local_weight=1
    (the default: the default run's "rs" loss trains the calls whose own action was right).
    """

    # --- Parameters that control the groups -------------------------------------------------
    group_by: tuple[str, ...] = field(default=GROUP_COLUMNS, metadata=setting(
        "group_by", "columns added to uid+strategy to form advantage groups (a group never spans strategies; none = plain GRPO per strategy)",
        group="rewards and advantages", metavar="COL"))
    """Columns added to `uid` + `strategy` to form a group: any subset of ("agent_id", "turn").
    "strategy" is accepted for compatibility and dropped (it is always in the key), so
    `group_by=("agent_id", "turn", "strategy")` equals the default."""
    trajectory_mean: bool = field(default=False, metadata=setting(
        "trajectory_mean", "group statistics over trajectory means (one member per trajectory)", group="rewards and advantages"))
    """False (DrMAS, `group_by_agent_id=True`): every active row is a group member, so an agent
    called k times in a trajectory counts k times. True (DrMAS's "standard GRPO",
    `group_by_agent_id=False`): each trajectory (`traj_uid`) is one member whose value is the mean
    reward of its rows in the group; `group_mean` and `group_std` are taken over those members,
    so a trajectory with many calls weighs no more in the baseline than one with a single call.
    `trajectory_score` says which value each row is then scored with."""
    trajectory_score: Literal["own", "mean"] = field(default="own", metadata=setting(
        "trajectory_score", "with trajectory_mean: each row scored by its own reward (own) or by its trajectory's mean (mean, as DrMAS's code)",
        group="rewards and advantages"))
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
    normalize: Literal["std", "center"] = field(default="std", metadata=setting(
        "normalize", "advantage normalisation: (r-mean)/std, or r-mean", group="rewards and advantages"))
    """"std": A = (r - mean) / (std + eps) with the unbiased (ddof=1) std, as GRPO and DrMAS.
    "center": A = r - mean (Dr. GRPO, the AT-GRPO pseudocode)."""
    eps: float = 1e-6
    """Added to the std before dividing."""
    singleton: Literal["zero", "raw"] = "zero"
    """Groups of one member: "zero" gives A = 0 (there is no baseline to compare against);
    "raw" uses verl's rule mean 0, std 1, so A = r / (1 + eps) (r with "center")."""
    baseline: Literal["group", "batch", "role"] = field(default="group", metadata=setting(
        "baseline",
        "advantage baseline: the statistics of the problem's group of samples (GRPO), or of the whole round's rows of that strategy "
        "(REINFORCE with a mean-reward baseline: all-right groups still count), or a running mean of the reward per role over the "
        "rounds (role: SPIRAL's role-conditioned baseline, for self-play games)",
        group="rewards and advantages"))
    """"group": the statistics of the row's group of samples of one problem (GRPO, DrMAS,
    AT-GRPO). "batch": of all the round's rows of the same strategy (and `group_by` columns),
    every problem together: REINFORCE with a mean-reward baseline, so a problem whose samples were
    all right still has a positive advantage (its samples are above the round's mean) where the
    group baseline gives it 0.
    "role" (SPIRAL's role-conditioned advantage estimation, RAE, for self-play games): a running
    mean of the reward per role (`agent_id`; the game is the run's workflow), A = reward - b,
    where after each round b <- role_decay * b + (1 - role_decay) * (the round's mean reward of
    that role's rows), starting at 0, and a round's rows are scored against the b updated with
    their own round. The running mean is a function of the earlier rounds' stored rows
    (`compute_advantages(..., earlier=...)`), so it survives a resumed run. It ignores
    `group_by`, `normalize` and `singleton` (no std: A is the centred return)."""
    role_decay: float = 0.95
    """The running mean's decay under baseline="role" (SPIRAL's alpha, 0.95)."""

    # --- Parameters that control rewards ----------------------------------------------------
    alpha: float = field(default=0.0, metadata=setting("alpha", "reward = alpha*global_reward + local_weight*local_reward", group="rewards and advantages"))
    """Weight of the global (team outcome) reward: reward = alpha * global_reward +
    local_weight * local_reward, recomputed whenever both columns are present (a stored `reward`
    is then ignored; either part null gives a null reward, as at rollout time). 0 by default:
    the "rs" loss judges a call by its own action alone."""
    local_weight: float = field(default=1.0, metadata=setting("local_weight", "weight of the local (own-action) reward", group="rewards and advantages"))
    """Weight of the local (own action) reward in the mixed reward (see `alpha`). 0 with alpha=1
    gives DrMAS's reward: every agent of a trajectory gets the team's final reward. At least one
    of `alpha` and `local_weight` must be non-zero."""

    def __post_init__(self) -> None:
        check_declared(self)  # the declared choices (trajectory_score, normalize, baseline, singleton) and group_by a sequence
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
        if self.trajectory_score == "mean" and not self.trajectory_mean:
            raise ConfigError("trajectory_score='mean' needs trajectory_mean=True (without it every row is scored by its own reward)")
        if not (_is_number(self.role_decay) and 0 <= self.role_decay < 1):
            raise ConfigError(f"role_decay must be in [0, 1), got {self.role_decay!r}")
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


@dataclass(frozen=True)
class ViewConfig:
    """Which rows become training rows, and how long they may be."""

    max_length: int | None = None
    """Longest training prompt + completion in tokens (the model's context); longer rows are
    dropped and counted. None = no limit here (the trainer still enforces the model's)."""
    drop_zero_advantage: bool = field(default=True, metadata=setting(
        "zero_advantage_rows",
        "rows of zero advantage (all of a group's samples got one reward): dropped from the training view, or kept, so that a "
        "minibatch counts every sample as verl's token mean, the expert-iteration plan's 1/N and TRL's GRPOTrainer do (their loss "
        "is 0: the trainer skips their forward pass; they set how many rows make an optimizer step and the mean's denominator)",
        group="training", hint=str, choices=ZERO_ADVANTAGE_ROWS))
    """Leave out rows with |advantage| <= zero_advantage_tol (they carry no policy gradient; the
    prototype dropped them). Set False for the "rs" loss, which trains on correct rows of
    all-correct groups too, and to count every sample in a minibatch's mean as verl's token mean
    and the expert-iteration plan's 1/N do (the source presets: the trainer skips those rows'
    forward pass and counts them; dropped, the update is scaled by all rows / rows kept)."""
    zero_advantage_tol: float = 0.0
    """Advantages with absolute value at most this count as zero."""
    check_identity_render: bool = False
    """Also re-render contexts the strategy leaves unchanged and raise `DataError` if the ids
    differ from the stored `prompt_ids` (catches a tokenizer or chat template that is not the
    one the rows were sampled with)."""
    policy_ids: tuple[str, ...] | None = None
    """Keep only rows of these policies (None = all)."""
    drop_strategies: tuple[str, ...] = ()
    """Strategies whose rows are sampled (they shape the round's rollouts) but not trained, e.g.
    ("prompt_aug",) to leave the hinted rows out instead of correcting their ratios; counted as
    not trainable."""
    min_reward: float | None = None
    """Leave out rows whose reward is below this (None = keep all). The "rs" loss trains only on
    rows at or above its threshold, so its view needs no forward pass over the others."""
    strategy_weights: Mapping[str, float] | None = field(default=None, metadata=setting(
        "strategy_weights",
        "stratified mixture weights STRATEGY=W: each row scaled by w_s/n_s, n_s the rows strategy s sampled for the policy to train "
        "(before the zero-advantage and reward filters), normalised so those rows' weights average 1 (none: every row weighs 1)",
        group="training", hint=tuple[str, ...], metavar="S=W", aliases=("--strategy-weight",)))
    """Mixture weights w_s of the stratified estimator (the expert-iteration plan, see
    docs/ALGORITHMS.md). None: every row keeps its weight (the plain stratified average).
    Otherwise, per policy: sample_weight *= w_s * N / n_s, with w_s normalized over the
    strategies present, n_s the rows strategy s sampled for that policy to train and N all of
    them: the rows left after the activity, reward, policy, trainable and weight filters, and
    before the zero-advantage and min-reward filters (the plan's n_s is what a strategy sampled;
    counting after those filters would let a strategy's weight grow with its share of degenerate
    groups, which changes from round to round). Rows a strategy does not train (feedback's
    skipped first attempt) and another policy's rows are not counted. Every strategy present
    needs a weight."""
    reward_is_local: bool = False
    """Require every row's `reward` to be its own action's correctness (`local_reward`), as the
    "rs" loss does when it keeps rows with reward >= its threshold: with a global term mixed in, a
    wrong first attempt of a trajectory that later succeeds would pass. A table whose reward is
    not the local reward is then an error naming the rows."""
    balance_verdicts: bool = field(default=False, metadata=setting(
        "balance_verdicts",
        "equal total weight for the yes and no rows of an agent that gives verdicts (the math Verifier) each round (it rescales "
        "rows after the advantages: under a policy gradient the groups' advantages would no longer sum to 0)",
        group="training"))
    """Give the Verifier's "yes" and "no" rows equal total weight (`balance_weights` over the
    `verdict` column; unparsable verdicts keep their weight). The Verifier is called again on every
    retry after a rejection and retries are mostly wrong, so its correct verdicts are mostly "no"
    (about 2:1 in round 0 of the default run) while the answers it judges at test time are mostly
    right: unbalanced, it learns to say "no"."""
    relabel_verdicts: bool = field(default=False, metadata=setting(
        "relabel_verdicts",
        "rs loss: train every Verifier row on the right verdict (a wrong verdict's row gets the other verdict) instead of only the rows it got right",
        group="training"))
    """Train every parsable Verifier row on the right verdict: a row whose verdict was wrong
    (local reward 0) gets the completion of the other verdict (the most common completion of the
    round's right verdicts of that kind, e.g. "no" for a wrong "yes") and reward 1, instead of
    being left out. The reward says which verdict was right, so this is the expert's label for
    each judged answer; rejection sampling alone keeps only the verdicts the Verifier already got
    right, which teaches it little it does not already know. The new completion's logprobs are
    not q of that context, so only the "rs" loss (no ratio) may use it (`reward_is_local` and
    `min_reward` set)."""

    verifier_replay: int = field(default=0, metadata=setting(
        "verifier_replay",
        "train the Verifier on its calls of the last N rounds (this one included), each labelled by the reward with the right verdict, "
        "one row per distinct prompt, yes/no balanced, by their NLL under every loss; 0 = its own rows of this round only",
        group="training", metavar="N"))
    """Train the Verifier on its hindsight-labelled calls of the last `verifier_replay` rounds
    (this one included) instead of this round's rows alone (`verifier_replay`; 0 = off). Every
    judged answer is labelled by the reward with the right verdict, one row per distinct training
    prompt (the newest call), "yes" and "no" rows balanced; the rows are trained by their NLL
    (strategy `REPLAY_STRATEGY`, which every loss trains the rs way) and replace the round's own
    Verifier rows in the view. The Solver's rows are untouched."""

    def __post_init__(self) -> None:
        check_declared(self)  # policy_ids and drop_strategies sequences
        if isinstance(self.verifier_replay, bool) or not isinstance(self.verifier_replay, int) or self.verifier_replay < 0:
            raise ConfigError(f"ViewConfig.verifier_replay must be a whole number of rounds >= 0, got {self.verifier_replay!r}")
        check_count("ViewConfig.max_length", self.max_length, minimum=2, optional=True)
        if not (math.isfinite(self.zero_advantage_tol) and self.zero_advantage_tol >= 0):
            raise ConfigError(f"ViewConfig.zero_advantage_tol must be finite and >= 0, got {self.zero_advantage_tol!r}")
        object.__setattr__(self, "drop_strategies", tuple(self.drop_strategies))
        if self.strategy_weights is not None:
            weights = dict(self.strategy_weights)
            if not weights:
                raise ConfigError("ViewConfig.strategy_weights is empty; pass None for the plain stratified average")
            for name, w in weights.items():
                if isinstance(w, bool) or not (isinstance(w, (int, float)) and math.isfinite(w) and w > 0):
                    raise ConfigError(f"ViewConfig.strategy_weights[{name!r}] must be a finite number > 0, got {w!r}")
            object.__setattr__(self, "strategy_weights", FrozenMapping(weights))
        if self.relabel_verdicts and (not self.reward_is_local or self.min_reward is None):
            raise ConfigError(
                "ViewConfig.relabel_verdicts needs the rs loss's view (reward_is_local and min_reward set): "
                "a relabelled completion has no sampling logprobs in its context for an importance ratio"
            )

    @classmethod
    def for_loss(cls, loss: LossConfig, **fields) -> "ViewConfig":
        """The view `loss` trains on (`fields` set the rest). "rs" keeps the rows at or above its
        threshold whose reward is their own action's correctness, zero advantages included, with
        the verdicts balanced; the policy-gradient losses keep every rewarded row but those of
        zero advantage, unbalanced (rescaling rows after the advantages would break the groups'
        zero-sum advantages). `ViewConfig()` alone is the latter's; the default run's view is
        `ViewConfig.for_loss(LossConfig())`."""
        rs = loss.kind == "rs"
        if fields.get("relabel_verdicts") and not rs:
            raise ConfigError(relabel_needs_rs("ViewConfig.relabel_verdicts", "LossConfig.kind", loss.kind))
        own = {"drop_zero_advantage": not rs, "min_reward": loss.rs_threshold if rs else None, "reward_is_local": rs, "balance_verdicts": rs}
        return cls(**{**own, **fields})


def relabel_needs_rs(relabel: str, kind: str, value: str) -> str:
    """The error of verdict relabelling (the field named `relabel`) under a loss other than rs
    (the field named `kind`, set to `value`)."""
    return (f"{relabel} trains Verifier rows on a verdict they did not sample, which has no sampling logprob for the "
            f"importance ratio of {kind} {value}: use it with {kind} rs")


@dataclass(frozen=True)
class EvalConfig:
    """What the held-out evaluation samples."""

    problems: int = field(default=200, metadata=setting(
        "eval_problems", "held-out problems evaluated after every round (the same ones each round)", group="evaluation"))
    """Held-out problems (the same ones every round)."""
    samples: int = field(default=2, metadata=setting("eval_samples", "Solver samples per held-out problem", group="evaluation"))
    """Episodes (math: Solver samples) per problem at `temperature` (standard error ~2.5 points
    at 200 x 2 near 50%)."""
    temperature: float = 1.0
    """Sampling temperature (the rollouts' temperature, so the number reads as what training sees)."""
    max_tokens: int | None = field(default=None, metadata=setting(
        "eval_max_tokens", "completion budget of the evaluation's Solver and Verifier calls; None = the task's default (arithmetic 16, task file 512)",
        group="evaluation"))
    """Completion budget of every agent call; None = the workflow's (math: the task's
    `default_eval_max_tokens`, arithmetic 16, file tasks 512)."""
    seed: int = 20_261_122
    """Seed of the held-out problem draw and of the sampling."""
    hint: bool = True
    """Also measure with the prompt-augmentation hint shown (math: `accuracy_hint`)."""
    reward_timeout: float | None = 10.0
    """Seconds one call of the task's reward or verdict parser may take (as in the rollouts)."""
    greedy: bool = True
    """Also measure greedy decoding (one episode per problem at temperature 0)."""
    reuse_base: bool = field(default=True, metadata=setting(
        "base_eval_cache",
        "reuse the starting model's evaluation (round -1) computed by an earlier run with the same model, task, evaluation, engine and code",
        group="evaluation", negative_flag=("--no-base-eval-cache", "evaluate the starting model afresh (round -1), not from the cache, and leave the cache alone")))
    """Round -1 (the starting checkpoints' evaluation) is taken from the cache when a run with the
    same model, task, evaluation, engine and code computed it before, and kept there when computed
    (`pipeline.run.eval_cache`). False: always computed, the cache untouched."""

    def __post_init__(self) -> None:
        for name in ("problems", "samples", "max_tokens"):
            check_count(f"EvalConfig.{name}", getattr(self, name), optional=name == "max_tokens")
        if not (isinstance(self.temperature, (int, float)) and self.temperature > 0):
            raise ConfigError(f"EvalConfig.temperature must be > 0, got {self.temperature!r}")
