import math

import dagster as dg

from assets.config import RunSettings
from assets.metadata import md_table
from assets.partitions import round_of, rounds
from assets.resources import EngineResource, PolicyRegistryResource, StoreResource
from pipeline.run.rounds import stage_policy
from pipeline.store import checkpoint_dir


@dg.asset(partitions_def=rounds, group_name="expert_iteration", deps=["training_view"], kinds={"pytorch"})
def policy(
    context: dg.AssetExecutionContext, settings: RunSettings, store: StoreResource, engine: EngineResource, policy_registry: PolicyRegistryResource
) -> dg.MaterializeResult:
    """One training run per policy, from the checkpoint the registry holds for the previous
    round; the new checkpoints are registered as round r."""
    r = round_of(context)
    ctx = settings.context(store, r, engine, policy_registry)
    ctx.tables.pull()
    results = stage_policy(ctx, r, ctx.tables.read(r, "training_view").to_arrow())  # on a URL store the registry uploads each checkpoint
    ctx.tables.publish(r)
    meta: dict = {}
    for pid, res in results.items():
        meta[f"{pid}/checkpoint"] = dg.MetadataValue.path(str(checkpoint_dir(store.path, r, pid)))
        meta[f"{pid}/parent"] = dg.MetadataValue.path(str(res.parent))
        meta[f"{pid}/rows"] = res.n_rows
        meta[f"{pid}/steps"] = res.steps
        meta[f"{pid}/mean_loss"] = None if math.isnan(res.mean_loss) else float(res.mean_loss)
        meta[f"{pid}/tokens_per_second"] = round(res.tokens_per_second, 1)
    meta["ratio_diagnostics"] = md_table(ctx.tables.read(r, "ratio_diagnostics"))
    context.log.info(f"registered round {r}: {[str(res.checkpoint) for res in results.values()]}")
    return dg.MaterializeResult(metadata=meta)
