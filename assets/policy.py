import math

import dagster as dg
import polars as pl

from assets.config import RunSettings
from assets.io import IO_MANAGER_KEY, TABLE_KEY
from assets.metadata import md_table
from assets.partitions import round_of, rounds
from assets.resources import EngineResource, PolicyRegistryResource, StoreResource
from pipeline.run.rounds import stage_policy
from pipeline.store import TableInfo, checkpoint_dir


@dg.asset(partitions_def=rounds, group_name="expert_iteration", ins={"training_view": dg.AssetIn("training_view")}, kinds={"pytorch"},
          io_manager_key=IO_MANAGER_KEY, metadata={TABLE_KEY: "ratio_diagnostics"})
def policy(
    context: dg.AssetExecutionContext, training_view: pl.DataFrame, settings: RunSettings, store: StoreResource, engine: EngineResource,
    policy_registry: PolicyRegistryResource,
) -> dg.Output[TableInfo]:
    """One training run per policy, from the checkpoint the registry holds for the previous
    round; the new checkpoints are registered as round r.

    What this asset makes is checkpoints, which are no table: they live in
    `<store>/checkpoints/round=<r>/<policy>` and the policy registry (a URL store's registry
    uploads each one), and the evaluation finds them there, not through an input. Its output, the
    one table the stage writes, is the round's `ratio_diagnostics` (importance-ratio diagnostics
    per policy, agent and strategy), which the IO manager publishes and describes; each
    checkpoint, its parent and its training numbers are in the metadata."""
    r = round_of(context)
    ctx = settings.context(store, r, engine, policy_registry)
    results = stage_policy(ctx, r, training_view.to_arrow())
    meta: dict = {}
    for pid, res in results.items():
        meta[f"{pid}/checkpoint"] = dg.MetadataValue.path(str(checkpoint_dir(store.path, r, pid)))
        meta[f"{pid}/parent"] = dg.MetadataValue.path(str(res.parent))
        meta[f"{pid}/rows"] = res.n_rows
        meta[f"{pid}/steps"] = res.steps
        meta[f"{pid}/mean_loss"] = None if math.isnan(res.mean_loss) else float(res.mean_loss)
        meta[f"{pid}/tokens_per_second"] = round(res.tokens_per_second, 1)
    diagnostics = ctx.tables.read(r, "ratio_diagnostics")
    meta["ratio_diagnostics"] = md_table(diagnostics)
    context.log.info(f"registered round {r}: {[str(res.checkpoint) for res in results.values()]}")
    return dg.Output(ctx.tables.info(r, "ratio_diagnostics", diagnostics.height), metadata=meta)
