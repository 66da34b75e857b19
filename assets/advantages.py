import dagster as dg

from assets.config import RunSettings
from assets.metadata import md_table, table_metadata
from assets.partitions import round_of, rounds
from assets.resources import EngineResource, StoreResource
from pipeline.learn.advantages import advantage_metrics
from pipeline.run.rounds import stage_advantages


@dg.asset(partitions_def=rounds, group_name="expert_iteration", deps=["rollouts"], kinds={"polars"})
def advantages(context: dg.AssetExecutionContext, settings: RunSettings, store: StoreResource, engine: EngineResource) -> dg.MaterializeResult:
    """Group-relative advantages per (uid, strategy, agent_id, turn) group (the key is configurable; a group never spans strategies), with each row's membership weight."""
    r = round_of(context)
    ctx = settings.context(store, r, engine)
    ctx.tables.pull()
    adv = stage_advantages(ctx, r, ctx.tables.read(r, "steps"))
    ctx.tables.publish(r)
    m = advantage_metrics(adv, ctx.config.advantage)
    return dg.MaterializeResult(
        metadata={
            **table_metadata(ctx.tables.info(r, "advantages", adv.height)),
            "group_key": "+".join(ctx.config.advantage.group_key),
            "by_agent_strategy": md_table(m.select("agent_id", "strategy", "members", "reward_mean", "groups", "zero_std_frac", "all_good_frac", "all_bad_frac")),
        }
    )
