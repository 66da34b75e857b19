"""What makes a field of the config tree a setting of the run: its flag, help text, group and
choices, declared in the field's metadata where the field is declared (as TRL's config
dataclasses declare `field(metadata={"help": ...})`), and the walk that finds them.

A setting has a flat name (`eval_problems`): the name of `maxit run`'s flag (`--eval-problems`),
of the launchpad's field, of `RunConfig.for_algorithm`'s keyword and of the key in a store's
`experiment.json`. It lives on one field of the tree (`RunConfig.evaluation.problems`) and may set
others (`also`). `walk(RunConfig)` yields every setting with the path of its field, in the order
the tree declares them; `pipeline.run.settings` makes the flags and the launchpad of it and
`pipeline.config.flat` the places in the tree.

To add a setting: give the field `metadata=setting("name", "help", group=...)`; its flag, its
launchpad field and its place follow (where its flat value is not the field's own, the builder
in `pipeline.config.flat` that makes the field's config converts it)."""

from __future__ import annotations

import types
import typing
from dataclasses import MISSING, dataclass, fields, is_dataclass
from functools import lru_cache
from typing import Any, Iterator

from pipeline.errors import ConfigError

__all__ = [
    "Setting", "setting", "settings", "walk", "literal", "unoptional", "GROUPS", "SAME",
    "check_value", "check_declared", "check_field", "check_setting", "check_flat", "Choices", "check_count",
]

GROUPS = ("team and task", "sampling", "training", "rewards and advantages", "scale-out", "evaluation")
"""The groups `maxit run --help` lists its flags in."""

SAME = object()
"""A `Setting.default` of `SAME`: the setting's default is its field's."""


@dataclass(frozen=True)
class Setting:
    """One setting of the run, declared on the field it lives on."""

    name: str
    """The flat name (flag `--name-with-dashes`)."""
    help: str
    """The flag's help text, without the default (`maxit run --help` adds it)."""
    group: str
    """The group of `GROUPS` the flag is listed in."""
    hint: Any = None
    """The flat value's type where it is not the field's (the field's without `| None`, a
    `Literal` as str), e.g. `tuple[str, ...]` for a mapping given as KEY=VALUE items."""
    default: Any = SAME
    """The flat default where it is not the field's (`lora`: False for a field whose None is off)."""
    choices: tuple | None = None
    """The values taken; None = the field's `Literal` (if any)."""
    key: str | None = None
    """For a setting inside a mapping field (`strategy_options`): the dotted key under it."""
    also: tuple[str, ...] = ()
    """Other paths of `RunConfig` the setting sets (`temperature` -> `train.temperature`)."""
    metavar: str | None = None
    negative_flag: tuple[str, str] | None = None
    """(flag, help) of a boolean set to False by a flag of its own (`--separate-policies`)."""
    aliases: tuple[str, ...] = ()
    """Earlier spellings of the flag, still taken and not listed (`--processes`)."""

    def __post_init__(self) -> None:
        if self.group not in GROUPS:
            raise ValueError(f"setting {self.name}: group {self.group!r} is not one of {GROUPS}")
        if isinstance(self.default, (list, dict)):
            raise TypeError(f"setting {self.name}: mutable defaults are not allowed; use a tuple")


def setting(name: str, help: str, *, group: str, **options: Any) -> dict:
    """The metadata of a field that is one setting: `field(default=..., metadata=setting(...))`."""
    return {"settings": (Setting(name, help, group, **options),)}


def settings(*declared: Setting) -> dict:
    """The metadata of a mapping field that holds several settings, each under its `key`."""
    return {"settings": tuple(declared)}


def unoptional(hint):
    """`X | None` -> X."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if typing.get_origin(hint) in (typing.Union, types.UnionType) and len(args) == 1 else hint


def literal(config: type, name: str) -> tuple:
    """The values `config`'s field `name` takes, from its `Literal[...]` type."""
    hint = unoptional(typing.get_type_hints(config)[name])
    if typing.get_origin(hint) is not typing.Literal:
        raise TypeError(f"{config.__name__}.{name} is not a Literal")
    return typing.get_args(hint)


@dataclass(frozen=True)
class Found:
    """A setting found by `walk`: where it lives and the field it is declared on."""

    setting: Setting
    path: str
    """Dotted path from the root config (`train.loss.kind`, `strategy_options.feedback.first_attempt`)."""
    owner: type
    """The config that declares the field (`LossConfig`)."""
    field_name: str
    hint: Any
    """The field's type, without `| None`."""
    field_default: Any
    optional: bool
    """Whether the field's type takes None."""

    @property
    def paths(self) -> tuple[str, ...]:
        return (self.path, *self.setting.also)

    @property
    def choices(self) -> tuple | None:
        if self.setting.choices is not None:
            return tuple(self.setting.choices)
        return typing.get_args(self.hint) if typing.get_origin(self.hint) is typing.Literal else None

    @property
    def flat_hint(self):
        """The setting's own type (before a preset's None): `Setting.hint`, else the field's with a
        `Literal` as str."""
        if self.setting.hint is not None:
            return self.setting.hint
        if typing.get_origin(self.hint) is typing.Literal:
            return type(typing.get_args(self.hint)[0])
        return self.hint

    @property
    def flat_type(self):
        """The setting's type as the flags and the launchpad take it: `flat_hint`, with `| None`
        where its default is None or its field takes None as a value of its own."""
        hint = self.flat_hint
        return hint | None if self.default is None or (self.setting.hint is None and self.optional) else hint

    @property
    def default(self):
        return self.field_default if self.setting.default is SAME else self.setting.default


def walk(config: type, prefix: str = "") -> Iterator[Found]:
    """Every setting declared in the tree under `config` (a config dataclass), depth first in
    declaration order: a field's own settings, then those of the config it holds."""
    hints = typing.get_type_hints(config)
    for f in fields(config):
        hint = unoptional(hints[f.name])
        optional = hint is not hints[f.name]
        default = f.default if f.default is not MISSING else (f.default_factory() if f.default_factory is not MISSING else None)
        path = prefix + f.name
        for declared in f.metadata.get("settings", ()):
            where = path if declared.key is None else f"{path}.{declared.key}"
            yield Found(declared, where, config, f.name, hint, default, optional)
        if is_dataclass(hint):
            yield from walk(hint, path + ".")


# -- the rules a declaration makes, checked in one place ------------------------------------------
#
# A field's choices (its setting's `choices`, else its `Literal`) and its being a sequence (a
# tuple type, which a string would fill letter by letter) are rules its declaration makes. They
# are checked by `check_value` alone: a config checks its own fields (`check_declared`, from its
# `__post_init__`), and the flat carriers (`Settings`, the flags, `pipeline.config.flat`'s
# builders) call the same function on a flat value, never a copy of the rule.


def check_value(where: str, value: Any, *, choices: tuple | None = None, sequence: bool = False, optional: bool = False) -> None:
    """The one check of a declared rule: `value` (of the field or setting named `where`) is one of
    `choices`, a sequence and not a string where `sequence`, and may be None where `optional`;
    else a `ConfigError` naming `where`."""
    if value is None and optional:
        return
    if choices is not None and value not in choices:
        raise ConfigError(f"{where} must be one of {list(choices)}, got {value!r}")
    if sequence and isinstance(value, str):
        raise ConfigError(f"{where} must be a sequence of names, got the string {value!r}")


def check_count(where: str, value: Any, minimum: int = 1, optional: bool = False) -> None:
    """The rule of a count (problems, shards, epochs, rounds): an integer (not a bool) >= `minimum`,
    or None where `optional`; else a `ConfigError` naming `where`. The one copy every config's
    counts are checked with."""
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{where} must be an integer >= {minimum}{' or None' if optional else ''}, got {value!r}")


def _is_sequence(hint) -> bool:
    return typing.get_origin(unoptional(hint)) is tuple


@lru_cache(maxsize=None)
def _rules(config: type) -> dict[str, dict[str, Any]]:
    """{field: keywords of `check_value`} of the fields of `config` whose declaration makes a rule:
    the choices of a setting whose flat value is its field's (else the field's `Literal`), a
    tuple type."""
    hints = typing.get_type_hints(config)
    out = {}
    for f in fields(config):
        hint = unoptional(hints[f.name])
        own = [s for s in f.metadata.get("settings", ()) if s.key is None and s.hint is None]
        choices = tuple(own[0].choices) if own and own[0].choices is not None else None
        if choices is None and typing.get_origin(hint) is typing.Literal:
            choices = typing.get_args(hint)
        sequence = _is_sequence(hint)
        if choices is not None or sequence:
            out[f.name] = {"choices": choices, "sequence": sequence, "optional": hint is not hints[f.name]}
    return out


def check_field(config: type, name: str, value: Any) -> None:
    """`value` for the field `name` of `config` against its declaration (`check_value`), the
    error naming `Config.name`; e.g. the algorithm before its preset is looked up."""
    rules = _rules(config).get(name)
    if rules is not None:
        check_value(f"{config.__name__}.{name}", value, **rules)


def check_declared(config: Any) -> None:
    """Every field of `config` (a config dataclass, from its `__post_init__`) against the rules
    its declaration makes (`check_value`): the one place a field's choices are checked."""
    for name, rules in _rules(type(config)).items():
        check_value(f"{type(config).__name__}.{name}", getattr(config, name), **rules)


def check_setting(found: Found, value: Any) -> None:
    """A flat value of the setting `found` against its declaration (its choices; a sequence where
    its flat type is a tuple), the error naming the setting: for the settings whose flat value
    no config holds (`zero_advantage_rows`, `gradient_checkpointing`), checked where
    `pipeline.config.flat` converts them."""
    check_value(found.setting.name, value, choices=found.choices, sequence=_is_sequence(found.flat_hint))


def check_flat(record: Any) -> None:
    """Every field of a flat record of settings (`pipeline.run.settings.Settings`: one field per
    setting, its choices in its metadata) against its setting's declaration, the error naming the
    setting; None passes where it is the field's default ("the preset's")."""
    for f in fields(record):
        check_value(f.name, getattr(record, f.name), choices=f.metadata.get("choices"), sequence=_is_sequence(f.type),
                    optional=f.default is None)


class Choices(tuple):
    """A setting's choices as a command-line flag takes them (argparse's `choices`: listed by
    `--help` and in its "invalid choice" error), whose membership is the setting's one rule,
    `check_value`: argparse asks `value in choices`."""

    def __contains__(self, value: Any) -> bool:
        try:
            check_value("", value, choices=tuple(self))
        except ConfigError:
            return False
        return True
