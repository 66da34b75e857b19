import dagster as dg
import polars as pl

from assets.config import RunSettings
from assets.io import IO_MANAGER_KEY, TABLE_KEY
from assets.metadata import line_plot_png, md_image, md_table
from assets.partitions import round_of, rounds
from assets.resources import EngineResource, PolicyRegistryResource, StoreResource
from pipeline.run.rounds import evaluate_base, stage_evaluation
from pipeline.store import TableInfo


# `deps`, not an input: what it evaluates is the policy's checkpoints, which the registry holds,
# not the policy asset's table (its ratio diagnostics)
@dg.asset(partitions_def=rounds, group_name="expert_iteration", deps=["policy"], kinds={"polars"}, io_manager_key=IO_MANAGER_KEY,
          metadata={TABLE_KEY: "evaluation"})
def evaluation(context: dg.AssetExecutionContext, settings: RunSettings, store: StoreResource, engine: EngineResource, policy_registry: PolicyRegistryResource
) -> dg.Output[TableInfo]:
    """Held-out metrics of the round's checkpoints (the workflow's: math, the Solver's accuracy
    without hints at the sampling temperature and the Verifier's verdict accuracy; others, team
    success and each agent's reward). The starting checkpoint is evaluated once as round -1. The
    metadata holds the numbers of the round table (`Workflow.table_metrics`), plotted by the UI."""
    r = round_of(context)
    ctx = settings.context(store, r, engine, policy_registry)
    evaluate_base(ctx)
    df = stage_evaluation(ctx, r)  # published by the IO manager: round -1's evaluation, then round r's (the round complete at the URL)
    shown = ctx.workflow().table_metrics
    columns = {(agent, metric): column for agent, metric, column in shown}
    ev = ctx.tables.scan("evaluation").collect()
    ev = ev.with_columns(pl.struct("agent_id", "metric").map_elements(lambda k: columns.get((k["agent_id"], k["metric"])), return_dtype=pl.String).alias("column"))
    ev = ev.filter(pl.col("column").is_not_null())
    history = ev.pivot(on="column", index="round", values="value", aggregate_function="first").sort("round") if ev.height else pl.DataFrame({"round": []})
    history = history.select("round", *[c for c in columns.values() if c in history.columns])
    series = {m: list(zip(history["round"].to_list(), history[m].to_list())) for m in history.columns if m != "round"}
    plot = line_plot_png(series, "held-out metrics per round (round -1: the starting model)")

    def value(agent: str, metric: str) -> float | None:
        v = df.filter(pl.col("agent_id") == agent, pl.col("metric") == metric)["value"]
        return float(v[0]) if v.len() else None

    return dg.Output(
        ctx.tables.info(r, "evaluation", df.height),
        metadata={
            # numbers: the UI plots each across the rounds (the asset's Plots tab)
            **{column: value(agent, metric) for agent, metric, column in shown},
            "accuracy_plot": dg.MetadataValue.md(md_image(plot, "accuracy per round") + "\n\n" + md_table(history).value),
            "metrics": md_table(df.select("agent_id", "metric", "value", "n")),
        },
    )
