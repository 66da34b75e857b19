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

    def pool(self) -> EnginePool:
        if self.engine not in ("auto", "vllm", "hf"):
            raise dg.Failure(f"EngineResource.engine must be 'auto', 'vllm' or 'hf', got {self.engine!r}")
        if self.engine not in _POOLS:
            _POOLS[self.engine] = EnginePool(self.engine)
        return _POOLS[self.engine]


class PolicyRegistryResource(dg.ConfigurableResource):
    """Which checkpoint each policy has after each round (round -1: the starting model)."""

    store: StoreResource

    def registry(self) -> PolicyRegistry:
        return PolicyRegistry(self.store.root())


def close_engines() -> None:
    for pool in _POOLS.values():
        pool.close()
    _POOLS.clear()
