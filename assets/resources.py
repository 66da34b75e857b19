"""Resources: where the tables live, which engine samples, and the policy registry."""


from pathlib import Path

import dagster as dg

from pipeline.registry import PolicyRegistry
from pipeline.engines.pool import EnginePool

# One engine pool per (engine, process): in-process runs of consecutive rounds reuse the loaded
# vLLM engine and only swap weights.
_POOLS: dict[str, EnginePool] = {}


class StoreResource(dg.ConfigurableResource):
    """The run's folder: `<path>/round=<r>/<table>.parquet` and `<path>/checkpoints/`."""

    path: str = "runs/default"

    def root(self) -> Path:
        return Path(self.path)


class EngineResource(dg.ConfigurableResource):
    """The rollout engine: "vllm", "hf" or "auto" (vLLM when importable)."""

    engine: str = "auto"

    def pool(self, options: dict | None = None) -> EnginePool:
        """The process's engine pool for this engine and these `EngineConfig` options (the run's
        scale-out settings: `engine_options`)."""
        if self.engine not in ("auto", "vllm", "hf"):
            raise dg.Failure(f"EngineResource.engine must be 'auto', 'vllm' or 'hf', got {self.engine!r}")
        options = {k: v for k, v in (options or {}).items() if v != 1}  # 1 is every library's default
        key = self.engine + "".join(f" {k}={v}" for k, v in sorted(options.items()))
        if key not in _POOLS:
            _POOLS[key] = EnginePool(self.engine, options)
        return _POOLS[key]


def engine_options(settings) -> dict:
    """The `EngineConfig` options a run's settings pass to the engines: vLLM's tensor- and
    data-parallel sizes (the transformers engine ignores them)."""
    return {"tensor_parallel_size": int(settings.tensor_parallel_size), "data_parallel_size": int(settings.data_parallel_size)}


class PolicyRegistryResource(dg.ConfigurableResource):
    """Which checkpoint each policy has after each round (round -1: the starting model)."""

    store: StoreResource

    def registry(self) -> PolicyRegistry:
        return PolicyRegistry(self.store.root())


def close_engines() -> None:
    for pool in _POOLS.values():
        pool.close()
    _POOLS.clear()
