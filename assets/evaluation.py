import dagster as dg
import polars as pl

from assets.config import RunSettings
from assets.metadata import line_plot_png, md_image, md_table
from assets.partitions import round_of, rounds
from assets.resources import EngineResource, PolicyRegistryResource, StoreResource
from pipeline.rounds import evaluate_base, stage_evaluation
from pipeline.store import scan_table


PLOTTED = ("accuracy", "accuracy_greedy", "accuracy_hint", "verdict_accuracy", "verdict_balanced_accuracy")
"""Evaluation metrics drawn round by round in the asset's metadata."""


@dg.asset(partitions_def=rounds, group_name="expert_iteration", deps=["policy"], kinds={"polars"})
def evaluation(context: dg.AssetExecutionContext, settings: RunSettings, store: StoreResource, engine: EngineResource, policy_registry: PolicyRegistryResource
) -> dg.MaterializeResult:
    """Held-out accuracy of the round's checkpoints (Solver without hints, at the sampling
    temperature; Verifier verdict accuracy). The starting checkpoint is evaluated once as round -1."""
    r = round_of(context)
    store.pull()
    ctx = settings.context(store, engine, policy_registry)
    evaluate_base(ctx)
    df = stage_evaluation(ctx, r)
    store.publish(r)  # round -1's evaluation, then round r's: the round is complete at the URL
    history = (
        scan_table(store.root(), "evaluation")
        .filter(pl.col("metric").is_in(PLOTTED))
        .collect()
        .pivot(on="metric", index="round", values="value", aggregate_function="first")
        .sort("round")
    )
    history = history.select("round", *[m for m in PLOTTED if m in history.columns])
    series = {m: list(zip(history["round"].to_list(), history[m].to_list())) for m in history.columns if m != "round"}
    plot = line_plot_png(series, "held-out accuracy per round (round -1: the starting model)")
    value = lambda m: float(v[0]) if (v := df.filter(pl.col("metric") == m)["value"]).len() else None  # noqa: E731
    return dg.MaterializeResult(
        metadata={
            "dagster/row_count": df.height,
            "path": store.location(r, "evaluation"),
            # numbers: the UI plots each across the rounds (the asset's Plots tab)
            "solver_accuracy": value("accuracy"),
            "solver_accuracy_greedy": value("accuracy_greedy"),
            "verifier_balanced_accuracy": value("verdict_balanced_accuracy"),
            "accuracy_plot": dg.MetadataValue.md(md_image(plot, "accuracy per round") + "\n\n" + md_table(history).value),
            "metrics": md_table(df.select("agent_id", "metric", "value", "n")),
        }
    )
