import dagster as dg

from assets.config import RunSettings
from assets.metadata import table_metadata
from assets.partitions import round_of, rounds
from assets.resources import EngineResource, PolicyRegistryResource, StoreResource
from pipeline.run.rounds import stage_training_view


@dg.asset(partitions_def=rounds, group_name="expert_iteration", deps=["advantages"], kinds={"arrow"})
def training_view(context: dg.AssetExecutionContext, settings: RunSettings, store: StoreResource, engine: EngineResource, policy_registry: PolicyRegistryResource
) -> dg.MaterializeResult:
    """Context-swapped training rows: the training context rebuilt by each strategy, the sampled
    completion tokens and their logprobs kept verbatim."""
    r = round_of(context)
    ctx = settings.context(store, r, engine, policy_registry)
    ctx.tables.pull()
    view, stats = stage_training_view(ctx, r, ctx.tables.read(r, "advantages"))
    ctx.tables.publish(r)
    return dg.MaterializeResult(
        metadata={
            **table_metadata(ctx.tables.info(r, "training_view", view.num_rows)),
            "context_swapped": stats.n_context_swapped,
            "dropped_too_long": stats.n_too_long,
            "dropped_zero_advantage": stats.n_zero_advantage,
            "dropped_not_trainable": stats.n_not_trainable,
            "rows_by_strategy": dg.MetadataValue.json(dict(stats.by_strategy)),
        }
    )
