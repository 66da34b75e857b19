import time

import dagster as dg
import polars as pl

from assets.config import RunSettings
from assets.metadata import md_table, reward_by_agent_strategy
from assets.partitions import round_of, rounds
from assets.resources import EngineResource, PolicyRegistryResource, StoreResource
from pipeline.rounds import stage_rollouts
from pipeline.store import read_table, table_path


@dg.asset(partitions_def=rounds, group_name="expert_iteration", deps=["problems"], kinds={"vllm"})
def rollouts(context: dg.AssetExecutionContext, settings: RunSettings, store: StoreResource, engine: EngineResource, policy_registry: PolicyRegistryResource
) -> dg.MaterializeResult:
    """Every agent call of the round (the `steps` table): the team acting on the problems under
    every search strategy, with token ids and sampling logprobs."""
    r = round_of(context)
    ctx = settings.context(store, engine, policy_registry)
    t0 = time.perf_counter()
    steps = pl.from_arrow(stage_rollouts(ctx, r, read_table(table_path(store.root(), r, "problems"))))
    seconds = time.perf_counter() - t0
    tokens = int(steps["completion_ids"].list.len().sum())
    return dg.MaterializeResult(
        metadata={
            "dagster/row_count": steps.height,
            "path": str(table_path(store.root(), r, "steps")),
            "completion_tokens": tokens,
            "tokens_per_second": round(tokens / seconds, 1),
            "engine": steps["engine"][0] if steps.height else "",
            "reward_by_agent_strategy": md_table(reward_by_agent_strategy(steps)),
        }
    )
