"""A self-contained HTML report comparing stores (`maxit report --out`).

The report is one HTML file with plotly.js inlined (it opens offline): held-out accuracy or team
success per round (each such metric the evaluation table has), per-agent held-out metrics (the
Verifier's balanced verdict accuracy, or each agent's mean reward), trajectory success per
strategy, importance-ratio diagnostics, rollout tokens/s and seconds per stage. Every figure draws
each store in its own colour. plotly is imported only here, when a report is built.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Sequence

import polars as pl

from pipeline import store as st
from pipeline.errors import ConfigError, DataError
from pipeline.reporting.experiments import changed_settings
from pipeline.reporting.report import trajectory_success
from pipeline.run.experiment_record import EXPERIMENT_FILE, complete_rounds, is_store, now_iso, read_experiment
from pipeline.run.timings import OLD_STAGE_LABELS, STAGES

__all__ = ["store_metrics", "build_report", "HEADLINE_METRICS", "AGENT_METRICS"]

HEADLINE_METRICS = ("accuracy", "accuracy_greedy", "accuracy_hint", "success", "success_greedy")
"""The held-out numbers drawn first when the evaluation table has them: the math workflows'
answer accuracy (sampled at the run's temperature, greedy, with the problem's hint) and any
workflow's team success (sampled, greedy)."""

AGENT_METRICS = ("verdict_balanced_accuracy", "reward")
"""Per-agent held-out numbers drawn second: a checking agent's balanced verdict accuracy (the
math Verifier's), else every agent's mean local reward (`evaluate_workflow`)."""

STAGE_ORDER = (*STAGES, "other")
"""The timings rows the seconds-per-stage figure stacks, in round order."""

# one colour per store (plotly's default qualitative palette, repeated past ten stores)
PALETTE = ("#636EFA", "#EF553B", "#00CC96", "#AB63FA", "#FFA15A", "#19D3F3", "#FF6692", "#B6E880", "#FF97FF", "#FECB52")
DASHES = ("solid", "dash", "dot", "dashdot", "longdash", "longdashdot")

LAYOUT = dict(template="plotly_white", height=420, legend=dict(orientation="h", y=-0.2), margin=dict(t=50, l=60, r=20, b=40))
"""The layout every figure shares."""

Data = Sequence[tuple[str, str, dict[str, pl.DataFrame]]]
"""(label, colour, `store_metrics`) of each store."""


def _scan(store: Path, table: str) -> pl.LazyFrame | None:
    tables = st.Tables(store)
    return tables.scan(table) if tables.has_any(table) else None


def store_metrics(store: str | Path) -> dict[str, pl.DataFrame]:
    """The per-round series a report draws, from the store's tables (a table the store lacks
    gives an empty frame):

    - `evaluation`: round, agent_id, metric, value (every metric; round -1 = start);
    - `success`: round, strategy, success (mean global reward of the trajectories);
    - `ratio`: round, policy_id and the overall importance-ratio diagnostics;
    - `timings`: round, stage, seconds;
    - `speed`: round, completion_tokens, rollout_seconds, tokens_per_s."""
    store = Path(store)
    out: dict[str, pl.DataFrame] = {}
    ev = _scan(store, "evaluation")
    out["evaluation"] = (
        ev.select("round", "agent_id", "metric", "value").collect().group_by("round", "agent_id", "metric").agg(pl.col("value").first()).sort("round", "agent_id", "metric")
        if ev is not None
        else pl.DataFrame(schema={"round": pl.Int32, "agent_id": pl.String, "metric": pl.String, "value": pl.Float64})
    )
    steps = _scan(store, "steps")
    if steps is not None:
        steps = steps.filter(pl.col("round") >= 0)
        out["success"] = (
            trajectory_success(steps)
            .group_by("round", "strategy")
            .agg(pl.col("global_reward").mean().alias("success"))
            .sort("round", "strategy")
            .collect()
        )
        tokens = steps.group_by("round").agg(pl.col("completion_ids").list.len().sum().cast(pl.Int64).alias("completion_tokens")).collect()
    else:
        out["success"] = pl.DataFrame(schema={"round": pl.Int32, "strategy": pl.String, "success": pl.Float64})
        tokens = pl.DataFrame(schema={"round": pl.Int32, "completion_tokens": pl.Int64})
    ratio = _scan(store, "ratio_diagnostics")
    out["ratio"] = (
        ratio.filter((pl.col("agent_id") == "*") & (pl.col("strategy") == "*"))
        .select("round", "policy_id", "mean_log_ratio", "first_step_log_ratio", "clip_fraction", "ess_fraction", "kl")
        .sort("round", "policy_id")
        .collect()
        if ratio is not None
        else pl.DataFrame(schema={"round": pl.Int32, "policy_id": pl.String})
    )
    timings = _scan(store, "timings")
    out["timings"] = (
        timings.filter(pl.col("round") >= 0).select("round", "stage", "seconds").with_columns(pl.col("stage").replace(OLD_STAGE_LABELS)).sort("round").collect()
        if timings is not None
        else pl.DataFrame(schema={"round": pl.Int32, "stage": pl.String, "seconds": pl.Float64})
    )
    rollout_s = out["timings"].filter(pl.col("stage") == "rollouts").select("round", pl.col("seconds").alias("rollout_seconds"))
    out["speed"] = (
        tokens.join(rollout_s, on="round", how="inner")
        .with_columns((pl.col("completion_tokens") / pl.col("rollout_seconds")).alias("tokens_per_s"))
        .sort("round")
    )
    return out



# -- the HTML report --------------------------------------------------------------------------


def _labels(stores: Sequence[Path]) -> list[str]:
    """Short, distinct names of the stores: their folder names, or their paths where two share
    a name."""
    names = [s.name or str(s) for s in stores]
    return [str(s) if names.count(n) > 1 else n for s, n in zip(stores, names)]


def _heldout_figure(data: Data):
    """Headline held-out metrics: one colour per store, one dash per metric."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for label, colour, m in data:
        ev = m["evaluation"]
        for j, metric in enumerate(HEADLINE_METRICS):
            s = ev.filter(pl.col("metric") == metric).sort("round")
            if s.height:
                fig.add_trace(go.Scatter(x=s["round"].to_list(), y=s["value"].to_list(), mode="lines+markers", name=f"{label} · {metric}",
                                         line=dict(color=colour, dash=DASHES[j % len(DASHES)]), legendgroup=label))
    fig.update_layout(title="Held-out accuracy / team success per round (round -1: the starting model)", xaxis_title="round", yaxis_title="fraction right", **LAYOUT)
    return fig


def _agents_figure(data: Data):
    """Per agent: a checker's balanced verdict accuracy (plain verdict accuracy where a store has
    no balanced one), else each agent's mean local reward."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for label, colour, m in data:
        ev = m["evaluation"]
        present = set(ev["metric"].to_list())
        metric = next((x for x in AGENT_METRICS if x in present), "verdict_accuracy")
        for j, agent in enumerate(sorted(set(ev.filter(pl.col("metric") == metric)["agent_id"].to_list()))):
            s = ev.filter(pl.col("metric") == metric, pl.col("agent_id") == agent).sort("round")
            fig.add_trace(go.Scatter(x=s["round"].to_list(), y=s["value"].to_list(), mode="lines+markers", name=f"{label} · {agent} · {metric}",
                                     line=dict(color=colour, dash=DASHES[j % len(DASHES)]), legendgroup=label))
    fig.update_layout(title="Per-agent held-out metrics per round (balanced verdict accuracy, or mean reward)", xaxis_title="round", yaxis_title="value", **LAYOUT)
    return fig


def _success_figure(data: Data):
    """Trajectory success: one panel per strategy (None when no store sampled any)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    strategies = sorted({s for _, _, m in data for s in m["success"]["strategy"].to_list()})
    if not strategies:
        return None
    fig = make_subplots(rows=1, cols=len(strategies), subplot_titles=strategies, shared_yaxes=True)
    for label, colour, m in data:
        for i, strategy in enumerate(strategies, 1):
            s = m["success"].filter(pl.col("strategy") == strategy)
            if s.height:
                fig.add_trace(go.Scatter(x=s["round"].to_list(), y=s["success"].to_list(), mode="lines+markers", name=label, line=dict(color=colour),
                                         legendgroup=label, showlegend=i == 1), row=1, col=i)
    fig.update_layout(title="Trajectory success per strategy per round (mean team reward of the round's trajectories)", **LAYOUT)
    return fig


def _ratio_figure(data: Data):
    """Ratio diagnostics: one panel per statistic, one dash per policy (None without any)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    stats = ("mean_log_ratio", "first_step_log_ratio", "clip_fraction", "ess_fraction", "kl")
    if not any(m["ratio"].height for _, _, m in data):
        return None
    fig = make_subplots(rows=1, cols=len(stats), subplot_titles=stats)
    for label, colour, m in data:
        r = m["ratio"]
        for j, pid in enumerate(sorted(set(r["policy_id"].to_list())) if r.height else []):
            s = r.filter(pl.col("policy_id") == pid)
            for i, stat in enumerate(stats, 1):
                fig.add_trace(go.Scatter(x=s["round"].to_list(), y=s[stat].to_list(), mode="lines+markers", name=f"{label} · {pid}",
                                         line=dict(color=colour, dash=DASHES[j % len(DASHES)]), legendgroup=f"{label}/{pid}", showlegend=i == 1),
                              row=1, col=i)
    fig.update_layout(title="Importance-ratio diagnostics of training (all agents and strategies of a policy)", **LAYOUT)
    return fig


def _speed_figure(data: Data):
    """Rollout tokens/s per round (None when no store has timings)."""
    import plotly.graph_objects as go

    if not any(m["speed"].height for _, _, m in data):
        return None
    fig = go.Figure()
    for label, colour, m in data:
        s = m["speed"]
        if s.height:
            fig.add_trace(go.Scatter(x=s["round"].to_list(), y=s["tokens_per_s"].to_list(), mode="lines+markers", name=label, line=dict(color=colour)))
    fig.update_layout(title="Rollout tokens/s per round (completion tokens / seconds of the rollouts stage)", xaxis_title="round", yaxis_title="tokens/s", **LAYOUT)
    return fig


def _stages_figure(data: Data):
    """Seconds per stage: one panel per store, stacked by stage (None when no store has timings)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    timed = [(label, m) for label, _, m in data if m["timings"].height]
    if not timed:
        return None
    fig = make_subplots(rows=1, cols=len(timed), subplot_titles=[label for label, _ in timed], shared_yaxes=True)
    stage_colours = dict(zip(STAGE_ORDER, PALETTE[::-1]))
    for i, (label, m) in enumerate(timed, 1):
        t = m["timings"]
        for stage in STAGE_ORDER:
            s = t.filter(pl.col("stage") == stage).sort("round")
            if s.height:
                fig.add_trace(go.Bar(x=s["round"].to_list(), y=s["seconds"].to_list(), name=stage, marker_color=stage_colours[stage],
                                     legendgroup=stage, showlegend=i == 1), row=1, col=i)
    fig.update_layout(barmode="stack", title="Seconds per stage per round", **LAYOUT)
    return fig


FIGURES = (
    ("heldout", _heldout_figure),
    ("agents", _agents_figure),
    ("success_by_strategy", _success_figure),
    ("ratio_diagnostics", _ratio_figure),
    ("rollout_speed", _speed_figure),
    ("time_per_stage", _stages_figure),
)
"""The report's sections in order: (name, function drawing its figure, or None when the stores
hold nothing for it)."""


def _figures(data: Data) -> list[tuple[str, object]]:
    """(name, plotly figure) of every section the stores hold data for, each store in its colour."""
    return [(name, fig) for name, draw in FIGURES if (fig := draw(data)) is not None]


def _settings_table(labels: Sequence[str], stores: Sequence[Path]) -> str:
    rows = []
    for label, colour, store in zip(labels, PALETTE * (len(stores) // len(PALETTE) + 1), stores):
        rec = read_experiment(store) or {}
        settings = changed_settings(rec["settings"]) if "settings" in rec else "(no experiment.json)"
        done = complete_rounds(store)
        rows.append(
            f"<tr><td><span style='color:{colour}'>&#9632;</span> {html.escape(label)}</td><td>{html.escape(str(store))}</td>"
            f"<td>{len(done)}</td><td>{html.escape(rec.get('engine', ''))}</td><td>{html.escape(settings)}</td></tr>"
        )
    head = "<tr><th>store</th><th>path</th><th>complete rounds</th><th>engine</th><th>settings (non-default)</th></tr>"
    return f"<table>{head}{''.join(rows)}</table>"


def _baselines_tables(labels: Sequence[str], stores: Sequence[Path]) -> str:
    """Each store's team beside its budget-matched baselines and trained arms (`baselines_summary`)
    and its verdict (`verdict_lines`), or a line saying how to compute them; with several stores
    that have baselines, the verdict over them (`verdict_across`: a team's seeds)."""
    from pipeline.reporting.markdown import baselines_summary
    from pipeline.reporting.verdict import verdict_across, verdict_lines

    def lines_html(lines: Sequence[str]) -> str:
        return "<p>" + "<br>".join(html.escape(line) for line in lines) + "</p>"

    parts = []
    for label, store in zip(labels, stores):
        summary = baselines_summary(store)
        if summary is None:
            parts.append(f"<p>{html.escape(label)}: no baselines computed (maxit baselines --store {html.escape(str(store))})</p>")
            continue
        frame, where = summary

        def fmt(v, percent: bool) -> str:
            return "" if v is None or v != v else (f"{100 * v:.1f}%" if percent else f"{v:.2f}")

        rows = "".join(
            f"<tr><td>{html.escape(r['who'])}</td><td>{fmt(r['calls'], False)}</td><td>{fmt(r['success'], True)}</td>"
            f"<td>{fmt(r['team_reward'], False)}</td><td>{html.escape(r['note'] or '')}</td></tr>"
            for r in frame.iter_rows(named=True)
        )
        head = "<tr><th></th><th>calls/problem</th><th>success</th><th>team_reward</th><th>note</th></tr>"
        parts.append(f"<h3>{html.escape(label)}: the team and its baselines</h3><p>{html.escape(where)}</p><table>{head}{rows}</table>")
        parts.append(lines_html(verdict_lines(store, label)))
    judged = [(label, store) for label, store in zip(labels, stores) if baselines_summary(store) is not None]
    if len(judged) > 1:
        parts.append(f"<h3>The verdict over the stores</h3>{lines_html(verdict_across([s for _, s in judged], [lb for lb, _ in judged]))}")
    return f"<section id='baselines'><h2>Budget-matched baselines</h2>{''.join(parts)}</section>"


def build_report(stores: Sequence[str | Path], out: str | Path, title: str = "maxit report") -> Path:
    """Write the HTML report of `stores` (one colour each) to `out`; returns its path. The page
    holds plotly.js itself, so it opens without a network."""
    try:
        import plotly  # noqa: F401
    except ImportError:
        raise ConfigError("maxit report needs plotly (a dependency of maxit: run scripts/setup.sh)") from None
    if not stores:
        raise ConfigError("build_report: give at least one store")
    paths = [Path(s) for s in stores]
    missing = [str(p) for p in paths if not is_store(p)]
    if missing:
        raise ConfigError(f"build_report: not a store (no round folders, no {EXPERIMENT_FILE}): {missing}")
    labels = _labels(paths)
    colours = [PALETTE[i % len(PALETTE)] for i in range(len(paths))]
    data = [(label, colour, store_metrics(p)) for label, colour, p in zip(labels, colours, paths)]
    parts = []
    for i, (name, fig) in enumerate(_figures(data)):
        fig.update_xaxes(dtick=1)  # rounds are whole numbers
        parts.append(f"<section id='{name}'>" + fig.to_html(full_html=False, include_plotlyjs=i == 0, div_id=f"fig-{name}") + "</section>")
    if not parts:
        raise DataError(f"build_report: the stores hold no tables to draw: {[str(p) for p in paths]}")
    style = ("body{font-family:sans-serif;margin:24px;max-width:1400px} table{border-collapse:collapse;font-size:13px}"
             " td,th{border:1px solid #ccc;padding:4px 8px;text-align:left;vertical-align:top} section{margin-top:24px}")
    page = (
        f"<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>{html.escape(title)}</title><style>{style}</style></head><body>"
        f"<h1>{html.escape(title)}</h1><p>Generated {html.escape(now_iso())}.</p>{_settings_table(labels, paths)}{_baselines_tables(labels, paths)}{''.join(parts)}</body></html>\n"
    )
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    st.atomic_write_text(out, page)
    return out
