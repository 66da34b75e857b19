"""The run's settings as a Dagster resource (a `ConfigurableResource`, so every asset and every
check of a round reads the same settings, and the launchpad edits them in one place).

Its fields are made from `pipeline.run.settings.Settings`, itself made from the settings the config
tree declares on its fields (`pipeline.config.fields`): same names, types, defaults and descriptions
as the `maxit run` flags, and `run_config()` is the same `RunConfig`."""


import json
import typing
from dataclasses import fields

import dagster as dg
from pydantic import Field, create_model

from pipeline.config import RunConfig
from pipeline.run.context import RoundContext
from pipeline.run.settings import Settings, settings_fields


def _pydantic_field(hint, default, help_text: str):
    """A Settings field as a pydantic field: tuples become lists (Dagster config has no tuples)."""
    if typing.get_origin(hint) is tuple:
        (item, _ellipsis) = typing.get_args(hint)
        return (list[item], Field(default=list(default), description=help_text))
    tuples = [a for a in typing.get_args(hint) if typing.get_origin(a) is tuple]
    if tuples:  # tuple | None: a list, or None for "the algorithm's preset"
        (item, _ellipsis) = typing.get_args(tuples[0])
        return (list[item] | None, Field(default=None if default is None else list(default), description=help_text))
    return (hint, Field(default=default, description=help_text))


_CONFIGS: dict[str, RunConfig] = {}
"""settings (as JSON) -> their `RunConfig`, built once per process."""

_CONTEXTS: dict[tuple, RoundContext] = {}
"""(store, settings, round) -> the round's `RoundContext`: the one round this process works on."""


class _SettingsResource(dg.ConfigurableResource):
    @classmethod
    def from_settings(cls, settings: Settings) -> "_SettingsResource":
        """The resource holding `settings` (tuples become lists)."""
        return cls(**{f.name: list(v) if isinstance(v := getattr(settings, f.name), tuple) else v for f in fields(Settings)})

    def settings(self) -> Settings:
        """These values as `pipeline.run.settings.Settings`."""
        return Settings(**{f.name: getattr(self, f.name) for f in fields(Settings)})

    def _key(self) -> str:
        return json.dumps({f.name: getattr(self, f.name) for f in fields(Settings)}, sort_keys=True, default=str)

    def run_config(self) -> RunConfig:
        """The run's `RunConfig`, built (and so validated) once per process for these settings."""
        key = self._key()
        if key not in _CONFIGS:
            _CONFIGS[key] = self.settings().run_config()
        return _CONFIGS[key]

    def context(self, store, round_: int, engine=None, policy_registry=None) -> RoundContext:
        """Round `round_`'s `RoundContext` on `store` (a `StoreResource`): made once per round and
        process, so every asset and check of the round shares one config, one workflow (and its
        task file, read once) and one set of strategies. `engine` (an `EngineResource`) gives it
        the process's engine pool (looked up on every call: `close_engines` may have replaced
        it); a check, which never samples, passes none."""
        key = (str(store.path), self._key(), int(round_))
        ctx = _CONTEXTS.get(key)
        if ctx is None:
            from pipeline.learn.verdicts import check_verdict_training

            registry = policy_registry.registry() if policy_registry is not None else store.registry()
            ctx = RoundContext(store.path, self.run_config(), registry=registry)
            view = ctx.config.view
            if view.relabel_verdicts or view.verifier_replay:  # the launchpad's settings, as `maxit run` checks them
                check_verdict_training(ctx.task(), view)  # (the task is built only then: a file task reads its file)
            _CONTEXTS.clear()  # an earlier round's context (its workflow) is not needed again
            _CONTEXTS[key] = ctx
        if engine is not None:
            ctx.engines = engine.pool(self.run_config().engine_options)
        return ctx


def launchpad(settings: type = Settings):
    """The resource class of a `Settings` class (`pipeline.run.settings.settings_class`): one
    pydantic field per setting, with its help as the launchpad's description."""
    return create_model(
        "RunSettings",
        __base__=_SettingsResource,
        __doc__="Settings of an expert-iteration run (pipeline.run.settings.Settings).",
        __module__=__name__,
        **{name: _pydantic_field(hint, default, help_text) for name, hint, default, help_text in settings_fields(settings)},
    )


RunSettings = launchpad()
