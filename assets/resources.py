"""Resources: where the tables live (and the store's writer lock, held while a step runs), which
engine samples, and the policy registry."""


import os
from pathlib import Path

import dagster as dg
from pydantic import PrivateAttr

from pipeline.config import RunConfig
from pipeline.engines.pool import EnginePool
from pipeline.store import Tables
from pipeline.store.registry import PolicyRegistry

# One engine pool per (engine, process): in-process runs of consecutive rounds reuse the loaded
# vLLM engine and only swap weights.
_POOLS: dict[str, EnginePool] = {}


class StoreResource(dg.ConfigurableResource):
    """The run's store: `<path>/round=<r>/<table>.parquet` and `<path>/checkpoints/`. `path` is a
    folder, or the URL of a store on an fsspec filesystem (`s3://bucket/run`, `gs://...`,
    `memory://...`): the stages then work in its local working copy (`root()`), each asset
    starts with `tables().pull()` (what the URL holds and the working copy lacks) and ends with
    `tables().publish(r)` (the tables it wrote, one object each, the round's evaluation last)."""

    path: str = "runs/default"

    _lock: object = PrivateAttr(default=None)

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        """Hold the store's writer lock (`pipeline.store.lock`) while the step runs, so that a UI run
        never writes beside a `maxit run` or another UI run, and refuse to start when another
        writer holds it. In `maxit run`'s own process the lock is already held (re-entrant); its
        step processes (`--shards`) join it through `TOKEN_ENV`; the step processes of one UI
        run share it by run id. Between two steps of a UI run the lock is free: another writer
        starting then makes the run's next step fail, not write beside it."""
        from pipeline.store.lifeline import hold_lifeline
        from pipeline.store.lock import TOKEN_ENV, acquire

        hold_lifeline("step process")  # a step process of `maxit run` (--shards) dies with it; a no-op in the run's own
        run = context.run
        if run is None:  # built outside a run (a test's build_resources): no writer to stand for
            return
        command = f"Dagster run {run.run_id} of job {run.job_name}"
        token = os.environ.get(TOKEN_ENV) or f"dagster-run-{run.run_id}"
        self._lock = acquire(self.root(), command=command, token=token)

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def tables(self) -> Tables:
        """The store's tables (`pipeline.store.Tables`: paths, reads, writes, pull and publish)."""
        return Tables(self.path)

    def root(self) -> Path:
        """The folder the stages read and write: the store, or a URL store's working copy."""
        return self.tables().root

    def registry(self) -> PolicyRegistry:
        return PolicyRegistry(self.path)


class EngineResource(dg.ConfigurableResource):
    """The rollout engine: "vllm", "hf" or "auto" (vLLM when importable)."""

    engine: str = "auto"

    def pool(self, options: dict | None = None) -> EnginePool:
        """The process's engine pool for this engine and these `EngineConfig` options (the run's
        scale-out settings: `engine_options`)."""
        if self.engine not in ("auto", "vllm", "hf"):
            raise dg.Failure(f"EngineResource.engine must be 'auto', 'vllm' or 'hf', got {self.engine!r}")
        options = self.pool_options(options)
        key = self.engine + "".join(f" {k}={v}" for k, v in sorted(options.items()))
        if key not in _POOLS:
            _POOLS[key] = EnginePool(self.engine, options)
        return _POOLS[key]

    @staticmethod
    def pool_options(options: dict | None) -> dict:
        """The options an engine pool is built with: those not 1 (every library's default)."""
        return {k: v for k, v in (options or {}).items() if v != 1}


def engine_options(config: RunConfig) -> dict:
    """The `EngineConfig` options of a run: `RunConfig.engine_options` of `config` (the settings
    resource's `run_config()`)."""
    return dict(config.engine_options)


class PolicyRegistryResource(dg.ConfigurableResource):
    """Which checkpoint each policy has after each round (round -1: the starting model)."""

    store: StoreResource

    def registry(self) -> PolicyRegistry:
        return self.store.registry()


def close_engines() -> None:
    for pool in _POOLS.values():
        pool.close()
    _POOLS.clear()
