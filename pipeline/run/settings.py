"""The run's settings for the command line and the Dagster launchpad, made from the config tree.

Each setting is declared on the field of `pipeline.config`'s tree that it sets, with its flag,
help text, group and choices (`pipeline.config.fields.setting`). `Settings` is made from those
declarations by one walk of the tree (`pipeline.config.flat.declared`): a flat, frozen record of
every setting by its flat name, which makes `maxit run`'s flags (`add_setting_flags`), the
launchpad's fields (`assets.config.RunSettings`) and the record of a store (`experiment.json`).
Nothing about a setting is written here: its default and choices are its field's, the
algorithms' and losses' presets are `pipeline.config.presets`, and the rules across settings are
checked by the configs when they are built. A value outside a setting's choices, or one string
given for a sequence, is refused as soon as `Settings` is made (and by argparse for a flag), by
the rule its field declares (`pipeline.config.fields.check_value`, the check the configs make of
their own fields), never by a copy of it. `Settings(...).run_config()` is
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
from dataclasses import MISSING, dataclass, field, fields, is_dataclass, make_dataclass
from functools import lru_cache
from typing import Any, Mapping, Sequence

from pipeline.config import AdvantageConfig, LossConfig, RunConfig, ViewConfig, flat
from pipeline.config.fields import GROUPS, Choices, check_flat, unoptional
from pipeline.config.presets import LOSS_PRESETS
from pipeline.config.presets import config_default as _default
from pipeline.errors import ConfigError
from pipeline.run.setting_meta import preset_summary

__all__ = ["Settings", "add_setting_flags", "setting_flag", "setting_help", "settings_from_args", "workflow_defaults", "setting_default"]


@dataclass(frozen=True)
class _Settings:
    """What every `Settings` does; its fields are made from the tree (`_make_settings`)."""

    def __post_init__(self) -> None:
        # a bad choice or a string for a sequence fails here already, by the rules the fields
        # declare (`check_flat` calls the configs' own check); the rest when the configs are built
        check_flat(self)
        # what is left unset follows the algorithm
        for name, value in flat.with_algorithm(RunConfig, self.algorithm, self.values()).items():
            object.__setattr__(self, name, value)
        if self.clip_low is None:
            object.__setattr__(self, "clip_low", _default(LossConfig, "eps_low"))
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None and typing.get_origin(unoptional(f.type)) is tuple:
                object.__setattr__(self, f.name, tuple(value))

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

    # -- the stages' configs (each also part of `run_config()`) -------------------------------
    def in_effect(self) -> dict[str, Any]:
        """The settings with the loss's preset filled in (`pipeline.config.flat.resolve`)."""
        return flat.resolve(RunConfig, self.algorithm, self.values())

    def _build(self, make):
        """`make(self.in_effect())`, a config's error named by the settings' flags."""
        with flags_named():
            return make(self.in_effect())

    def advantage_config(self) -> AdvantageConfig:
        return self._build(flat.advantage_config)

    def view_config(self) -> ViewConfig:
        return self._build(lambda values: flat.view_config(values, flat.loss_config(values)))

    def strategy_options(self) -> dict[str, dict[str, Any]]:
        return self._build(lambda values: flat.strategy_options(RunConfig, values))

    def run_config(self) -> RunConfig:
        """The `RunConfig` of these settings (`RunConfig.for_algorithm`), validated: a bad value
        or combination raises `ConfigError` naming each config field by the flag of the setting
        it is made from (`RunConfig.problems` -> `--problems`, `EvalConfig.problems` ->
        `--eval-problems`, `RunConfig.advantage.alpha` -> `--alpha`)."""
        with flags_named():
            return RunConfig.for_algorithm(**self.values())


def settings_class(root: type | None = None) -> type:
    """`Settings`: one field per setting the tree under `root` (default `RunConfig`) declares, in
    the tree's order, with the setting's own type (None where an algorithm or a loss presets it:
    "the preset's")."""
    presets = flat.preset_names()
    spec = []
    for found in flat.declared(root or RunConfig):
        s = found.setting
        default = None if s.name in presets else found.default
        hint = found.flat_type if default is not None else found.flat_hint | None
        meta = {"help": s.help, "group": s.group, "choices": found.choices, "negative_flag": s.negative_flag, "metavar": s.metavar,
                "aliases": s.aliases}
        spec.append((s.name, hint, field(default=default, metadata=meta)))
    cls = make_dataclass("Settings", spec, bases=(_Settings,), frozen=True)
    cls.__module__, cls.__qualname__ = __name__, "Settings"
    cls.__doc__ = ("Every setting of an expert-iteration run, by its flat name (see the module docstring); `run_config()` "
                   "validates the whole and builds the `RunConfig`.")
    return cls


Settings = settings_class()


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
    for name, paths in flat.setting_paths(RunConfig).items():
        for path in paths:
            out.setdefault(f"RunConfig.{path}", name)
            owner, *parts = (RunConfig, *path.split("."))
            for part in parts[:-1]:  # down to the config that declares the last part
                owner = unoptional(typing.get_type_hints(owner)[part]) if is_dataclass(owner) and part in {f.name for f in fields(owner)} else None
            if owner is not None and is_dataclass(owner) and parts[-1] in {f.name for f in fields(owner)}:
                out.setdefault(f"{owner.__name__}.{parts[-1]}", name)
    return out


def setting_default(name: str):
    """The default of one setting, with the default algorithm's presets filled in."""
    if name not in {f.name for f in fields(Settings)}:
        raise KeyError(name)
    return getattr(Settings(), name)


# -- the command line ---------------------------------------------------------------------------


def _scalar_type(hint) -> type:
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if args else hint


def setting_flag(name: str) -> str:
    """The command-line flag of the setting `name` (`eval_problems` -> `--eval-problems`; a
    boolean's negative flag is in its field's metadata)."""
    return "--" + name.replace("_", "-")


def setting_help(name: str, settings: type | None = None) -> str:
    """The help text of the setting `name`, with what each algorithm sets it to where they do."""
    meta = {f.name: f.metadata for f in fields(settings or Settings)}[name]
    summary = preset_summary(name)
    return meta["help"] if summary is None else f"{meta['help']} (default by --algorithm: {summary})"


def _choices(meta: Mapping[str, Any]) -> Choices | None:
    """A flag's choices, checked by the setting's own rule (`pipeline.config.fields.Choices`)."""
    return None if meta["choices"] is None else Choices(meta["choices"])


def add_setting_flags(parser: argparse.ArgumentParser, groups: Sequence[str] | None = None, names: Sequence[str] = (), settings: type | None = None) -> None:
    """One flag per setting (of the named groups, and the settings named in `names`; groups None
    = all): `--name-with-dashes`; booleans get `--x` / `--no-x` (or their own negative flag);
    sequences take several values. Defaults are left unset (None) so that `settings_from_args`
    can tell a flag given from one left alone. `settings`: the `Settings` class (default this
    module's; `settings_class` of a wider tree)."""
    settings = settings or Settings
    hints = typing.get_type_hints(settings)
    chosen = [f for f in fields(settings) if groups is None or f.metadata["group"] in groups or f.name in names]
    # the groups in `GROUPS`' order, whatever the tree's order of their settings
    arg_groups = {group: parser.add_argument_group(group) for group in GROUPS if any(f.metadata["group"] == group for f in chosen)}
    for f in chosen:
        meta = f.metadata
        g = arg_groups[meta["group"]]
        flag = setting_flag(f.name)
        hint = unoptional(hints[f.name])  # None ("the preset") is the unset flag's value
        if preset_summary(f.name) is not None:
            help_text = setting_help(f.name, settings)
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
            g.add_argument(flag, dest=f.name, type=_scalar_type(hint), choices=_choices(meta), default=None, metavar=meta["metavar"], help=help_text)
        for alias in meta["aliases"]:  # an earlier spelling, kept so that scripts keep working, and not listed
            if typing.get_origin(hint) is tuple:
                g.add_argument(alias, dest=f.name, action="extend", nargs=1, default=argparse.SUPPRESS, help=argparse.SUPPRESS)
            else:
                g.add_argument(alias, dest=f.name, type=_scalar_type(hint), choices=_choices(meta), default=argparse.SUPPRESS, help=argparse.SUPPRESS)


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


def settings_fields(settings: type | None = None) -> list[tuple[str, Any, Any, str]]:
    """(name, type hint, default, help) of every setting, in order (for the Dagster resource)."""
    settings = settings or Settings
    hints = typing.get_type_hints(settings)
    return [(f.name, hints[f.name], f.default if f.default is not MISSING else None, setting_help(f.name, settings)) for f in fields(settings)]
