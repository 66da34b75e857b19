import dagster as dg

from assets.config import RunSettings
from assets.metadata import table_metadata
from assets.partitions import round_of, rounds
from assets.resources import EngineResource, StoreResource
from pipeline.run.rounds import stage_problems


@dg.asset(partitions_def=rounds, group_name="expert_iteration", kinds={"polars"})
def problems(context: dg.AssetExecutionContext, settings: RunSettings, store: StoreResource, engine: EngineResource) -> dg.MaterializeResult:
    """The round's training problems: a fresh draw from the task's train split."""
    r = round_of(context)
    ctx = settings.context(store, r, engine)
    ctx.tables.pull()
    df = stage_problems(ctx, r)
    ctx.tables.publish(r)
    return dg.MaterializeResult(metadata={**table_metadata(ctx.tables.info(r, "problems", df.height)), "hinted": int(df["hint"].is_not_null().sum())})
