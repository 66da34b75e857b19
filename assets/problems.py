import dagster as dg

from assets.config import RunSettings
from assets.partitions import round_of, rounds
from assets.resources import EngineResource, StoreResource
from pipeline.run.rounds import stage_problems


@dg.asset(partitions_def=rounds, group_name="expert_iteration", kinds={"polars"})
def problems(context: dg.AssetExecutionContext, settings: RunSettings, store: StoreResource, engine: EngineResource) -> dg.MaterializeResult:
    """The round's training problems: a fresh draw from the task's train split."""
    r = round_of(context)
    store.pull()
    df = stage_problems(settings.context(store, engine), r)
    store.publish(r)
    return dg.MaterializeResult(
        metadata={"dagster/row_count": df.height, "path": store.location(r, "problems"), "hinted": int(df["hint"].is_not_null().sum())}
    )
