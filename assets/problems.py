import dagster as dg

from assets.config import RunSettings
from assets.io import IO_MANAGER_KEY, TABLE_KEY
from assets.partitions import round_of, rounds
from assets.resources import EngineResource, StoreResource
from pipeline.run.rounds import stage_problems
from pipeline.store import TableInfo


@dg.asset(partitions_def=rounds, group_name="expert_iteration", kinds={"polars"}, io_manager_key=IO_MANAGER_KEY, metadata={TABLE_KEY: "problems"})
def problems(context: dg.AssetExecutionContext, settings: RunSettings, store: StoreResource, engine: EngineResource) -> dg.Output[TableInfo]:
    """The round's training problems: a fresh draw from the task's train split (the `problems`
    table; the IO manager publishes it and records its rows and columns)."""
    r = round_of(context)
    ctx = settings.context(store, r, engine)
    df = stage_problems(ctx, r)
    return dg.Output(ctx.tables.info(r, "problems", df.height), metadata={"hinted": int(df["hint"].is_not_null().sum())})
