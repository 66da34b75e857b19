"""Dagster definitions of maxit: one expert-iteration round = six partitioned assets.

`dagster dev` (through `maxit ui`) finds this module from pyproject.toml's [tool.dagster]."""

from __future__ import annotations

import os

import dagster as dg

from assets.advantages import advantages
from assets.checks import all_checks
from assets.config import RunSettings
from assets.evaluation import evaluation
from assets.io import IO_MANAGER_KEY, RoundTablesIOManager
from assets.policy import policy
from assets.problems import problems
from assets.resources import EngineResource, PolicyRegistryResource, StoreResource
from assets.rollouts import rollouts
from assets.sensors import make_iteration_schedule, make_next_round_sensor, round_job
from assets.training_view import training_view

ROUND_ASSETS = [problems, rollouts, advantages, training_view, policy, evaluation]
MAX_ROUNDS = int(os.environ.get("MAXIT_MAX_ROUNDS", "5"))
STORE = os.environ.get("MAXIT_STORE", "runs/default")
ENGINE = os.environ.get("MAXIT_ENGINE", "auto")


def make_resources(store: str = STORE, engine: str = ENGINE, settings: RunSettings | None = None) -> dict:
    store_res = StoreResource(path=store)
    return {
        "store": store_res,
        "engine": EngineResource(engine=engine),
        "policy_registry": PolicyRegistryResource(store=store_res),
        IO_MANAGER_KEY: RoundTablesIOManager(store=store_res),
        "settings": settings or RunSettings(),
    }


_RESOURCES = make_resources()

defs = dg.Definitions(
    assets=ROUND_ASSETS,
    asset_checks=all_checks,
    jobs=[round_job],
    sensors=[make_next_round_sensor(MAX_ROUNDS, _RESOURCES["settings"])],
    schedules=[make_iteration_schedule(MAX_ROUNDS, settings=_RESOURCES["settings"])],
    resources=_RESOURCES,
)
