import dagster as dg
import polars as pl

from assets.config import RunSettings
from assets.io import IO_MANAGER_KEY, TABLE_KEY
from assets.partitions import round_of, rounds
from assets.resources import EngineResource, PolicyRegistryResource, StoreResource
from pipeline.run.rounds import stage_training_view
from pipeline.store import TableInfo


@dg.asset(partitions_def=rounds, group_name="expert_iteration", ins={"advantages": dg.AssetIn("advantages")}, kinds={"arrow"},
          io_manager_key=IO_MANAGER_KEY, metadata={TABLE_KEY: "training_view"})
def training_view(context: dg.AssetExecutionContext, advantages: pl.DataFrame, settings: RunSettings, store: StoreResource, engine: EngineResource,
                  policy_registry: PolicyRegistryResource) -> dg.Output[TableInfo]:
    """Context-swapped training rows: the training context rebuilt by each strategy, the sampled
    completion tokens and their logprobs kept verbatim."""
    r = round_of(context)
    ctx = settings.context(store, r, engine, policy_registry)
    view, stats = stage_training_view(ctx, r, advantages)
    return dg.Output(
        ctx.tables.info(r, "training_view", view.num_rows),
        metadata={
            "context_swapped": stats.n_context_swapped,
            "dropped_too_long": stats.n_too_long,
            "dropped_zero_advantage": stats.n_zero_advantage,
            "dropped_not_trainable": stats.n_not_trainable,
            "rows_by_strategy": dg.MetadataValue.json(dict(stats.by_strategy)),
        },
    )
