import dagster as dg
import polars as pl

from assets.config import RunSettings
from assets.io import IO_MANAGER_KEY, TABLE_KEY
from assets.metadata import md_table
from assets.partitions import round_of, rounds
from assets.resources import EngineResource, StoreResource
from pipeline.learn.advantages import advantage_metrics
from pipeline.run.rounds import stage_advantages
from pipeline.store import TableInfo


@dg.asset(partitions_def=rounds, group_name="expert_iteration", ins={"steps": dg.AssetIn("rollouts")}, kinds={"polars"},
          io_manager_key=IO_MANAGER_KEY, metadata={TABLE_KEY: "advantages"})
def advantages(context: dg.AssetExecutionContext, steps: pl.DataFrame, settings: RunSettings, store: StoreResource, engine: EngineResource) -> dg.Output[TableInfo]:
    """Group-relative advantages per (uid, strategy, agent_id, turn) group (the key is configurable; a group never spans strategies), with each row's membership weight."""
    r = round_of(context)
    ctx = settings.context(store, r, engine)
    adv = stage_advantages(ctx, r, steps)
    m = advantage_metrics(adv, ctx.config.advantage)
    return dg.Output(
        ctx.tables.info(r, "advantages", adv.height),
        metadata={
            "group_key": "+".join(ctx.config.advantage.group_key),
            "by_agent_strategy": md_table(m.select("agent_id", "strategy", "members", "reward_mean", "groups", "zero_std_frac", "all_good_frac", "all_bad_frac")),
        },
    )
