"""Each rule a setting's declaration makes (one of its choices; a sequence, not a string) is checked
in one place, `pipeline.config.fields.check_value`, called by the config that declares the field
and, through the declaration, by the flat carriers (`Settings`, the launchpad's `RunSettings`,
`maxit run`'s flags, `pipeline.config.flat`'s builders). A copy of a rule added to a carrier or a
config is caught here: with the one check made a no-op nothing refuses a bad choice any more, and
with it made to raise a marker the marker is what every path raises."""

from __future__ import annotations

import typing
from dataclasses import fields

import pytest

from assets.config import RunSettings
from maxit.cli import build_parser
from pipeline.config import (
    AdvantageConfig, EvalConfig, LoraSettings, LossConfig, RatioConfig, RunConfig, ScaleConfig, TrackingConfig, TrainConfig, ViewConfig,
)
from pipeline.config import fields as declared_fields
from pipeline.errors import ConfigError
from pipeline.run.settings import Settings, setting_flag, settings_from_args

CONFIGS = (RunConfig, AdvantageConfig, ViewConfig, EvalConfig, TrainConfig, LossConfig, RatioConfig, LoraSettings, ScaleConfig, TrackingConfig)

BAD_CHOICES = {
    "engine": "cuda", "start_from": "first", "staleness_schedule": "soon", "train_on": "labels", "trajectory_score": "max",
    "normalize": "minmax", "baseline": "median", "dtype": "fp8", "optimizer_state": "keep", "anchor": "old",
    "off_policy_correction": "is", "executor": "slurm", "fsdp": "zero3", "zero_advantage_rows": "some", "sequence_ratio": "clip",
}
"""A value outside its declared choices for each setting whose other rules let it through."""

ALSO = {"train_processes": 2}
"""What the bad values above need besides (FSDP shards over more than one process)."""

LOOKED_UP = {"algorithm": "nope", "loss": "xyz", "gradient_checkpointing": "sometimes"}
"""Settings whose value is looked up (a preset, a mapping) once its rule has passed."""

SEQUENCES = {"strategies": "iid", "group_by": "agent_id", "report_to": "wandb", "workflow_options": "max_turns=3", "strategy_weights": "iid=1"}
"""A string for a sequence setting, which would be read letter by letter."""


def _argv(values: dict) -> list[str]:
    return [arg for name, value in values.items() for arg in (setting_flag(name), str(value))]


def _parse(values: dict):
    return settings_from_args(build_parser().parse_args(["run", *_argv(values)]))


class Marker(Exception):
    """Raised by the one check in place of its `ConfigError`."""


def test_with_the_one_check_off_no_carrier_refuses_a_bad_choice(monkeypatch):
    for name, value in BAD_CHOICES.items():  # each is refused while the check is on, on every path
        with pytest.raises(ConfigError, match=f"^{name} must be one of"):
            declared_fields.check_flat(RunSettings(**ALSO, **{name: value}).settings())
        with pytest.raises(SystemExit):
            _parse({name: value})
        with pytest.raises(ConfigError, match="must be one of"):
            RunConfig.for_algorithm(**ALSO, **{name: value})
    monkeypatch.setattr(declared_fields, "check_value", lambda *args, **kwargs: None)
    bad = {**BAD_CHOICES, **ALSO}
    config = RunConfig.for_algorithm(**bad)
    assert (config.engine, config.start_from, config.train.dtype, config.scale.fsdp) == ("cuda", "first", "fp8", "zero3")
    assert RunSettings(**bad).run_config() == config
    assert _parse(bad).run_config() == config


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.__name__)
def test_no_config_checks_a_literal_field_by_hand(config, monkeypatch):
    """Every field typed by a `Literal` is checked by `check_declared`, the config's call of the one
    check: off, a value outside the `Literal` is taken."""
    hints = typing.get_type_hints(config)
    literals = [f.name for f in fields(config)
                if typing.Literal in (typing.get_origin(declared_fields.unoptional(hints[f.name])),) and f.name != "algorithm"]
    also = {"train_processes": 2} if config is ScaleConfig else {}
    for name in literals:
        with pytest.raises(ConfigError, match=rf"^{config.__name__}\.{name} must be one of"):
            config(**also, **{name: "not-a-choice"})
    monkeypatch.setattr(declared_fields, "check_value", lambda *args, **kwargs: None)
    for name in literals:
        assert getattr(config(**also, **{name: "not-a-choice"}), name) == "not-a-choice"


def test_every_path_refuses_a_bad_value_by_the_one_check(monkeypatch):
    check = declared_fields.check_value

    def marked(*args, **kwargs):
        try:
            check(*args, **kwargs)
        except ConfigError as err:
            raise Marker(str(err)) from None

    monkeypatch.setattr(declared_fields, "check_value", marked)
    for name, value in {**BAD_CHOICES, **LOOKED_UP, **SEQUENCES}.items():
        given = {**ALSO, name: value}
        paths = [lambda: Settings(**given), lambda: RunConfig.for_algorithm(**given)]
        if name not in SEQUENCES:  # the launchpad's lists and a flag's several values are never one string
            paths += [lambda: RunSettings(**given).settings(), lambda: _parse(given)]
        for path in paths:
            with pytest.raises(Marker):
                path()
    with pytest.raises(Marker, match=r"^RunConfig\.algorithm must be one of"):
        RunConfig(algorithm="nope")
    with pytest.raises(Marker, match=r"^LossConfig\.kind must be one of"):
        RunConfig(train=TrainConfig(loss=LossConfig(kind="xyz")))
