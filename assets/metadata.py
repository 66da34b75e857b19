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


PLOT_COLOURS = ((31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189), (140, 86, 75))


def line_plot_png(series: dict[str, list[tuple[float, float]]], title: str, size: tuple[int, int] = (620, 300), y_range: tuple[float, float] = (0.0, 1.0)) -> bytes:
    """A small PNG line chart of `series` (name -> [(x, y), ...]) with a legend, drawn with PIL
    (no plotting library in the asset's process). Nulls (y None) are left out."""
    import io

    from PIL import Image, ImageDraw

    w, h = size
    left, right, top, bottom = 44, 190, 26, 28
    img = Image.new("RGB", size, "white")
    d = ImageDraw.Draw(img)
    d.text((left, 6), title, fill="black")
    points = {k: [(x, y) for x, y in v if y is not None] for k, v in series.items()}
    xs = [x for v in points.values() for x, _ in v] or [0.0, 1.0]
    x0, x1 = min(xs), max(xs)
    x1 = x1 if x1 > x0 else x0 + 1
    y0, y1 = y_range
    px = lambda x: left + (x - x0) / (x1 - x0) * (w - left - right)  # noqa: E731
    py = lambda y: h - bottom - (min(max(y, y0), y1) - y0) / (y1 - y0) * (h - top - bottom)  # noqa: E731
    d.rectangle([left, top, w - right, h - bottom], outline=(120, 120, 120))
    for i in range(5):
        y = y0 + (y1 - y0) * i / 4
        d.line([left, py(y), w - right, py(y)], fill=(230, 230, 230))
        d.text((4, py(y) - 6), f"{y:.2f}", fill="black")
    for x in sorted(set(xs)):
        d.text((px(x) - 4, h - bottom + 6), f"{x:g}", fill="black")
    for i, (name, pts) in enumerate(points.items()):
        colour = PLOT_COLOURS[i % len(PLOT_COLOURS)]
        xy = [(px(x), py(y)) for x, y in sorted(pts)]
        if len(xy) > 1:
            d.line(xy, fill=colour, width=2)
        for x, y in xy:
            d.ellipse([x - 3, y - 3, x + 3, y + 3], fill=colour)
        d.line([w - right + 10, top + 8 + 16 * i, w - right + 30, top + 8 + 16 * i], fill=colour, width=3)
        d.text((w - right + 34, top + 2 + 16 * i), name, fill="black")
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def md_image(png: bytes, alt: str) -> str:
    """Markdown of an inline PNG (a data URI: the Dagster UI renders it in the metadata panel)."""
    import base64

    return f"![{alt}](data:image/png;base64,{base64.b64encode(png).decode()})"
