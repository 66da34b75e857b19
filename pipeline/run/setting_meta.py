"""What a setting is made of, apart from the run's `Settings` themselves: the field maker `_s`
(help text, CLI group, choices as metadata), the type helpers that read a config's field types,
and what each algorithm presets a setting to, as its help says it (`preset_summary`)."""

from __future__ import annotations

import types
import typing
from dataclasses import field
from typing import Any

from pipeline.config.presets import ALGORITHM_PRESETS, ALGORITHMS, LOSS_KINDS, LOSS_PRESETS
from pipeline.config.presets import config_default as _default
from pipeline.config.train import LossConfig

__all__ = ["preset_summary"]


def _s(
    default: Any, help: str, *, group: str, choices: tuple | None = None, negative_flag: tuple[str, str] | None = None, metavar: str | None = None
):
    """A setting: a dataclass field with its help text, CLI group and choices as metadata.
    `negative_flag`: (flag, help) of a boolean set to False on the command line by that flag."""
    meta = {"help": help, "group": group, "choices": choices, "negative_flag": negative_flag, "metavar": metavar}
    if isinstance(default, (list, dict)):
        raise TypeError("mutable defaults are not allowed; use a tuple")
    return field(default=default, metadata=meta)


def _unoptional(hint):
    """`X | None` -> X (a setting whose None means "the preset" takes X on the command line)."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if typing.get_origin(hint) in (typing.Union, types.UnionType) and len(args) == 1 else hint


def _field_type(config: type, name: str):
    """The type of `config`'s field `name`, without its `| None`."""
    return _unoptional(typing.get_type_hints(config)[name])


def _choices(config: type, name: str) -> tuple:
    """The values `config`'s field `name` takes, from its `Literal[...]` type."""
    hint = _field_type(config, name)
    if typing.get_origin(hint) is not typing.Literal:
        raise TypeError(f"{config.__name__}.{name} is not a Literal")
    return typing.get_args(hint)


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
