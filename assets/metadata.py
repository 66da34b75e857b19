"""Small helpers that turn tables into asset metadata (markdown tables read well in the UI)."""

from __future__ import annotations

import dagster as dg
import polars as pl


def md_table(df: pl.DataFrame, float_fmt: str = "{:.3f}") -> dg.MetadataValue:
    cols = df.columns
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for row in df.iter_rows():
        cells = [float_fmt.format(v) if isinstance(v, float) else str(v) for v in row]
        lines.append("| " + " | ".join(cells) + " |")
    return dg.MetadataValue.md("\n".join(lines))


def reward_by_agent_strategy(df: pl.DataFrame) -> pl.DataFrame:
    return (
        df.group_by("agent_id", "strategy")
        .agg(
            pl.len().alias("rows"),
            pl.col("reward").mean().alias("reward"),
            pl.col("global_reward").mean().alias("global"),
            pl.col("local_reward").mean().alias("local"),
        )
        .sort("agent_id", "strategy")
    )
