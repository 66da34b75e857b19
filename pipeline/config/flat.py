"""A run's config from its flat settings: the names of `maxit run`'s flags (`alpha`, `lr`,
`clip_high`, `eval_problems`...), each put where the config tree declares it (`SETTING_PATHS`),
with the algorithm's preset and then the loss's (`pipeline.config.presets`) filling the settings
left unset.

`RunConfig.for_algorithm(algorithm, **settings)` is `RunConfig(**run_fields(algorithm,
settings))`; the CLI and the Dagster launchpad (`pipeline.run.settings.Settings`) go through it,
so a notebook, a flag and a launchpad field make one config. A preset's setting (one of
`ALGORITHM_PRESETS` or `LOSS_PRESETS`, or `clip_low`) given as None is left to the presets; any
other setting given as None is that value (`max_tokens=None`: the task's budget), and a setting
not given is its config's default.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from pipeline.config.presets import ALGORITHM_PRESETS, ALGORITHMS, LOSS_PRESETS, config_default
from pipeline.config.scale import ScaleConfig, TrackingConfig
from pipeline.config.stages import AdvantageConfig, EvalConfig, ViewConfig
from pipeline.config.train import LoraSettings, LossConfig, RatioConfig, TrainConfig
from pipeline.errors import ConfigError

__all__ = [
    "SETTING_PATHS", "CHECKPOINTING", "ZERO_ADVANTAGE_ROWS", "run_fields", "with_algorithm", "resolve", "preset_names",
    "advantage_config", "view_config", "loss_config", "train_config", "eval_config", "strategy_options",
    "parse_options", "parse_weights", "parse_group_by",
]

SETTING_PATHS: Mapping[str, tuple[str, ...]] = {
    # the team and the task
    "algorithm": ("algorithm",), "workflow": ("workflow",), "workflow_options": ("workflow_options",), "task": ("task",),
    "task_file": ("task_file",), "prompt_file": ("prompt_file",), "model_dir": ("model_dir",), "shared_policy": ("shared_policy",),
    "engine": ("engine",), "dtype": ("train.dtype",),
    # sampling
    "problems": ("problems",), "samples": ("samples",), "strategies": ("strategies",), "temperature": ("temperature", "train.temperature"),
    "max_tokens": ("max_tokens",), "max_loop_num": ("max_loop_num",), "seed": ("seed",),
    "problem_replay": ("problem_replay",), "start_from": ("start_from",),
    "max_staleness": ("max_staleness",), "staleness_schedule": ("staleness_schedule",), "max_row_staleness": ("max_row_staleness",), "stale_row_weight": ("stale_row_weight",),
    "feedback_train_context": ("strategy_options.feedback.train_context",), "feedback_first_attempt": ("strategy_options.feedback.first_attempt",),
    # rewards and advantages
    "alpha": ("advantage.alpha",), "local_weight": ("advantage.local_weight",), "group_by": ("advantage.group_by",),
    "normalize": ("advantage.normalize",), "baseline": ("advantage.baseline",), "trajectory_mean": ("advantage.trajectory_mean",),
    "trajectory_score": ("advantage.trajectory_score",),
    # training
    "loss": ("train.loss.kind",), "anchor": ("train.loss.anchor",), "sequence_ratio": ("train.loss.ratio",),
    "hinted_rows": ("train.loss.ratio_by_strategy.prompt_aug", "view.drop_strategies"), "zero_advantage_rows": ("view.drop_zero_advantage",),
    "feedback_rows": ("train.loss.ratio_by_strategy.feedback",), "dual_clip": ("train.loss.dual_clip",), "clip_low": ("train.loss.eps_low",),
    "clip_high": ("train.loss.eps_high",), "lr": ("train.lr",), "epochs": ("train.epochs",), "minibatch_size": ("train.minibatch_size",),
    "micro_batch_size": ("train.micro_batch_size",), "balance_verdicts": ("view.balance_verdicts",), "relabel_verdicts": ("view.relabel_verdicts",),
    "verifier_replay": ("view.verifier_replay",), "negative_weight": ("train.loss.negative_weight",), "strategy_weights": ("view.strategy_weights",),
    "lora": ("train.lora",), "lora_rank": ("train.lora.r",), "lora_alpha": ("train.lora.alpha",),
    "gradient_checkpointing": ("train.gradient_checkpointing",), "group_minibatches": ("train.group_minibatches",),
    "optimizer_state": ("train.optimizer_state",), "micro_batch_tokens": ("train.micro_batch_tokens",), "train_on": ("train_on",),
    "lr_round_decay": ("train.lr_round_decay",), "kl_beta": ("train.loss.beta",),
    "off_policy_correction": ("train.loss.correction",), "correction_cap": ("train.loss.correction_cap",), "correction_low": ("train.loss.correction_low",),
    # scale-out
    "shards": ("scale.shards",), "tensor_parallel_size": ("scale.tensor_parallel_size",), "data_parallel_size": ("scale.data_parallel_size",),
    "train_processes": ("scale.train_processes",), "fsdp": ("scale.fsdp",), "executor": ("scale.executor",), "ray_address": ("scale.ray_address",),
    "trainer_cores": ("scale.trainer_cores",), "engine_devices": ("scale.engine_devices",), "trainer_devices": ("scale.trainer_devices",),
    # evaluation and tracking
    "eval_problems": ("evaluation.problems",), "eval_samples": ("evaluation.samples",), "eval_max_tokens": ("evaluation.max_tokens",),
    "base_eval_cache": ("evaluation.reuse_base",), "report_to": ("tracking.report_to",),
}
"""Each flat setting and the `RunConfig` fields it sets, as dotted paths (the first is where it
lives; an error about a path is reported by the setting's flag where `Settings` built it)."""

CHECKPOINTING = {"auto": None, "on": True, "off": False}
"""The `gradient_checkpointing` setting -> `TrainConfig.gradient_checkpointing`."""

ZERO_ADVANTAGE_ROWS = ("drop", "keep")
"""The `zero_advantage_rows` setting: `ViewConfig.drop_zero_advantage` True or False."""

_RUN_FIELDS = ("workflow", "task", "task_file", "prompt_file", "model_dir", "shared_policy", "engine", "problems", "samples",
               "temperature", "max_tokens", "max_loop_num", "seed", "train_on", "problem_replay", "start_from",
               "max_staleness", "staleness_schedule", "max_row_staleness", "stale_row_weight")
"""The settings that are `RunConfig` fields of the same name."""


def preset_names() -> frozenset[str]:
    """The settings whose None means "the preset's": those an algorithm or a loss presets, and
    `clip_low` (its unset value is `LossConfig.eps_low`'s default)."""
    names = {name for preset in (*ALGORITHM_PRESETS.values(), *LOSS_PRESETS.values()) for name in preset}
    return frozenset(names | {"clip_low"})


def with_algorithm(algorithm: str, settings: Mapping[str, Any]) -> dict[str, Any]:
    """`settings` with `algorithm`'s preset where a setting is absent or None."""
    if algorithm not in ALGORITHMS:
        raise ConfigError(f"algorithm must be one of {list(ALGORITHMS)}, got {algorithm!r}")
    out = dict(settings)
    for name, value in ALGORITHM_PRESETS[algorithm].items():
        if out.get(name) is None:
            out[name] = value
    return out


def resolve(algorithm: str, settings: Mapping[str, Any]) -> dict[str, Any]:
    """The settings in effect: `settings` over `algorithm`'s preset, then the loss's preset
    (`LOSS_PRESETS`) and `clip_low`'s default where still unset; the presets' settings left None
    are dropped (their configs' defaults apply)."""
    presets = preset_names()
    out = {k: v for k, v in with_algorithm(algorithm, settings).items() if not (v is None and k in presets)}
    if out["loss"] not in LOSS_PRESETS:
        raise ConfigError(f"LossConfig.kind must be one of {tuple(LOSS_PRESETS)}, got {out['loss']!r}")
    for name, value in LOSS_PRESETS[out["loss"]].items():
        out.setdefault(name, value)
    out.setdefault("clip_low", config_default(LossConfig, "eps_low"))
    return out


def run_fields(algorithm: str, settings: Mapping[str, Any]) -> dict[str, Any]:
    """The `RunConfig` keyword arguments of `algorithm` with the flat `settings` over its preset."""
    unknown = sorted(set(settings) - set(SETTING_PATHS) - {"algorithm"})
    if unknown:
        raise ConfigError(f"RunConfig.for_algorithm: unknown setting(s) {unknown}; the settings are {sorted(SETTING_PATHS)}")
    values = resolve(algorithm, settings)
    loss = loss_config(values)
    out = {name: values[name] for name in _RUN_FIELDS if name in values}
    if "workflow_options" in values:
        out["workflow_options"] = parse_options(values["workflow_options"])
    if "strategies" in values:
        out["strategies"] = values["strategies"]
    return {
        **out,
        "algorithm": algorithm,
        "strategy_options": strategy_options(values),
        "advantage": advantage_config(values),
        "view": view_config(values, loss),
        "train": train_config(values, loss),
        "evaluation": eval_config(values),
        "scale": ScaleConfig(**_given(values, shards="shards", tensor_parallel_size="tensor_parallel_size",
                                      data_parallel_size="data_parallel_size", train_processes="train_processes", fsdp="fsdp",
                                      executor="executor", ray_address="ray_address", trainer_cores="trainer_cores",
                                      engine_devices="engine_devices", trainer_devices="trainer_devices")),
        "tracking": TrackingConfig(**({"report_to": tuple(values["report_to"])} if "report_to" in values else {})),
    }


def _given(values: Mapping[str, Any], **names: str) -> dict[str, Any]:
    """{config field: the value of its setting} for the settings present in `values`."""
    return {field: values[name] for field, name in names.items() if name in values}


def strategy_options(values: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """`RunConfig.strategy_options` of the settings: the feedback strategy's options."""
    return {"feedback": _given(values, train_context="feedback_train_context", first_attempt="feedback_first_attempt")}


def advantage_config(values: Mapping[str, Any]) -> AdvantageConfig:
    over = _given(values, normalize="normalize", baseline="baseline", trajectory_mean="trajectory_mean", trajectory_score="trajectory_score")
    if "group_by" in values:
        over["group_by"] = parse_group_by(values["group_by"])
    return AdvantageConfig(alpha=float(values["alpha"]), local_weight=float(values["local_weight"]), **over)


def loss_config(values: Mapping[str, Any]) -> LossConfig:
    """The loss of the settings. Every row's sequence-ratio handling is `sequence_ratio`, or the
    kind's own where it is unset or the same (`LossConfig`'s default: "mask" for ppo/is, "none"
    for exit); the hinted and feedback rows follow it unless their own setting says otherwise."""
    kind = values["loss"]
    kind_default = LossConfig(kind=kind).ratio
    base = values.get("sequence_ratio", kind_default.mode)
    by_strategy = {
        sid: RatioConfig(mode=values[name])
        for sid, name in (("prompt_aug", "hinted_rows"), ("feedback", "feedback_rows"))
        if values.get(name) not in (None, "drop", base)
    }
    dual_clip = values.get("dual_clip")
    return LossConfig(
        kind=kind,
        ratio=None if base == kind_default.mode else RatioConfig(mode=base),
        ratio_by_strategy=by_strategy,
        dual_clip=float(dual_clip) if dual_clip else None,  # 0 = off, as on the command line
        negative_weight=float(values["negative_weight"]),
        eps_low=float(values["clip_low"]),
        eps_high=float(values["clip_high"]),
        **_given(values, anchor="anchor", beta="kl_beta"),
        **_given(values, correction="off_policy_correction", correction_cap="correction_cap", correction_low="correction_low"),
    )


def view_config(values: Mapping[str, Any], loss: LossConfig) -> ViewConfig:
    """The loss's view (`ViewConfig.for_loss`: which rows it trains, verdicts balanced for "rs"
    only) with the view settings over it."""
    over = _given(values, balance_verdicts="balance_verdicts", relabel_verdicts="relabel_verdicts", verifier_replay="verifier_replay")
    rows = values.get("zero_advantage_rows")
    if rows is not None:
        if rows not in ZERO_ADVANTAGE_ROWS:
            raise ConfigError(f"zero_advantage_rows must be one of {list(ZERO_ADVANTAGE_ROWS)}, got {rows!r}")
        over["drop_zero_advantage"] = rows == "drop"
    weights = values.get("strategy_weights")
    return ViewConfig.for_loss(
        loss,
        strategy_weights=parse_weights(weights) if weights else None,
        drop_strategies=("prompt_aug",) if values.get("hinted_rows") == "drop" else (),
        **over,
    )


def train_config(values: Mapping[str, Any], loss: LossConfig) -> TrainConfig:
    over = _given(values, epochs="epochs", minibatch_size="minibatch_size", micro_batch_size="micro_batch_size", temperature="temperature",
                  micro_batch_tokens="micro_batch_tokens", optimizer_state="optimizer_state", group_minibatches="group_minibatches", dtype="dtype",
                  lr_round_decay="lr_round_decay")
    if "gradient_checkpointing" in values:
        if values["gradient_checkpointing"] not in CHECKPOINTING:
            raise ConfigError(f"gradient_checkpointing must be one of {list(CHECKPOINTING)}, got {values['gradient_checkpointing']!r}")
        over["gradient_checkpointing"] = CHECKPOINTING[values["gradient_checkpointing"]]
    if values.get("lora"):
        over["lora"] = LoraSettings(**_given(values, r="lora_rank", alpha="lora_alpha"))
    return TrainConfig(lr=float(values["lr"]), loss=loss, **over)


def eval_config(values: Mapping[str, Any]) -> EvalConfig:
    return EvalConfig(**_given(values, problems="eval_problems", samples="eval_samples", max_tokens="eval_max_tokens", reuse_base="base_eval_cache"))


def parse_group_by(values: Sequence[str] | None, default: tuple[str, ...] = ("agent_id", "turn")) -> tuple[str, ...]:
    """`--group-by` values: None = `default`; `none` or nothing = () (plain GRPO groups)."""
    if values is None:
        return tuple(default)
    if isinstance(values, str):
        raise ConfigError(f"group_by must be a sequence of column names, got the string {values!r}")
    values = tuple(values)
    return () if values in (("none",), ()) else values


def parse_options(items: Sequence[str] | Mapping[str, Any]) -> dict[str, Any]:
    """KEY=VALUE items -> {key: value}, with integers, floats and true/false parsed (a mapping is
    taken as it is); a malformed item is a `ConfigError` naming it."""
    if isinstance(items, Mapping):
        return dict(items)
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


def parse_weights(items: Sequence[str] | Mapping[str, float]) -> dict[str, float]:
    """STRATEGY=WEIGHT items -> {strategy: weight} (a mapping is taken as it is); a malformed
    item is a `ConfigError` naming it."""
    if isinstance(items, Mapping):
        return dict(items)
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
