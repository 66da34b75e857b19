"""The one definition of a run's settings.

`Settings` is a flat, frozen record of every knob a user sets for an expert-iteration run: its
name, type, default and help text. It is the thin layer over the library's configs
(`pipeline.config`): a setting's default is the one its config declares, so a setting left alone
does what the library does without it, and the interfaces are made from it:
- `Settings().run_config()` is the `pipeline.config.RunConfig` the stages run with, equal to
  `RunConfig()` (so a notebook gets the same run);
- the Dagster `settings` resource (`assets.config.RunSettings`) has one field per setting;
- `maxit run` has one flag per setting (`add_setting_flags`).

Settings whose default depends on the loss (`alpha`, `local_weight`) default to None, which means
"the loss's preset" (`LOSS_PRESETS`). A combination that would silently train the wrong rows is a
`ConfigError` naming the settings.
"""

from __future__ import annotations

import argparse
import types
import typing
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, Mapping, Sequence

from pipeline.config import AdvantageConfig, EvalConfig, RunConfig, ViewConfig
from pipeline.errors import ConfigError
from pipeline.strategies import Feedback
from pipeline.config.train import LoraSettings, LossConfig, RatioConfig, TrainConfig

__all__ = ["Settings", "LOSS_PRESETS", "ALGORITHMS", "ALGORITHM_PRESETS", "add_setting_flags", "setting_flag", "setting_help", "preset_summary", "unsourced_strategies", "SOURCES", "settings_from_args", "setting_default", "parse_group_by"]


def _s(
    default: Any, help: str, *, group: str, choices: tuple | None = None, negative_flag: tuple[str, str] | None = None, metavar: str | None = None
):
    """A setting: a dataclass field with its help text, CLI group and choices as metadata.
    `negative_flag`: (flag, help) of a boolean set to False on the command line by that flag."""
    meta = {"help": help, "group": group, "choices": choices, "negative_flag": negative_flag, "metavar": metavar}
    if isinstance(default, (list, dict)):
        raise TypeError("mutable defaults are not allowed; use a tuple")
    return field(default=default, metadata=meta)


def _default(config: type, name: str) -> Any:
    """The default that `config` (one of the library's configs) declares for its field `name`:
    a setting left alone is what the library does without it."""
    f = {f.name: f for f in fields(config)}[name]
    return f.default if f.default is not MISSING else f.default_factory()


_CHECKPOINTING = {"auto": None, "on": True, "off": False}
"""The `gradient_checkpointing` setting -> `TrainConfig.gradient_checkpointing`."""

LOSS_KINDS = ("rs", "ppo", "is", "exit")

LOSS_PRESETS: Mapping[str, Mapping[str, Any]] = {
    # rejection-sampling expert iteration: a row is trained when its own action was right (the
    # Solver's answer, the Verifier's verdict), so the reward is the local reward alone (alpha 0,
    # local_weight 1; `check` refuses any other mix). The library's defaults are this loss's: its
    # preset is read from them
    "rs": {
        "alpha": _default(AdvantageConfig, "alpha"), "local_weight": _default(AdvantageConfig, "local_weight"), "lr": _default(TrainConfig, "lr"),
        "baseline": _default(AdvantageConfig, "baseline"), "negative_weight": _default(LossConfig, "negative_weight"),
        "clip_high": _default(LossConfig, "eps_high"),
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
"""Defaults per loss, used where `alpha` / `local_weight` / `lr` / `baseline` / `negative_weight` are None."""

ALGORITHMS = ("maxit", "drmas", "atgrpo", "exit", "grpo")

ALGORITHM_PRESETS: Mapping[str, Mapping[str, Any]] = {
    # the measured best on the embedded default (docs/ALGORITHMS.md#maxit-the-default): rejection
    # sampling on each call's own correctness, AT-GRPO's groups and tree beside the plan's
    # strategies. It is the default algorithm, so its values are the library's defaults (the
    # configs of pipeline.config and pipeline.config.train declare them); the settings left out
    # here come from the loss's preset. The hinted and feedback rows keep the sequence-ratio mask
    # (it acts only under a loss with a ratio, not rs; docs/ALGORITHMS.md says why)
    "maxit": {
        "loss": _default(LossConfig, "kind"), "strategies": _default(RunConfig, "strategies"), "group_by": _default(AdvantageConfig, "group_by"),
        "normalize": _default(AdvantageConfig, "normalize"), "trajectory_mean": _default(AdvantageConfig, "trajectory_mean"),
        "trajectory_score": _default(AdvantageConfig, "trajectory_score"), "hinted_rows": "mask", "feedback_rows": "mask",
        "feedback_first_attempt": _default(Feedback, "first_attempt"), "feedback_train_context": _default(Feedback, "train_context"),
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


@dataclass(frozen=True)
class Settings:
    """Every setting of an expert-iteration run (see the module docstring). Field metadata holds
    each setting's help text; `run_config()` validates the whole and builds the `RunConfig`."""

    # --- the algorithm ---------------------------------------------------------------------
    algorithm: str = _s(
        "maxit",
        "the algorithm the run follows: maxit (the measured best), drmas, atgrpo, exit (the expert-iteration plan) or grpo; "
        "it presets the loss, strategies, groups, reward mix and weights (docs/ALGORITHMS.md#presets); settings given explicitly override it",
        group="team and task",
        choices=ALGORITHMS,
    )

    # --- the team and the task ------------------------------------------------------------
    workflow: str = _s(
        _default(RunConfig, "workflow"),
        "the team and its environment (pipeline.workflows): math (Solver + Verifier), single (the Solver alone), code "
        "(a Coder and a Tester, sandboxed), a module:Name or file.py:Name path, or a maxit.workflows entry point",
        group="team and task",
        metavar="WORKFLOW",
    )
    workflow_options: tuple[str, ...] = _s(
        (), "KEY=VALUE options given to the workflow's constructor (numbers and true/false are parsed)", group="team and task", metavar="KEY=VALUE"
    )
    task: str = _s(_default(RunConfig, "task"), "task name (pipeline.tasks); ignored with task_file", group="team and task")
    task_file: str | None = _s(_default(RunConfig, "task_file"), "local JSONL/Parquet problems file (question/answer columns) instead of the task", group="team and task")
    prompt_file: str | None = _s(
        _default(RunConfig, "prompt_file"),
        "TOML/JSON file of prompt settings (user, system, answer_format, verifier_user, verdict...) over the task's own prompts; None = the task's",
        group="team and task",
        metavar="FILE",
    )
    model_dir: str | None = _s(_default(RunConfig, "model_dir"), "starting checkpoint, a local HF model folder; None = the embedded tiny model", group="team and task")
    shared_policy: bool = _s(
        _default(RunConfig, "shared_policy"),
        "the workflow's agents share one policy (False: each has its own)",
        group="team and task",
        negative_flag=("--separate-policies", "each agent of the workflow gets its own policy (default: one shared policy)"),
    )
    engine: str = _s(_default(RunConfig, "engine"), "rollout engine: vllm, hf, or auto (vLLM when importable)", group="team and task", choices=("auto", "vllm", "hf"))
    dtype: str = _s(
        _default(TrainConfig, "dtype"),
        "precision of the engines and of training (bf16 autocast over float32 weights): auto = bfloat16 on a GPU, and on a CPU with "
        "native bf16 (avx512_bf16 or amx_bf16 in /proc/cpuinfo) for models of 20M parameters or more; float32 elsewhere and for the "
        "tiny default model (faster there, and sampled logprobs match training's)",
        group="team and task",
        choices=("auto", "float32", "bfloat16"),
    )

    # --- sampling ---------------------------------------------------------------------------
    problems: int = _s(_default(RunConfig, "problems"), "training problems drawn per round", group="sampling")
    samples: int = _s(_default(RunConfig, "samples"), "group size of every strategy (tree: candidates per node)", group="sampling")
    strategies: tuple[str, ...] | None = _s(
        None, "search strategies interleaved in each round", group="sampling", metavar="STRATEGY"
    )
    temperature: float = _s(_default(RunConfig, "temperature"), "sampling temperature (training computes p_train at the same temperature)", group="sampling")
    max_tokens: int | None = _s(_default(RunConfig, "max_tokens"), "completion budget of each agent call in rollouts; None = the task's default (arithmetic 16, task file 512)", group="sampling")
    max_loop_num: int | None = _s(
        _default(RunConfig, "max_loop_num"), "turns at most per episode (math: Solver/Verifier loops per sample, DrMAS's max_loop_num); None = the workflow's (math 2)", group="sampling"
    )
    seed: int = _s(_default(RunConfig, "seed"), "seed of the problem draws and of sampling (each round derives its own)", group="sampling")
    feedback_train_context: str | None = _s(
        None,
        "training context of the feedback strategy's second attempt: the problem only, or problem + first attempt",
        group="sampling",
        choices=("problem", "attempt"),
    )
    feedback_first_attempt: str | None = _s(
        None, "the feedback strategy's first attempt: trained as an iid row, or not trained (the plan's weight 0)",
        group="sampling", choices=("iid", "skip")
    )

    # --- rewards and advantages -------------------------------------------------------------
    alpha: float | None = _s(None, "reward = alpha*global_reward + local_weight*local_reward", group="rewards and advantages")
    local_weight: float | None = _s(None, "weight of the local (own-action) reward", group="rewards and advantages")
    group_by: tuple[str, ...] | None = _s(
        None,
        "columns added to uid+strategy to form advantage groups (a group never spans strategies; none = plain GRPO per strategy)",
        group="rewards and advantages",
        metavar="COL",
    )
    normalize: str | None = _s(
        None, "advantage normalisation: (r-mean)/std, or r-mean", group="rewards and advantages", choices=("std", "center")
    )
    baseline: str | None = _s(
        None,
        "advantage baseline: the statistics of the problem's group of samples (GRPO), or of the whole round's rows of that strategy "
        "(REINFORCE with a mean-reward baseline: all-right groups still count)",
        group="rewards and advantages",
        choices=("group", "batch"),
    )
    trajectory_mean: bool | None = _s(
        None, "group statistics over trajectory means (one member per trajectory)", group="rewards and advantages"
    )
    trajectory_score: str | None = _s(
        None,
        "with trajectory_mean: each row scored by its own reward (own) or by its trajectory's mean (mean, as DrMAS's code)",
        group="rewards and advantages",
        choices=("own", "mean"),
    )

    # --- training ---------------------------------------------------------------------------
    loss: str | None = _s(
        None,
        "rs: rejection-sampling expert iteration; ppo: importance-weighted PG with PPO clip; is: per-token importance sampling, no clip "
        "(not the plan's estimator); exit: the expert-iteration plan's estimator (sequence likelihood ratio per row, mean over rows, "
        "no mask)",
        group="training",
        choices=LOSS_KINDS,
    )
    anchor: str = _s(
        _default(LossConfig, "anchor"),
        "what the PPO clip compares with: the sampling logprobs q, or the policy at the start of the round's update (proximal: decoupled PPO)",
        group="training",
        choices=("sampling", "proximal"),
    )
    sequence_ratio: str | None = _s(
        None,
        "every row's sequence ratio (the geometric mean of its token ratios p_train/q): rows outside [1/3, 3] masked (zeroed, still "
        "counted in the mean), rows above 3 truncated to it, or left alone (the token clip only); --hinted-rows and --feedback-rows "
        "set their strategies' rows apart",
        group="training",
        choices=("mask", "truncate", "none"),
    )
    hinted_rows: str | None = _s(
        None,
        "the prompt-augmentation rows (sampled with a hint, trained without): their sequence ratio masked to [1/3, 3], truncated at 3, "
        "left alone, or the rows dropped from training",
        group="training",
        choices=("mask", "truncate", "none", "drop"),
    )
    zero_advantage_rows: str | None = _s(
        None,
        "rows of zero advantage (all of a group's samples got one reward): dropped from the training view, or kept, so that a "
        "minibatch counts every sample as verl's token mean, the expert-iteration plan's 1/N and TRL's GRPOTrainer do (their loss "
        "is 0: the trainer skips their forward pass; they set how many rows make an optimizer step and the mean's denominator)",
        group="training",
        choices=("drop", "keep"),
    )
    feedback_rows: str | None = _s(
        None,
        "the feedback strategy's second-attempt rows (trained without the feedback): their sequence ratio masked to [1/3, 3], truncated at 3, "
        "or left alone",
        group="training",
        choices=("mask", "truncate", "none"),
    )
    dual_clip: float | None = _s(
        None,
        "ppo: verl's dual clip (DrMAS): a negative-advantage token's loss is at most -dual_clip*A (verl's clip_ratio_c); 0 = off",
        group="training",
    )
    clip_low: float | None = _s(
        None, "ppo: token ratios below 1 - clip_low stop the gradient of negative-advantage tokens (TRL's epsilon)", group="training"
    )
    clip_high: float | None = _s(
        None,
        "ppo: token ratios above 1 + clip_high stop the gradient of positive-advantage tokens (TRL's epsilon_high)",
        group="training",
    )
    lr: float | None = _s(None, "AdamW learning rate", group="training")
    epochs: int = _s(_default(TrainConfig, "epochs"), "passes over each round's training rows", group="training")
    minibatch_size: int = _s(_default(TrainConfig, "minibatch_size"), "rows per optimizer step", group="training")
    micro_batch_size: int = _s(_default(TrainConfig, "micro_batch_size"), "rows per forward/backward pass", group="training")
    balance_verdicts: bool | None = _s(
        None,
        "equal total weight for the yes and no rows of an agent that gives verdicts (the math Verifier) each round (it rescales "
        "rows after the advantages: under a policy gradient the groups' advantages would no longer sum to 0)",
        group="training",
    )
    relabel_verdicts: bool = _s(
        _default(ViewConfig, "relabel_verdicts"),
        "rs loss: train every Verifier row on the right verdict (a wrong verdict's row gets the other verdict) instead of only the rows it got right",
        group="training",
    )
    verifier_replay: int = _s(
        _default(ViewConfig, "verifier_replay"),
        "train the Verifier on its calls of the last N rounds (this one included), each labelled by the reward with the right verdict, "
        "one row per distinct prompt, yes/no balanced, by their NLL under every loss; 0 = its own rows of this round only",
        group="training",
        metavar="N",
    )
    negative_weight: float | None = _s(
        None, "ppo/is/exit: negative advantages are multiplied by this (1 = the plain policy gradient, 0 = the positive half only)", group="training"
    )
    strategy_weights: tuple[str, ...] | None = _s(
        None,
        "stratified mixture weights STRATEGY=W: each row scaled by w_s/n_s, n_s the rows strategy s sampled for the policy to train "
        "(before the zero-advantage and reward filters), normalised so those rows' weights average 1 (none: every row weighs 1)",
        group="training",
        metavar="S=W",
    )
    lora: bool = _s(
        False,
        "train LoRA adapters (peft) instead of all weights: a checkpoint is an adapter on the starting model; with separate policies each agent is "
        "its own adapter on one shared base, served by one vLLM engine with LoRA requests",
        group="training",
    )
    lora_rank: int = _s(_default(LoraSettings, "r"), "LoRA rank r (with --lora)", group="training")
    lora_alpha: float = _s(_default(LoraSettings, "alpha"), "LoRA scaling alpha (with --lora; the update is scaled by alpha / r)", group="training")
    gradient_checkpointing: str = _s(
        {v: k for k, v in _CHECKPOINTING.items()}[_default(TrainConfig, "gradient_checkpointing")],
        "recompute activations in the backward pass (less memory, ~30% more time); auto = on for models above 50M parameters",
        group="training",
        choices=("auto", "on", "off"),
    )
    group_minibatches: bool = _s(
        _default(TrainConfig, "group_minibatches"),
        "keep the samples of one prompt (a GRPO group) in one minibatch, the groups shuffled each epoch; off: every row shuffled on its own",
        group="training",
    )
    optimizer_state: str = _s(
        _default(TrainConfig, "optimizer_state"),
        "fresh: a new AdamW every round; carry: its moments and step count continue from the parent checkpoint's "
        "(optimizer.pt in each checkpoint), one optimizer over the run as in TRL and verl",
        group="training",
        choices=("fresh", "carry"),
    )
    micro_batch_tokens: int | None = _s(
        _default(TrainConfig, "micro_batch_tokens"),
        "token budget of a micro-batch (rows x longest row): long rows get fewer rows per forward pass, same optimizer step; None = always micro_batch_size rows",
        group="training",
    )
    train_on: str = _s(
        _default(RunConfig, "train_on"), "rollouts (expert iteration) or ground_truth (the step-matched SFT baseline)", group="training", choices=("rollouts", "ground_truth")
    )

    # --- scale-out --------------------------------------------------------------------------
    shards: int = _s(
        1,
        "rollout shards per round: problems split by a stable hash of uid, each shard its own Dagster step and engine; "
        "above 1 the round runs on Dagster's multiprocess executor (one process per shard); the rows do not depend on it",
        group="scale-out",
    )
    tensor_parallel_size: int = _s(1, "GPUs each vLLM engine splits its layers over (vLLM's tensor_parallel_size; planned: untested without GPUs)", group="scale-out")
    data_parallel_size: int = _s(1, "engine replicas behind each vLLM engine (vLLM's data_parallel_size; planned: untested without GPUs)", group="scale-out")
    train_processes: int = _s(
        1, "trainer processes under `accelerate launch` (1: in-process; more: planned, `maxit train --processes N` only)", group="scale-out"
    )
    fsdp: str = _s(
        "off",
        "FSDP sharding of the trainer under accelerate launch (planned: untested without GPUs)",
        group="scale-out",
        choices=("off", "full_shard", "shard_grad_op", "hybrid_shard"),
    )

    # --- evaluation -------------------------------------------------------------------------
    eval_problems: int = _s(_default(EvalConfig, "problems"), "held-out problems evaluated after every round (the same ones each round)", group="evaluation")
    eval_samples: int = _s(_default(EvalConfig, "samples"), "Solver samples per held-out problem", group="evaluation")
    eval_max_tokens: int | None = _s(
        _default(EvalConfig, "max_tokens"), "completion budget of the evaluation's Solver and Verifier calls; None = the task's default (arithmetic 16, task file 512)", group="evaluation"
    )
    base_eval_cache: bool = _s(
        _default(EvalConfig, "reuse_base"),
        "reuse the starting model's evaluation (round -1) computed by an earlier run with the same model, task, evaluation, engine and code",
        group="evaluation",
        negative_flag=("--no-base-eval-cache", "evaluate the starting model afresh (round -1), not from the cache, and leave the cache alone"),
    )

    report_to: tuple[str, ...] = _s(
        (),
        "experiment trackers every finished round is logged to, offline and inside the store: tensorboard, mlflow, wandb "
        "(several allowed; docs/TRACKING.md); the store stays the record",
        group="evaluation",
        metavar="TRACKER",
    )

    def __post_init__(self) -> None:
        if self.algorithm not in ALGORITHMS:
            raise ConfigError(f"algorithm must be one of {list(ALGORITHMS)}, got {self.algorithm!r}")
        for name, value in ALGORITHM_PRESETS[self.algorithm].items():  # what is left unset follows the algorithm
            if getattr(self, name) is None:
                object.__setattr__(self, name, value)
        if self.clip_low is None:
            object.__setattr__(self, "clip_low", _default(LossConfig, "eps_low"))
        for f in fields(self):
            choices = f.metadata.get("choices")
            value = getattr(self, f.name)
            if choices and value not in choices and not (value is None and f.default is None):
                raise ConfigError(f"{f.name} must be one of {list(choices)}, got {value!r}")
        if not (isinstance(self.clip_low, (int, float)) and 0 <= self.clip_low < 1):
            raise ConfigError(f"clip_low must be in [0, 1) (token ratios below 1 - clip_low stop the gradient), got {self.clip_low!r}")
        if self.clip_high is not None and not (isinstance(self.clip_high, (int, float)) and 0 <= self.clip_high < float("inf")):
            raise ConfigError(f"clip_high must be a finite number >= 0, got {self.clip_high!r}")
        for name in ("strategies", "group_by", "strategy_weights"):
            value = getattr(self, name)
            if isinstance(value, str):
                raise ConfigError(f"{name} must be a sequence of names, got the string {value!r}")
            object.__setattr__(self, name, tuple(value))

    # -- the loss's presets -----------------------------------------------------------------
    def reward_mix(self) -> tuple[float, float]:
        """(alpha, local_weight): the settings, or the loss's preset where they are None."""
        return float(self.preset("alpha")), float(self.preset("local_weight"))

    def preset(self, name: str):
        """The setting `name`, or the loss's preset where it is None."""
        value = getattr(self, name)
        return LOSS_PRESETS[self.loss][name] if value is None else value

    def preset_values(self) -> dict[str, Any]:
        """The value in effect of every setting that defaults to the loss's preset (what the run
        used, whatever the preset says later: `experiment.json` records it as `effective`)."""
        return {name: self.preset(name) for name in LOSS_PRESETS[self.loss]}

    def learning_rate(self) -> float:
        """The `lr` setting, or the loss's preset where it is None."""
        return float(self.preset("lr"))

    def advantage_config(self) -> AdvantageConfig:
        alpha, local_weight = self.reward_mix()
        group_by = parse_group_by(self.group_by)
        return AdvantageConfig(
            group_by=group_by,
            normalize=self.normalize,
            baseline=self.preset("baseline"),
            trajectory_mean=self.trajectory_mean,
            trajectory_score=self.trajectory_score,
            alpha=alpha,
            local_weight=local_weight,
        )

    def view_config(self) -> ViewConfig:
        """The loss's view (`ViewConfig.for_loss`: which rows it trains, verdicts balanced for
        "rs" only) with the view settings over it."""
        rs = self.loss == "rs"
        over = {} if self.balance_verdicts is None else {"balance_verdicts": self.balance_verdicts}
        if self.zero_advantage_rows is not None:
            over["drop_zero_advantage"] = self.zero_advantage_rows == "drop"
        return ViewConfig.for_loss(
            self.loss_config(),
            relabel_verdicts=self.relabel_verdicts and rs,
            strategy_weights=parse_weights(self.strategy_weights) if self.strategy_weights else None,
            drop_strategies=("prompt_aug",) if self.hinted_rows == "drop" else (),
            verifier_replay=self.verifier_replay,
            **over,
        )

    def loss_config(self) -> LossConfig:
        # every row's sequence-ratio handling: the setting, or the kind's own where it is unset or
        # the same (LossConfig's default: "mask" for ppo/is, "none" for exit); the hinted and
        # feedback rows follow it unless their own setting says otherwise
        kind_default = LossConfig(kind=self.loss).ratio
        base = kind_default.mode if self.sequence_ratio is None else self.sequence_ratio
        ratio = None if base == kind_default.mode else RatioConfig(mode=base)
        by_strategy = {
            sid: RatioConfig(mode=mode)
            for sid, mode in (("prompt_aug", self.hinted_rows), ("feedback", self.feedback_rows))
            if mode not in (None, "drop", base)
        }
        return LossConfig(
            kind=self.loss,
            dual_clip=float(self.dual_clip) if self.dual_clip else None,
            anchor=self.anchor,
            ratio=ratio,
            ratio_by_strategy=by_strategy,
            negative_weight=float(self.preset("negative_weight")),
            eps_low=float(self.clip_low),
            eps_high=float(self.preset("clip_high")),
        )

    def train_config(self) -> TrainConfig:
        return TrainConfig(
            lr=self.learning_rate(),
            epochs=self.epochs,
            minibatch_size=self.minibatch_size,
            micro_batch_size=self.micro_batch_size,
            temperature=self.temperature,
            loss=self.loss_config(),
            lora=self.lora_settings(),
            gradient_checkpointing=_CHECKPOINTING[self.gradient_checkpointing],
            micro_batch_tokens=self.micro_batch_tokens,
            optimizer_state=self.optimizer_state,
            group_minibatches=self.group_minibatches,
            dtype=self.dtype,
            report_to="none",
        )

    def lora_settings(self) -> LoraSettings | None:
        return LoraSettings(r=self.lora_rank, alpha=self.lora_alpha) if self.lora else None

    def eval_config(self) -> EvalConfig:
        return EvalConfig(problems=self.eval_problems, samples=self.eval_samples, max_tokens=self.eval_max_tokens, reuse_base=self.base_eval_cache)

    def strategy_options(self) -> dict[str, dict[str, Any]]:
        return {"feedback": {"train_context": self.feedback_train_context, "first_attempt": self.feedback_first_attempt}}

    def check(self) -> None:
        """Combinations that would silently train the wrong rows are errors."""
        alpha, local_weight = self.reward_mix()
        if self.loss == "rs" and (alpha, local_weight) != (0.0, 1.0):
            raise ConfigError(
                f"loss 'rs' trains the rows whose own action was right, judged by the reward; with alpha={alpha} and "
                f"local_weight={local_weight} the reward is not the row's own correctness (a wrong first attempt of a "
                "trajectory that later succeeds would be fine-tuned on): leave alpha and local_weight unset with --loss rs"
            )
        if self.relabel_verdicts and self.loss != "rs":
            raise ConfigError(
                f"relabel_verdicts trains Verifier rows on a verdict they did not sample, which has no sampling logprob "
                f"for the importance ratio of loss {self.loss!r}: use it with --loss rs"
            )

    def source_notes(self) -> list[str]:
        """A line for each strategy of these settings that the algorithm's source does not sample
        (`unsourced_strategies`)."""
        return unsourced_strategies(self.algorithm, self.strategies, self.reward_mix()[0])

    def run_config(self) -> RunConfig:
        """The `RunConfig` of these settings (validated: a bad value raises `ConfigError` naming
        it: by its setting's flag where the config field is a setting, e.g. `--eval-problems` for
        `EvalConfig.problems`)."""
        self.check()
        try:
            return self._run_config()
        except ConfigError as err:
            raise ConfigError(self.flag_named(str(err))) from None

    def flag_named(self, message: str) -> str:
        """`message` with its leading "<Config>.<field>" replaced by the flag of the setting that
        field is made from (the same name, or `eval_<name>` for `EvalConfig`); unchanged otherwise."""
        import re

        found = re.match(r"(RunConfig|EvalConfig|TrainConfig|LossConfig|AdvantageConfig|ViewConfig)\.([a-z_]+)\b", message)
        if found is None:
            return message
        cls, name = found.groups()
        names = {f.name for f in fields(self)}
        for candidate in ((f"eval_{name}", name) if cls == "EvalConfig" else (name,)):
            if candidate in names:
                return setting_flag(candidate) + message[found.end():]
        return message

    def _run_config(self) -> RunConfig:
        return RunConfig(
            workflow=self.workflow,
            workflow_options=parse_options(self.workflow_options),
            task=self.task,
            task_file=self.task_file,
            prompt_file=self.prompt_file,
            model_dir=self.model_dir,
            shared_policy=self.shared_policy,
            engine=self.engine,
            problems=self.problems,
            samples=self.samples,
            strategies=self.strategies,
            strategy_options=self.strategy_options(),
            temperature=self.temperature,
            max_tokens=self.max_tokens,
            max_loop_num=self.max_loop_num,
            seed=self.seed,
            advantage=self.advantage_config(),
            view=self.view_config(),
            train=self.train_config(),
            train_on=self.train_on,
            evaluation=self.eval_config(),
        )


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


def parse_group_by(values: Sequence[str] | None, default: tuple[str, ...] = ("agent_id", "turn")) -> tuple[str, ...]:
    """`--group-by` values: None = `default`; `none` or nothing = () (plain GRPO groups)."""
    if values is None:
        return tuple(default)
    values = tuple(values)
    return () if values in (("none",), ()) else values


def parse_options(items: Sequence[str]) -> dict[str, Any]:
    """KEY=VALUE items -> {key: value}, with integers, floats and true/false parsed; a malformed
    item is a `ConfigError` naming it."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, text = str(item).partition("=")
        if not sep or not key.isidentifier():
            raise ConfigError(f"workflow options take KEY=VALUE with a Python name as KEY, got {item!r}")
        value: Any = text
        if text.lower() in ("true", "false"):
            value = text.lower() == "true"
        else:
            for kind in (int, float):
                try:
                    value = kind(text)
                    break
                except ValueError:
                    pass
        out[key] = value
    return out


def parse_weights(items: Sequence[str]) -> dict[str, float]:
    """STRATEGY=WEIGHT items -> {strategy: weight}; a malformed item is a `ConfigError` naming it."""
    weights: dict[str, float] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise ConfigError(f"strategy weights take STRATEGY=WEIGHT, got {item!r}")
        try:
            weights[name] = float(value)
        except ValueError:
            raise ConfigError(f"strategy weight {item!r}: {value!r} is not a number") from None
    return weights


def setting_default(name: str):
    """The default of one setting, with the default algorithm's presets filled in."""
    if name not in {f.name for f in fields(Settings)}:
        raise KeyError(name)
    return getattr(Settings(), name)


# -- the command line ---------------------------------------------------------------------------


def _hints() -> dict[str, Any]:
    return typing.get_type_hints(Settings)


def _unoptional(hint):
    """`X | None` -> X (a setting whose None means "the preset" takes X on the command line)."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if typing.get_origin(hint) in (typing.Union, types.UnionType) and len(args) == 1 else hint


def _scalar_type(hint) -> type:
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if args else hint


def setting_flag(name: str) -> str:
    """The command-line flag of the setting `name` (`eval_problems` -> `--eval-problems`; a
    boolean's negative flag is in its field's metadata)."""
    return "--" + name.replace("_", "-")


_UNSET_MEANS = {
    "clip_low": f"{_default(LossConfig, 'eps_low'):g}",
    "dual_clip": "off",
    "sequence_ratio": "the loss's (mask; exit: none)",
    "hinted_rows": "as --sequence-ratio",
    "feedback_rows": "as --sequence-ratio",
    "zero_advantage_rows": "the loss's (rs: kept if rewarded; others: dropped)",
    "balance_verdicts": "the loss's (rs: on; others: off)",
}
"""What a setting an algorithm leaves unset comes to, for the settings no loss presets."""


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, tuple):
        return " ".join(value) or "none"
    return str(value)


def preset_summary(name: str) -> str | None:
    """What each algorithm sets the setting `name` to, as its help says it ("drmas, atgrpo, grpo:
    1; exit: 0; maxit: the loss's (rs 0, ppo 0, is 1, exit 1)"), from the presets themselves; None
    for a setting that no algorithm and no loss presets."""
    if not (any(name in preset for preset in ALGORITHM_PRESETS.values()) or name in LOSS_PRESETS["rs"]):
        return None
    by_text: dict[str, list[str]] = {}
    for algorithm in ALGORITHMS:
        value = ALGORITHM_PRESETS[algorithm].get(name)
        if value is not None:
            text = _shown(value)
        elif name in LOSS_PRESETS["rs"]:
            text = "the loss's (" + ", ".join(f"{loss} {_shown(LOSS_PRESETS[loss][name])}" for loss in LOSS_KINDS) + ")"
        else:
            text = _UNSET_MEANS[name]
        by_text.setdefault(text, []).append(algorithm)
    if len(by_text) == 1:
        return next(iter(by_text))
    return "; ".join(f"{', '.join(algorithms)}: {text}" for text, algorithms in by_text.items())


def setting_help(name: str) -> str:
    """The help text of the setting `name`, with what each algorithm sets it to where they do."""
    meta = {f.name: f.metadata for f in fields(Settings)}[name]
    summary = preset_summary(name)
    return meta["help"] if summary is None else f"{meta['help']} (default by --algorithm: {summary})"


def add_setting_flags(parser: argparse.ArgumentParser, groups: Sequence[str] | None = None, names: Sequence[str] = ()) -> None:
    """One flag per setting (of the named groups, and the settings named in `names`; groups None
    = all): `--name-with-dashes`; booleans get `--x` / `--no-x` (or their own negative flag);
    sequences take several values. Defaults are left unset (None) so that `settings_from_args`
    can tell a flag given from one left alone."""
    hints = _hints()
    arg_groups: dict[str, argparse._ArgumentGroup] = {}
    for f in fields(Settings):
        meta = f.metadata
        if groups is not None and meta["group"] not in groups and f.name not in names:
            continue
        g = arg_groups.get(meta["group"]) or arg_groups.setdefault(meta["group"], parser.add_argument_group(meta["group"]))
        flag = setting_flag(f.name)
        hint = _unoptional(hints[f.name])  # None ("the preset") is the unset flag's value
        if preset_summary(f.name) is not None:
            help_text = setting_help(f.name)
        else:
            help_text = f"{meta['help']} (default: {' '.join(f.default) if isinstance(f.default, tuple) else f.default})"
        help_text = help_text.replace("%", "%%")  # argparse formats help with %: a literal "30%" must not break --help
        if hint is bool:
            if meta["negative_flag"]:
                flag_name, flag_help = meta["negative_flag"]
                g.add_argument(flag_name, dest=f.name, action="store_false", default=None, help=flag_help)
            else:
                g.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction, default=None, help=help_text)
        elif typing.get_origin(hint) is tuple:
            g.add_argument(flag, dest=f.name, nargs="*" if f.name == "group_by" else "+", default=None, metavar=meta["metavar"], help=help_text)
        else:
            g.add_argument(flag, dest=f.name, type=_scalar_type(hint), choices=meta["choices"], default=None, metavar=meta["metavar"], help=help_text)


def settings_from_args(args: argparse.Namespace, **overrides) -> Settings:
    """The `Settings` of parsed flags: flags left alone keep the setting's default."""
    values = {f.name: getattr(args, f.name) for f in fields(Settings) if getattr(args, f.name, None) is not None}
    values.update(overrides)
    return Settings(**values)


def settings_fields() -> list[tuple[str, Any, Any, str]]:
    """(name, type hint, default, help) of every setting, in order (for the Dagster resource)."""
    hints = _hints()
    return [(f.name, hints[f.name], f.default if f.default is not MISSING else None, setting_help(f.name)) for f in fields(Settings)]
