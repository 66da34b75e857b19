import dagster as dg
import polars as pl

from assets.config import RunSettings
from assets.metadata import md_table
from assets.partitions import round_of, rounds
from assets.resources import EngineResource, PolicyRegistryResource, StoreResource
from pipeline.rounds import evaluate_base, stage_evaluation
from pipeline.store import scan_table, table_path


@dg.asset(partitions_def=rounds, group_name="expert_iteration", deps=["policy"], kinds={"polars"})
def evaluation(context: dg.AssetExecutionContext, settings: RunSettings, store: StoreResource, engine: EngineResource, policy_registry: PolicyRegistryResource
) -> dg.MaterializeResult:
    """Held-out accuracy of the round's checkpoints (Solver without hints, at the sampling
    temperature; Verifier verdict accuracy). The starting checkpoint is evaluated once as round -1."""
    r = round_of(context)
    ctx = settings.context(store, engine, policy_registry)
    evaluate_base(ctx)
    df = stage_evaluation(ctx, r)
    history = (
        scan_table(store.root(), "evaluation")
        .filter(pl.col("metric").is_in(["accuracy", "verdict_accuracy", "verdict_balanced_accuracy"]))
        .collect()
        .pivot(on="metric", index="round", values="value", aggregate_function="first")
        .sort("round")
    )
    acc = df.filter(pl.col("metric") == "accuracy")["value"]
    return dg.MaterializeResult(
        metadata={
            "dagster/row_count": df.height,
            "path": str(table_path(store.root(), r, "evaluation")),
            "solver_accuracy": float(acc[0]) if acc.len() else None,
            "metrics": md_table(df.select("agent_id", "metric", "value", "n")),
            "accuracy_by_round": md_table(history),
        }
    )
