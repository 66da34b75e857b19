"""The run's settings for the command line and the Dagster launchpad.

`Settings` is a flat, frozen record of every knob a user sets for an expert-iteration run: its
name, type, default, choices and help text, which make `maxit run`'s flags (`add_setting_flags`)
and the launchpad's fields (`assets.config.RunSettings`). It is a thin layer over the library's
config tree (`pipeline.config`), which holds the rest: a setting's default and choices are the
ones its config declares; the algorithms' and losses' presets are `pipeline.config.presets`;
where each setting goes in the tree is `pipeline.config.flat`; and the rules across settings are
checked by the configs when they are built. `Settings(...).run_config()` is
`RunConfig.for_algorithm(algorithm, **settings)`, so `Settings().run_config() == RunConfig()`,
with a config's error reported by the flag of the setting it came from (`--problems must be ...`).

Settings that an algorithm or a loss presets default to None, which means "the preset's"; the
algorithm's values are filled in when `Settings` is built (so `Settings(algorithm="drmas").loss`
is "ppo"), the loss's where a config is made (`preset`).
"""

from __future__ import annotations

import argparse
import re
import typing
from contextlib import contextmanager
from dataclasses import MISSING, dataclass, fields, is_dataclass
from functools import lru_cache
from typing import Any, Mapping

from pipeline.config import AdvantageConfig, EvalConfig, RunConfig, ScaleConfig, TrackingConfig, ViewConfig, flat
from pipeline.config.flat import CHECKPOINTING, ZERO_ADVANTAGE_ROWS, parse_group_by, parse_options, parse_weights
from pipeline.config.presets import ALGORITHM_PRESETS, ALGORITHMS, LOSS_KINDS, LOSS_PRESETS, SOURCES, unsourced_strategies
from pipeline.config.presets import config_default as _default
from pipeline.config.train import LoraSettings, LossConfig, RatioConfig, TrainConfig
from pipeline.errors import ConfigError
from pipeline.run.setting_meta import _choices, _field_type, _s, _unoptional, preset_summary
from pipeline.strategies import Feedback

__all__ = [
    "Settings", "LOSS_PRESETS", "ALGORITHMS", "ALGORITHM_PRESETS", "add_setting_flags", "setting_flag", "setting_help", "preset_summary",
    "unsourced_strategies", "SOURCES", "settings_from_args", "workflow_defaults", "setting_default", "parse_group_by", "parse_options", "parse_weights",
]


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
        "the team and its environment (pipeline.workflows): math (Solver + Verifier), math_review (a Verifier shown the "
        "Solver's answer), single (the Solver alone), grid (a planner and a mover in a maze), plan_path (a tool agent's "
        "path run by the environment, a plan agent that commits), code (a Coder and a Tester, sandboxed), reasoning_gym "
        "(a reasoning-gym dataset), tic_tac_toe and bargaining (OpenSpiel games in self-play), program:FILE.py:FUNC (a "
        "program of OpenAI API calls), a module:Name or file.py:Name path, or a maxit.workflows entry point",
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
    engine: str = _s(_default(RunConfig, "engine"), "rollout engine: vllm, hf, or auto (vLLM when importable)", group="team and task", choices=_choices(RunConfig, "engine"))
    dtype: str = _s(
        _default(TrainConfig, "dtype"),
        "precision of the engines and of training (bf16 autocast over float32 weights): auto = bfloat16 on a GPU, and on a CPU with "
        "native bf16 (avx512_bf16 or amx_bf16 in /proc/cpuinfo) for models of 20M parameters or more; float32 elsewhere and for the "
        "tiny default model (faster there, and sampled logprobs match training's)",
        group="team and task",
        choices=_choices(TrainConfig, "dtype"),
    )

    # --- sampling ---------------------------------------------------------------------------
    problems: int = _s(
        _default(RunConfig, "problems"),
        "training problems drawn per round (a workflow may run with its own when the flag is left out: tic_tac_toe 256; maxit run says so)",
        group="sampling",
    )
    samples: int = _s(
        _default(RunConfig, "samples"),
        "group size of every strategy (tree: candidates per node; a workflow may run with its own when the flag is left out: tic_tac_toe 8)",
        group="sampling",
    )
    strategies: tuple[str, ...] | None = _s(None, "search strategies interleaved in each round", group="sampling", metavar="STRATEGY")
    temperature: float = _s(_default(RunConfig, "temperature"), "sampling temperature (training computes p_train at the same temperature)", group="sampling")
    max_tokens: int | None = _s(_default(RunConfig, "max_tokens"), "completion budget of each agent call in rollouts; None = the task's default (arithmetic 16, task file 512)", group="sampling")
    max_loop_num: int | None = _s(
        _default(RunConfig, "max_loop_num"), "turns at most per episode (math: Solver/Verifier loops per sample, DrMAS's max_loop_num); None = the workflow's (math 2)", group="sampling"
    )
    seed: int = _s(_default(RunConfig, "seed"), "seed of the problem draws and of sampling (each round derives its own)", group="sampling")
    problem_replay: float = _s(
        _default(RunConfig, "problem_replay"),
        "share of each round's training problems drawn again from earlier rounds' problems whose unhinted first attempts failed most "
        "(the lowest success first); 0 = every problem fresh", group="sampling",
    )
    start_from: str = _s(
        _default(RunConfig, "start_from"),
        "the checkpoint each round starts from: the last round's, or the best evaluated round's (the mean of the workflow's higher-is-better table metrics; "
        "selecting on the held-out split makes its later figures optimistic)", group="sampling", choices=_choices(RunConfig, "start_from"),
    )
    max_staleness: int = _s(
        _default(RunConfig, "max_staleness"),
        "rounds the rollouts may run ahead of training: round r samples while round r-1 trains, with a checkpoint at most K rounds "
        "older than round r-1's (--staleness-schedule); 0 = synchronous rounds", group="sampling",
    )
    staleness_schedule: str = _s(
        _default(RunConfig, "staleness_schedule"),
        "with --max-staleness K: bound, the freshest checkpoint registered when the round's sampling starts (at most K rounds old); "
        "exact, round r-1-K's always (rows that do not depend on the lanes' speed). The choice is recorded per round; a resume repeats it",
        group="sampling", choices=_choices(RunConfig, "staleness_schedule"),
    )
    max_row_staleness: int | None = _s(
        _default(RunConfig, "max_row_staleness"),
        "version threshold: trained rows sampled more than this many rounds before the checkpoint they train are weighted by "
        "--stale-row-weight (replayed rows too); None = no threshold", group="training",
    )
    stale_row_weight: float = _s(
        _default(RunConfig, "stale_row_weight"), "weight factor of the rows over --max-row-staleness (0 = dropped)", group="training",
    )
    feedback_train_context: str | None = _s(
        None, "training context of the feedback strategy's second attempt: the problem only, or problem + first attempt", group="sampling", choices=_choices(Feedback, "train_context")
    )
    feedback_first_attempt: str | None = _s(
        None, "the feedback strategy's first attempt: trained as an iid row, or not trained (the plan's weight 0)", group="sampling", choices=_choices(Feedback, "first_attempt")
    )

    # --- rewards and advantages -------------------------------------------------------------
    alpha: float | None = _s(None, "reward = alpha*global_reward + local_weight*local_reward", group="rewards and advantages")
    local_weight: float | None = _s(None, "weight of the local (own-action) reward", group="rewards and advantages")
    group_by: tuple[str, ...] | None = _s(
        None, "columns added to uid+strategy to form advantage groups (a group never spans strategies; none = plain GRPO per strategy)", group="rewards and advantages", metavar="COL"
    )
    normalize: str | None = _s(None, "advantage normalisation: (r-mean)/std, or r-mean", group="rewards and advantages", choices=_choices(AdvantageConfig, "normalize"))
    baseline: str | None = _s(
        None,
        "advantage baseline: the statistics of the problem's group of samples (GRPO), or of the whole round's rows of that strategy "
        "(REINFORCE with a mean-reward baseline: all-right groups still count), or a running mean of the reward per role over the "
        "rounds (role: SPIRAL's role-conditioned baseline, for self-play games)",
        group="rewards and advantages",
        choices=_choices(AdvantageConfig, "baseline"),
    )
    trajectory_mean: bool | None = _s(None, "group statistics over trajectory means (one member per trajectory)", group="rewards and advantages")
    trajectory_score: str | None = _s(
        None,
        "with trajectory_mean: each row scored by its own reward (own) or by its trajectory's mean (mean, as DrMAS's code)",
        group="rewards and advantages",
        choices=_choices(AdvantageConfig, "trajectory_score"),
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
        choices=_choices(LossConfig, "anchor"),
    )
    off_policy_correction: str = _s(
        _default(LossConfig, "correction"),
        "staleness correction from the behaviour weight p_old/q (p_old: the policy at the start of the round's update): the row's "
        "product truncated at --correction-cap (tis), each token's (token-tis), or rows masked outside [--correction-low, --correction-cap] "
        "by the product (seq-mask) or its geometric mean (geo-mask); the update ratio becomes p_theta/p_old (docs/ALGORITHMS.md#staleness-corrections)",
        group="training",
        choices=_choices(LossConfig, "correction"),
    )
    correction_cap: float = _s(_default(LossConfig, "correction_cap"), "C of --off-policy-correction: the truncation point, the masks' upper bound (verl's 2)", group="training")
    correction_low: float | None = _s(None, "lower bound of the masks of --off-policy-correction (unset: 1/--correction-cap)", group="training")
    sequence_ratio: str | None = _s(
        None,
        "every row's sequence ratio (the geometric mean of its token ratios p_train/q): rows outside [1/3, 3] masked (zeroed, still "
        "counted in the mean), rows above 3 truncated to it, or left alone (the token clip only); --hinted-rows and --feedback-rows "
        "set their strategies' rows apart",
        group="training",
        choices=_choices(RatioConfig, "mode"),
    )
    hinted_rows: str | None = _s(
        None,
        "the prompt-augmentation rows (sampled with a hint, trained without): their sequence ratio masked to [1/3, 3], truncated at 3, "
        "left alone, or the rows dropped from training",
        group="training",
        choices=(*_choices(RatioConfig, "mode"), "drop"),
    )
    zero_advantage_rows: str | None = _s(
        None,
        "rows of zero advantage (all of a group's samples got one reward): dropped from the training view, or kept, so that a "
        "minibatch counts every sample as verl's token mean, the expert-iteration plan's 1/N and TRL's GRPOTrainer do (their loss "
        "is 0: the trainer skips their forward pass; they set how many rows make an optimizer step and the mean's denominator)",
        group="training",
        choices=ZERO_ADVANTAGE_ROWS,
    )
    feedback_rows: str | None = _s(
        None,
        "the feedback strategy's second-attempt rows (trained without the feedback): their sequence ratio masked to [1/3, 3], truncated at 3, "
        "or left alone",
        group="training",
        choices=_choices(RatioConfig, "mode"),
    )
    dual_clip: float | None = _s(
        None, "ppo: verl's dual clip (DrMAS): a negative-advantage token's loss is at most -dual_clip*A (verl's clip_ratio_c); 0 = off", group="training"
    )
    clip_low: float | None = _s(None, "ppo: token ratios below 1 - clip_low stop the gradient of negative-advantage tokens (TRL's epsilon)", group="training")
    clip_high: float | None = _s(None, "ppo: token ratios above 1 + clip_high stop the gradient of positive-advantage tokens (TRL's epsilon_high)", group="training")
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
        _default(TrainConfig, "lora") is not None,
        "train LoRA adapters (peft) instead of all weights: a checkpoint is an adapter on the starting model; with separate policies each agent is "
        "its own adapter on one shared base, served by one vLLM engine with LoRA requests",
        group="training",
    )
    lora_rank: int = _s(_default(LoraSettings, "r"), "LoRA rank r (with --lora)", group="training")
    lora_alpha: float = _s(_default(LoraSettings, "alpha"), "LoRA scaling alpha (with --lora; the update is scaled by alpha / r)", group="training")
    gradient_checkpointing: str = _s(
        {v: k for k, v in CHECKPOINTING.items()}[_default(TrainConfig, "gradient_checkpointing")],
        "recompute activations in the backward pass (less memory, ~30% more time); auto = on for models above 50M parameters",
        group="training",
        choices=tuple(CHECKPOINTING),
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
        choices=_choices(TrainConfig, "optimizer_state"),
    )
    micro_batch_tokens: int | None = _s(
        _default(TrainConfig, "micro_batch_tokens"),
        "token budget of a micro-batch (rows x longest row): long rows get fewer rows per forward pass, same optimizer step; None = always micro_batch_size rows",
        group="training",
    )
    lr_round_decay: float = _s(
        _default(TrainConfig, "lr_round_decay"), "learning rate across rounds: round r trains at lr * lr_round_decay^r; 1 = the same rate every round", group="training"
    )
    kl_beta: float = _s(
        _default(LossConfig, "beta"),
        "weight of a KL penalty (k3, on the trained tokens) to the checkpoint the round starts from: a trust region around the previous "
        "round's policy; 0 = off", group="training",
    )
    train_on: str = _s(
        _default(RunConfig, "train_on"), "rollouts (expert iteration) or ground_truth (the step-matched SFT baseline)", group="training", choices=_choices(RunConfig, "train_on")
    )

    # --- scale-out --------------------------------------------------------------------------
    shards: int = _s(
        _default(ScaleConfig, "shards"),
        "rollout shards per round: problems split by a stable hash of uid, each shard its own Dagster step and engine; "
        "above 1 the round runs on Dagster's multiprocess executor (one process per shard); the rows do not depend on it",
        group="scale-out",
    )
    executor: str = _s(
        _default(ScaleConfig, "executor"),
        "what runs the rollout shards: dagster (its own executor: one process per shard above 1) or ray (one Ray task per shard "
        "with its own engine, on --ray-address or a local Ray instance); the rows do not depend on it",
        group="scale-out",
        choices=_choices(ScaleConfig, "executor"),
    )
    ray_address: str | None = _s(
        _default(ScaleConfig, "ray_address"), "the Ray cluster of --executor ray (HOST:PORT or auto); None = a local Ray instance on 127.0.0.1", group="scale-out"
    )
    trainer_cores: str | None = _s(
        _default(ScaleConfig, "trainer_cores"),
        "with --max-staleness: the CPU cores the trainer's process is pinned to (e.g. 1, or 2-3); the sampler keeps the others. "
        "None = both share every core", group="scale-out",
    )
    tensor_parallel_size: int = _s(_default(ScaleConfig, "tensor_parallel_size"), "GPUs each vLLM engine splits its layers over (vLLM's tensor_parallel_size; planned: untested without GPUs)", group="scale-out")
    data_parallel_size: int = _s(_default(ScaleConfig, "data_parallel_size"), "engine replicas behind each vLLM engine (vLLM's data_parallel_size; planned: untested without GPUs)", group="scale-out")
    engine_devices: str | None = _s(
        None, "the accelerators (CUDA device indices, e.g. 0,1) the run's process and its engines see (CUDA_VISIBLE_DEVICES); "
        "None = every device", group="scale-out",
    )
    trainer_devices: str | None = _s(
        None, "the accelerators the trainer's own processes see (the trainer lane of --max-staleness, or torchrun's ranks of "
        "--train-processes; rank i takes the i-th); disjoint from --engine-devices", group="scale-out",
    )
    train_processes: int = _s(
        _default(ScaleConfig, "train_processes"), "processes that train each policy (1: in the step's own process; more: a torch.distributed process group started by torchrun, "
        "gloo on a CPU, NCCL with one GPU per process on CUDA; the update equals one process's, rank 0 writes the checkpoint)", group="scale-out"
    )
    fsdp: str = _s(
        _default(ScaleConfig, "fsdp"), "FSDP2 (fully_shard) sharding of each policy's model over its --train-processes: full_shard, shard_grad_op (parameters stay "
        "gathered between forward and backward), hybrid_shard (shards within a machine, replicas across machines); off: each process holds the whole model", group="scale-out", choices=_choices(ScaleConfig, "fsdp")
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
        _default(TrackingConfig, "report_to"),
        "experiment trackers every finished round is logged to, offline and inside the store: tensorboard, mlflow, wandb "
        "(several allowed; docs/TRACKING.md); the store stays the record",
        group="evaluation",
        metavar="TRACKER",
    )

    def __post_init__(self) -> None:
        # what is left unset follows the algorithm
        for name, value in flat.with_algorithm(self.algorithm, self.values()).items():
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
        for name in ("strategies", "group_by", "strategy_weights", "report_to", "workflow_options"):
            value = getattr(self, name)
            if isinstance(value, str):
                raise ConfigError(f"{name} must be a sequence of names, got the string {value!r}")
            if value is not None:
                object.__setattr__(self, name, tuple(value))

    def values(self) -> dict[str, Any]:
        """{setting: value} of every setting (None: left to the loss's preset)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

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

    # -- the stages' configs (each also part of `run_config()`) -------------------------------
    def in_effect(self) -> dict[str, Any]:
        """The settings with the loss's preset filled in (`pipeline.config.flat.resolve`)."""
        return flat.resolve(self.algorithm, self.values())

    def _build(self, make):
        """`make(self.in_effect())`, a config's error named by the settings' flags."""
        with flags_named():
            return make(self.in_effect())

    def advantage_config(self) -> AdvantageConfig:
        return self._build(flat.advantage_config)

    def loss_config(self) -> LossConfig:
        return self._build(flat.loss_config)

    def view_config(self) -> ViewConfig:
        return self._build(lambda values: flat.view_config(values, flat.loss_config(values)))

    def train_config(self) -> TrainConfig:
        return self._build(lambda values: flat.train_config(values, flat.loss_config(values)))

    def strategy_options(self) -> dict[str, dict[str, Any]]:
        return self._build(flat.strategy_options)

    def source_notes(self) -> list[str]:
        """A line for each strategy of these settings that the algorithm's source does not sample
        (`unsourced_strategies`)."""
        return unsourced_strategies(self.algorithm, self.strategies, self.reward_mix()[0])

    def run_config(self) -> RunConfig:
        """The `RunConfig` of these settings (`RunConfig.for_algorithm`), validated: a bad value
        or combination raises `ConfigError` naming each config field by the flag of the setting
        it is made from (`RunConfig.problems` -> `--problems`, `EvalConfig.problems` ->
        `--eval-problems`, `RunConfig.advantage.alpha` -> `--alpha`)."""
        with flags_named():
            return RunConfig.for_algorithm(**self.values())

    def flag_named(self, message: str) -> str:
        return flag_named(message)


@contextmanager
def flags_named():
    """A `ConfigError` raised inside is raised again with its config fields named by their
    settings' flags (`flag_named`), in one line, without the config's traceback."""
    try:
        yield
    except ConfigError as err:
        raise ConfigError(flag_named(str(err))) from None


_CONFIG_FIELD = re.compile(r"\b(RunConfig|[A-Z][A-Za-z]*(?:Config|Settings))((?:\.[a-z_]+)+)")
"""A config field named in an error: `RunConfig.advantage.alpha`, `EvalConfig.problems`."""


def flag_named(message: str) -> str:
    """`message` with each config field it names ("RunConfig.advantage.alpha", "EvalConfig.problems")
    replaced by the flag of the setting that field is made from (`--alpha`, `--eval-problems`);
    fields no setting makes are left as they are."""

    def flag(found: re.Match) -> str:
        parts = found.group(2).split(".")[1:]
        for end in range(len(parts), 0, -1):
            name = _settings_of_fields().get(".".join([found.group(1), *parts[:end]]))
            if name is not None:
                return setting_flag(name) + "".join("." + p for p in parts[end:])
        return found.group(0)

    return _CONFIG_FIELD.sub(flag, message)


@lru_cache(maxsize=1)
def _settings_of_fields() -> dict[str, str]:
    """{config field: setting}: each setting's paths from `RunConfig` (`RunConfig.train.loss.kind`)
    and the field of the config that declares it (`LossConfig.kind`)."""
    out: dict[str, str] = {}
    names = {f.name for f in fields(Settings)}
    for name, paths in flat.SETTING_PATHS.items():
        for path in paths if name in names else ():
            out.setdefault(f"RunConfig.{path}", name)
            owner, *parts = (RunConfig, *path.split("."))
            for part in parts[:-1]:  # down to the config that declares the last part
                owner = _field_type(owner, part) if is_dataclass(owner) and part in {f.name for f in fields(owner)} else None
            if owner is not None and is_dataclass(owner) and parts[-1] in {f.name for f in fields(owner)}:
                out.setdefault(f"{owner.__name__}.{parts[-1]}", name)
    return out


def setting_default(name: str):
    """The default of one setting, with the default algorithm's presets filled in."""
    if name not in {f.name for f in fields(Settings)}:
        raise KeyError(name)
    return getattr(Settings(), name)


# -- the command line ---------------------------------------------------------------------------


def _hints() -> dict[str, Any]:
    return typing.get_type_hints(Settings)


def _scalar_type(hint) -> type:
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if args else hint


def setting_flag(name: str) -> str:
    """The command-line flag of the setting `name` (`eval_problems` -> `--eval-problems`; a
    boolean's negative flag is in its field's metadata)."""
    return "--" + name.replace("_", "-")


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
    """The `Settings` of parsed flags: flags left alone keep the workflow's `run_defaults`
    (`workflow_defaults`), else the setting's default."""
    values = {f.name: getattr(args, f.name) for f in fields(Settings) if getattr(args, f.name, None) is not None}
    values.update(overrides)
    return Settings(**{**workflow_defaults(values), **values})


def workflow_defaults(values: Mapping[str, Any]) -> dict[str, Any]:
    """The `run_defaults` of the workflow `values` name (`Workflow.run_defaults`) that `values`
    leave unset: what `settings_from_args` fills in below the flags given. A default naming no
    setting, or one an algorithm or loss presets (those are the algorithm's), or the workflow
    itself, is a one-line `ConfigError` naming the workflow and the setting."""
    from pipeline.workflows import workflow_run_defaults

    spec = values.get("workflow", _default(RunConfig, "workflow"))
    if not isinstance(spec, str):
        return {}
    defaults = workflow_run_defaults(spec)
    allowed = {f.name for f in fields(Settings)} - flat.preset_names() - {"algorithm", "workflow", "workflow_options"}
    bad = [name for name in defaults if name not in allowed]
    if bad:
        raise ConfigError(
            f"workflow {spec!r}: run_defaults names {', '.join(map(repr, bad))}: a workflow may default a setting of `maxit run` "
            "that no algorithm presets (the budget, the evaluation's size...), not the algorithm's (the loss, strategies, reward mix)"
        )
    return {name: value for name, value in defaults.items() if name not in values}


def settings_fields() -> list[tuple[str, Any, Any, str]]:
    """(name, type hint, default, help) of every setting, in order (for the Dagster resource)."""
    hints = _hints()
    return [(f.name, hints[f.name], f.default if f.default is not MISSING else None, setting_help(f.name)) for f in fields(Settings)]
