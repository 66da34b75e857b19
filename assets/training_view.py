import dagster as dg

from assets.config import RunSettings
from assets.partitions import round_of, rounds
from assets.resources import EngineResource, PolicyRegistryResource, StoreResource
from pipeline.run.rounds import stage_training_view
from pipeline.store import read_table, table_path


@dg.asset(partitions_def=rounds, group_name="expert_iteration", deps=["advantages"], kinds={"arrow"})
def training_view(context: dg.AssetExecutionContext, settings: RunSettings, store: StoreResource, engine: EngineResource, policy_registry: PolicyRegistryResource
) -> dg.MaterializeResult:
    """Context-swapped training rows: the training context rebuilt by each strategy, the sampled
    completion tokens and their logprobs kept verbatim."""
    r = round_of(context)
    store.pull()
    ctx = settings.context(store, engine, policy_registry)
    view, stats = stage_training_view(ctx, r, read_table(table_path(store.root(), r, "advantages")))
    store.publish(r)
    return dg.MaterializeResult(
        metadata={
            "dagster/row_count": view.num_rows,
            "path": store.location(r, "training_view"),
            "context_swapped": stats.n_context_swapped,
            "dropped_too_long": stats.n_too_long,
            "dropped_zero_advantage": stats.n_zero_advantage,
            "dropped_not_trainable": stats.n_not_trainable,
            "rows_by_strategy": dg.MetadataValue.json(dict(stats.by_strategy)),
        }
    )
