"""A run's config from its flat settings: the names of `maxit run`'s flags (`alpha`, `lr`,
`clip_high`, `eval_problems`...), each put on the field of the config tree that declares it
(`pipeline.config.fields`: `setting_paths()`), with the algorithm's preset and then the loss's
(`pipeline.config.presets`) filling the settings left unset.

`RunConfig.for_algorithm(algorithm, **settings)` is `RunConfig(**run_fields(algorithm,
settings))`; the CLI and the Dagster launchpad (`pipeline.run.settings.Settings`) go through it,
so a notebook, a flag and a launchpad field make one config. A setting whose value is its field's
goes there as it is; the builders below convert the others (a KEY=VALUE list, a switch named
"drop"/"keep"). A preset's setting (one of `ALGORITHM_PRESETS` or `LOSS_PRESETS`, or `clip_low`)
given as None is left to the presets; any other setting given as None is that value
(`max_tokens=None`: the task's budget), and a setting not given is its config's default.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Mapping, Sequence

from pipeline.config.fields import SAME, Found, check_field, check_setting, walk
from pipeline.config.presets import ALGORITHM_PRESETS, LOSS_PRESETS, config_default
from pipeline.config.scale import ScaleConfig, TrackingConfig
from pipeline.config.stages import ZERO_ADVANTAGE_ROWS, AdvantageConfig, EvalConfig, ViewConfig
from pipeline.config.loss import LossConfig, RatioConfig
from pipeline.config.train import CHECKPOINTING, LoraSettings, TrainConfig
from pipeline.errors import ConfigError

__all__ = [
    "declared", "setting_paths", "CHECKPOINTING", "ZERO_ADVANTAGE_ROWS", "run_fields", "with_algorithm", "resolve", "preset_names",
    "advantage_config", "view_config", "loss_config", "train_config", "eval_config", "strategy_options",
    "parse_options", "parse_weights", "parse_group_by",
]


@lru_cache(maxsize=None)
def declared(root: type) -> tuple[Found, ...]:
    """Every setting the config tree under `root` declares (`RunConfig`, or one of its configs),
    in its order (`pipeline.config.fields.walk`); a name declared twice is an error."""
    found = tuple(walk(root))
    names = [f.setting.name for f in found]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise TypeError(f"{root.__name__}: setting(s) {twice} declared on more than one field")
    return found


def setting_paths(root: type) -> dict[str, tuple[str, ...]]:
    """Each flat setting and the fields of `root` (`RunConfig`) it sets, as dotted paths (the first
    is where it lives; an error about a path is reported by the setting's flag where `Settings`
    built it)."""
    return {found.setting.name: found.paths for found in declared(root)}


def _as_declared(values: Mapping[str, Any], config: type) -> dict[str, Any]:
    """{field: value} of the settings given in `values` that `config` declares on its own fields
    and whose value is their field's: those the builders need not convert."""
    out = {}
    for found in declared(config):
        plain = found.setting.hint is None and found.setting.default is SAME and found.setting.key is None
        if plain and "." not in found.path and found.setting.name in values:
            out[found.field_name] = values[found.setting.name]
    return out


def preset_names() -> frozenset[str]:
    """The settings whose None means "the preset's": those an algorithm or a loss presets, and
    `clip_low` (its unset value is `LossConfig.eps_low`'s default)."""
    names = {name for preset in (*ALGORITHM_PRESETS.values(), *LOSS_PRESETS.values()) for name in preset}
    return frozenset(names | {"clip_low"})


def _setting(config: type, name: str) -> Found:
    """The declaration of the setting `name` in the tree under `config`."""
    return next(found for found in declared(config) if found.setting.name == name)


def with_algorithm(root: type, algorithm: str, settings: Mapping[str, Any]) -> dict[str, Any]:
    """`settings` with `algorithm`'s preset where a setting is absent or None; an algorithm that
    has no preset is refused by the rule of `root`'s (`RunConfig`'s) field `algorithm`."""
    if algorithm not in ALGORITHM_PRESETS:
        check_field(root, "algorithm", algorithm)
    out = dict(settings)
    for name, value in ALGORITHM_PRESETS[algorithm].items():
        if out.get(name) is None:
            out[name] = value
    return out


def resolve(root: type, algorithm: str, settings: Mapping[str, Any]) -> dict[str, Any]:
    """The settings in effect (of the tree under `root`, `RunConfig`): `settings` over
    `algorithm`'s preset, then the loss's preset (`LOSS_PRESETS`) and `clip_low`'s default where
    still unset; the presets' settings left None are dropped (their configs' defaults apply). A
    loss that has no preset is refused by the rule of its field, `LossConfig.kind`."""
    presets = preset_names()
    out = {k: v for k, v in with_algorithm(root, algorithm, settings).items() if not (v is None and k in presets)}
    if out["loss"] not in LOSS_PRESETS:
        check_field(LossConfig, "kind", out["loss"])
    for name, value in LOSS_PRESETS[out["loss"]].items():
        out.setdefault(name, value)
    out.setdefault("clip_low", config_default(LossConfig, "eps_low"))
    return out


def run_fields(root: type, algorithm: str, settings: Mapping[str, Any]) -> dict[str, Any]:
    """The keyword arguments of `root` (`RunConfig`) of `algorithm` with the flat `settings` over its preset."""
    known = setting_paths(root)
    unknown = sorted(set(settings) - set(known) - {"algorithm"})
    if unknown:
        raise ConfigError(f"RunConfig.for_algorithm: unknown setting(s) {unknown}; the settings are {sorted(known)}")
    values = resolve(root, algorithm, settings)
    loss = loss_config(values)
    out = _as_declared(values, root)
    if "workflow_options" in values:  # a flat value no config holds (KEY=VALUE items): its setting's rule is checked here
        check_setting(_setting(root, "workflow_options"), values["workflow_options"])
        out["workflow_options"] = parse_options(values["workflow_options"])
    return {
        **out,
        "algorithm": algorithm,
        "strategy_options": strategy_options(root, values),
        "advantage": advantage_config(values),
        "view": view_config(values, loss),
        "train": train_config(values, loss),
        "evaluation": eval_config(values),
        "scale": ScaleConfig(**_as_declared(values, ScaleConfig)),
        "tracking": TrackingConfig(**_as_declared(values, TrackingConfig)),
    }


def strategy_options(root: type, values: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """`RunConfig.strategy_options` of the settings (`root`: `RunConfig`), each under its key
    (`feedback.first_attempt`)."""
    out: dict[str, dict[str, Any]] = {}
    for found in declared(root):
        if found.path.startswith("strategy_options.") and found.setting.name in values:
            strategy, option = found.setting.key.split(".")
            out.setdefault(strategy, {})[option] = values[found.setting.name]
    return out or {"feedback": {}}


def advantage_config(values: Mapping[str, Any]) -> AdvantageConfig:
    over = _as_declared(values, AdvantageConfig)
    if "group_by" in values:
        over["group_by"] = parse_group_by(values["group_by"])
    return AdvantageConfig(**{**over, "alpha": float(values["alpha"]), "local_weight": float(values["local_weight"])})


def loss_config(values: Mapping[str, Any]) -> LossConfig:
    """The loss of the settings. Every row's sequence-ratio handling is `sequence_ratio`, or the
    kind's own where it is unset or the same (`LossConfig`'s default: "mask" for ppo/is, "none"
    for exit); the hinted and feedback rows follow it unless their own setting says otherwise."""
    kind = values["loss"]
    kind_default = LossConfig(kind=kind).ratio
    base = values.get("sequence_ratio", kind_default.mode)
    by_strategy = {
        found.setting.key: RatioConfig(mode=values[found.setting.name])
        for found in declared(LossConfig)
        if found.path.startswith("ratio_by_strategy.") and values.get(found.setting.name) not in (None, "drop", base)
    }
    dual_clip = values.get("dual_clip")
    return LossConfig(**{
        **_as_declared(values, LossConfig),
        "ratio": None if base == kind_default.mode else RatioConfig(mode=base),
        "ratio_by_strategy": by_strategy,
        "dual_clip": float(dual_clip) if dual_clip else None,  # 0 = off, as on the command line
        "negative_weight": float(values["negative_weight"]),
        "eps_low": float(values["clip_low"]),
        "eps_high": float(values["clip_high"]),
    })


def view_config(values: Mapping[str, Any], loss: LossConfig) -> ViewConfig:
    """The loss's view (`ViewConfig.for_loss`: which rows it trains, verdicts balanced for "rs"
    only) with the view settings over it."""
    over = _as_declared(values, ViewConfig)
    rows = values.get("zero_advantage_rows")
    if rows is not None:  # a flat value no config holds: its setting's rule is checked here
        check_setting(_setting(ViewConfig, "zero_advantage_rows"), rows)
        over["drop_zero_advantage"] = rows == "drop"
    weights = values.get("strategy_weights")
    if weights:  # a flat value no config holds (STRATEGY=WEIGHT items): its setting's rule is checked here
        check_setting(_setting(ViewConfig, "strategy_weights"), weights)
    over["strategy_weights"] = parse_weights(weights) if weights else None
    over["drop_strategies"] = ("prompt_aug",) if values.get("hinted_rows") == "drop" else ()  # hinted_rows' second path
    return ViewConfig.for_loss(loss, **over)


def train_config(values: Mapping[str, Any], loss: LossConfig) -> TrainConfig:
    over = _as_declared(values, TrainConfig)
    if "temperature" in values:  # the run's sampling temperature, `temperature`'s second path
        over["temperature"] = values["temperature"]
    if "gradient_checkpointing" in values:  # a flat value no config holds: its setting's rule is checked here
        check_setting(_setting(TrainConfig, "gradient_checkpointing"), values["gradient_checkpointing"])
        over["gradient_checkpointing"] = CHECKPOINTING[values["gradient_checkpointing"]]
    if values.get("lora"):
        over["lora"] = LoraSettings(**_as_declared(values, LoraSettings))
    return TrainConfig(**{**over, "lr": float(values["lr"]), "loss": loss})


def eval_config(values: Mapping[str, Any]) -> EvalConfig:
    return EvalConfig(**_as_declared(values, EvalConfig))


def parse_group_by(values: Sequence[str] | None, default: tuple[str, ...] = ("agent_id", "turn")) -> tuple[str, ...]:
    """`--group-by` values: None = `default`; `none` or nothing = () (plain GRPO groups). A string
    is passed on as it is, for `AdvantageConfig.group_by`'s own rule to refuse by name (as a tuple
    it would be read letter by letter)."""
    if values is None:
        return tuple(default)
    if isinstance(values, str):
        return values
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
