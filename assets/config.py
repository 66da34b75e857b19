"""The run's settings as a Dagster resource (a `ConfigurableResource`, so every asset and every
check of a round reads the same settings, and the launchpad edits them in one place).

Its fields are made from `pipeline.run.settings.Settings`, the one definition of a run's settings:
same names, types, defaults and descriptions as the `maxit run` flags and `RunConfig`."""


from dataclasses import fields
from pathlib import Path
import typing

import dagster as dg
from pydantic import Field, create_model

from pipeline.run.rounds import RoundContext, RunConfig
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


class _SettingsResource(dg.ConfigurableResource):
    @classmethod
    def from_settings(cls, settings: Settings) -> "_SettingsResource":
        """The resource holding `settings` (tuples become lists)."""
        return cls(**{f.name: list(v) if isinstance(v := getattr(settings, f.name), tuple) else v for f in fields(Settings)})

    def settings(self) -> Settings:
        """These values as `pipeline.run.settings.Settings`."""
        return Settings(**{f.name: getattr(self, f.name) for f in fields(Settings)})

    def run_config(self) -> RunConfig:
        return self.settings().run_config()

    def context(self, store, engine, policy_registry=None) -> RoundContext:
        registry = policy_registry.registry() if policy_registry is not None else store.registry()
        from assets.resources import engine_options
        from pipeline.learn.views import check_verdict_training

        ctx = RoundContext(Path(store.root()), self.run_config(), engine.pool(engine_options(self)), registry)
        view = ctx.config.view
        if view.relabel_verdicts or view.verifier_replay:  # the launchpad's settings, as `maxit run` checks them
            check_verdict_training(ctx.task(), view)  # (the task is built only then: a file task reads its file)
        return ctx


RunSettings = create_model(
    "RunSettings",
    __base__=_SettingsResource,
    __doc__="Settings of an expert-iteration run (pipeline.run.settings.Settings).",
    __module__=__name__,
    **{name: _pydantic_field(hint, default, help_text) for name, hint, default, help_text in settings_fields()},
)
