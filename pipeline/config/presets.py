"""The algorithms a run can follow and the settings each one fixes (`ALGORITHM_PRESETS`), the
losses' own defaults (`LOSS_PRESETS`), and the default strategy mix (`DEFAULT_MIX`).

A preset is written in the run's flat settings (the names of `maxit run`'s flags, placed in the
config tree by `pipeline.config.flat`): `RunConfig.for_algorithm("atgrpo", samples=8)` and
`RunConfig(algorithm="atgrpo")` fill what is left unset from here, as `maxit run --algorithm
atgrpo` does. docs/ALGORITHMS.md#presets says which source each value comes from and where a
preset departs from it; tests/test_preset_sources.py checks each against its source.
"""

from __future__ import annotations

from dataclasses import MISSING, fields
from typing import Any, Mapping, Sequence

from pipeline.config.stages import AdvantageConfig
from pipeline.config.loss import LOSS_KINDS, LossConfig
from pipeline.config.train import TrainConfig
from pipeline.strategies import Feedback

__all__ = ["ALGORITHMS", "ALGORITHM_PRESETS", "LOSS_KINDS", "LOSS_PRESETS", "DEFAULT_MIX", "SOURCES", "unsourced_strategies", "config_default"]


def config_default(config: type, name: str) -> Any:
    """The default that `config` (one of the library's configs) declares for its field `name`:
    a setting left alone is what the library does without it."""
    f = {f.name: f for f in fields(config)}[name]
    return f.default if f.default is not MISSING else f.default_factory()


DEFAULT_MIX = ("iid", "prompt_aug", "feedback", "tree")
"""The default algorithm's strategies (maxit's): the plan's three experts and AT-GRPO's tree,
interleaved in each round."""

LOSS_PRESETS: Mapping[str, Mapping[str, Any]] = {
    # rejection-sampling expert iteration: a row is trained when its own action was right (the
    # Solver's answer, the Verifier's verdict), so the reward is the local reward alone (alpha 0,
    # local_weight 1; `RunConfig` refuses any other mix). The library's defaults are this loss's:
    # its preset is read from them
    "rs": {
        "alpha": config_default(AdvantageConfig, "alpha"), "local_weight": config_default(AdvantageConfig, "local_weight"),
        "lr": config_default(TrainConfig, "lr"), "baseline": config_default(AdvantageConfig, "baseline"),
        "negative_weight": config_default(LossConfig, "negative_weight"), "clip_high": config_default(LossConfig, "eps_high"),
    },
    # policy gradient with PPO clip: each call's own correctness as its reward (alpha 0), the
    # round's mean reward per strategy/agent/turn as the baseline, at rs's learning rate, and the
    # positive half of the gradient only (negative_weight 0: a wrong sample is not pushed down;
    # docs/results/policy-gradient.md has why). `--negative-weight 1` is the plain gradient.
    "ppo": {"alpha": 0.0, "local_weight": 1.0, "lr": 5e-4, "baseline": "batch", "negative_weight": 0.0, "clip_high": 0.28},
    # per-token importance sampling without a clip (not the plan's estimator: see "exit"), with AT-GRPO's groups
    "is": {"alpha": 1.0, "local_weight": 1.0, "lr": 2e-4, "baseline": "group", "negative_weight": 1.0, "clip_high": 0.28},
    # the expert-iteration plan's estimator exactly: each row's sequence likelihood ratio times its
    # advantage, averaged over the rows, no ratio mask
    "exit": {"alpha": 1.0, "local_weight": 1.0, "lr": 2e-4, "baseline": "group", "negative_weight": 1.0, "clip_high": 0.28},
}
"""Defaults per loss (`LOSS_KINDS`), used where `alpha` / `local_weight` / `lr` / `baseline` /
`negative_weight` / `clip_high` are left unset by the settings and by the algorithm."""

ALGORITHMS = ("maxit", "drmas", "atgrpo", "exit", "grpo")
"""The algorithms a run can follow (`RunConfig.algorithm`, `--algorithm`); maxit is the default."""

ALGORITHM_PRESETS: Mapping[str, dict[str, Any]] = {
    # the measured best on the embedded default (docs/ALGORITHMS.md#maxit-the-default): rejection
    # sampling on each call's own correctness, AT-GRPO's groups and tree beside the plan's
    # strategies. It is the default algorithm, so its values are the library's defaults (the
    # configs of pipeline.config declare them); the settings left out here come from the loss's
    # preset. The hinted and feedback rows keep the sequence-ratio mask (it acts only under a loss
    # with a ratio, not rs; docs/ALGORITHMS.md says why)
    "maxit": {
        "loss": config_default(LossConfig, "kind"), "strategies": DEFAULT_MIX, "group_by": config_default(AdvantageConfig, "group_by"),
        "normalize": config_default(AdvantageConfig, "normalize"), "trajectory_mean": config_default(AdvantageConfig, "trajectory_mean"),
        "trajectory_score": config_default(AdvantageConfig, "trajectory_score"), "hinted_rows": "mask", "feedback_rows": "mask",
        "feedback_first_attempt": config_default(Feedback, "first_attempt"), "feedback_train_context": config_default(Feedback, "train_context"),
        "strategy_weights": (),
    },
    # The four below are their sources: no sequence-ratio mask (none of them has one), and every
    # sample counted in the minibatch's mean (verl's token mean counts the tokens of zero-advantage
    # rows, the plan's N is every sample): zero-advantage rows are kept in the view, where the
    # trainer skips their forward pass and counts them.
    # DrMAS: K copies of each problem, groups per (uid, agent), the team's final reward on every
    # row, verl's PPO with the dual clip and std normalisation
    "drmas": {
        "loss": "ppo", "strategies": ("iid",), "group_by": ("agent_id",), "normalize": "std", "trajectory_mean": False,
        "trajectory_score": "own", "feedback_first_attempt": "iid", "feedback_train_context": "problem", "balance_verdicts": False,
        "strategy_weights": (), "alpha": 1.0, "local_weight": 0.0, "baseline": "group", "negative_weight": 1.0, "clip_low": 0.2, "clip_high": 0.2,
        "dual_clip": 3.0, "sequence_ratio": "none", "zero_advantage_rows": "keep",
    },
    # AT-GRPO: tree sampling, groups per (uid, agent, turn), alpha * global + local, PPO clip
    "atgrpo": {
        "loss": "ppo", "strategies": ("tree",), "group_by": ("agent_id", "turn"), "normalize": "std", "trajectory_mean": False,
        "trajectory_score": "own", "feedback_first_attempt": "iid", "feedback_train_context": "problem", "balance_verdicts": False,
        "strategy_weights": (), "alpha": 1.0, "local_weight": 1.0, "baseline": "group", "negative_weight": 1.0, "clip_low": 0.2, "clip_high": 0.2,
        "sequence_ratio": "none", "zero_advantage_rows": "keep",
    },
    # the expert-iteration plan: iid, hint and two-turn feedback samples, advantages centred
    # within each strategy's group, the importance-sampling estimator over the N samples with
    # stratified weights w_s / n_s, feedback's first attempt at weight 0, hint and feedback
    # dropped from the training context
    "exit": {
        "loss": "exit", "strategies": ("iid", "prompt_aug", "feedback"), "group_by": ("agent_id", "turn"), "normalize": "center",
        "trajectory_mean": False, "trajectory_score": "own", "feedback_first_attempt": "skip", "feedback_train_context": "problem",
        "balance_verdicts": False, "strategy_weights": ("iid=1", "prompt_aug=1", "feedback=1"), "alpha": 0.0, "local_weight": 1.0,
        "baseline": "group", "negative_weight": 1.0, "sequence_ratio": "none", "zero_advantage_rows": "keep",
    },
    # plain GRPO as DrMAS's code runs it (its GRPO baseline, group_by_agent_id=False): K samples of
    # each problem, one group per problem over trajectories (one member per trajectory), the
    # outcome reward, verl's PPO loss (its dual clip included)
    "grpo": {
        "loss": "ppo", "strategies": ("iid",), "group_by": (), "normalize": "std", "trajectory_mean": True, "trajectory_score": "own",
        "feedback_first_attempt": "iid", "feedback_train_context": "problem", "balance_verdicts": False, "strategy_weights": (),
        "alpha": 1.0, "local_weight": 0.0, "baseline": "group", "negative_weight": 1.0, "clip_low": 0.2, "clip_high": 0.2, "dual_clip": 3.0,
        "sequence_ratio": "none", "zero_advantage_rows": "keep",
    },
}
"""The settings each algorithm fixes, applied where a setting is left unset (None); a setting
given explicitly wins. docs/ALGORITHMS.md#presets says which source each value comes from and
where a preset departs from it."""

SOURCES = {"drmas": "DrMAS", "atgrpo": "AT-GRPO", "exit": "the expert-iteration plan", "grpo": "GRPO as DrMAS's code runs it"}
"""The source each algorithm but maxit (the project's own) follows (docs/ALGORITHMS.md#presets)."""


def unsourced_strategies(algorithm: str, strategies: Sequence[str], alpha: float) -> list[str]:
    """A line for each of `strategies` that `algorithm`'s source does not sample (its preset's
    `strategies`), naming it; none for maxit, whose strategies are all its own. Such a strategy
    is allowed (a setting given explicitly wins over the preset, and its rows are well defined),
    but the run is then no longer its source's. A tree row under a global reward (alpha > 0) is
    said apart: it is scored right after its step, so the selected row of a path whose final
    answer turns out otherwise keeps its step's reward, not the team's final one."""
    if algorithm not in SOURCES:
        return []
    own = tuple(ALGORITHM_PRESETS[algorithm]["strategies"])
    notes = []
    for sid in dict.fromkeys(strategies):
        if sid in own:
            continue
        note = (f"--algorithm {algorithm}: strategy {sid!r} is not {SOURCES[algorithm]}'s (it samples {' '.join(own)}); "
                "its rows are trained with the preset's groups, reward and loss")
        if sid == "tree" and alpha != 0:
            note += (f"; a tree row's global reward is its state's right after its step, so with alpha {alpha:g} a selected row "
                     "of a path whose final answer turns out otherwise keeps its step's reward, not the team's final reward")
        notes.append(note)
    return notes
