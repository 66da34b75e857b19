"""A store's report as markdown (`maxit report --markdown`): its round table
(`markdown_round_table`), then the team beside its budget-matched baselines and trained arms
(`baselines_summary`, also drawn by the HTML report; `baselines_markdown`), then the verdict
(`pipeline.reporting.verdict`)."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import polars as pl

from pipeline import store as st
from pipeline.errors import ConfigError, DataError
from pipeline.reporting.report import percent_columns, round_summary, table_metrics_of, workflow_metrics_of
from pipeline.reporting.verdict import played_arms, verdict_lines
from pipeline.run.arms import ARMS, arm_store, read_baselines, train_rows
from pipeline.run.experiment_record import EXPERIMENT_FILE, complete_rounds, is_store, read_experiment
from pipeline.store import BASE_ROUND

__all__ = ["markdown_round_table", "BASELINE_NAMES", "baselines_summary", "baselines_markdown"]


def markdown_round_table(store: str | Path, label: str | None = None) -> str:
    """The round table of a store (`round_summary` of its complete rounds and round -1) as a
    markdown table, after a one-line header naming the store (`label`, else its path), its
    workflow, algorithm and seed. Fractions are shown in percent, one decimal; round -1 is the
    starting model. Raises `DataError` when the store has no complete round."""
    root = Path(store)
    name = label or str(store)
    if not is_store(root):
        raise ConfigError(f"store {name}: not a store (no round folders, no {EXPERIMENT_FILE})")
    done = complete_rounds(root)
    if not done:
        raise DataError(f"store {name}: no completed round (no round=R/evaluation.parquet with R >= 0)")
    metrics, judged, reason = workflow_metrics_of(root)
    rounds = ([BASE_ROUND] if st.Tables(root).exists(BASE_ROUND, "evaluation") else []) + done
    table = round_summary(root, rounds, metrics, judged)
    settings = (read_experiment(root) or {}).get("settings", {})
    described = ", ".join(f"{key} {settings.get(key, 'not recorded')}" for key in ("workflow", "algorithm", "seed"))
    header = f"store {name}: {described}; {len(done)} complete round(s); fractions in percent, s_<stage> in seconds"
    if reason:
        header += f" (every held-out metric shown: {reason})"
    percent = percent_columns(table, [c for _a, _m, c in metrics])

    def cell(column: str, value) -> str:
        if value is None or (isinstance(value, float) and value != value):
            return ""
        if column == "round":
            return f"{value} (start)" if value == BASE_ROUND else str(value)
        if column in percent:
            return f"{100 * value:.1f}"
        if isinstance(value, float):
            return f"{value:.0f}" if column == "rollout_tok_s" else f"{value:.3f}"
        return str(value)

    def line(cells: Sequence[str]) -> str:
        return "|" + "|".join(f" {c} " if c else " " for c in cells) + "|"

    lines = [header, "", line(["round", *(f"`{c}`" for c in table.columns[1:])]), "|" + "---:|" * table.width]
    lines += [line([cell(c, v) for c, v in row.items()]) for row in table.iter_rows(named=True)]
    beside = baselines_markdown(root, name, metrics)
    return "\n".join(lines + (["", *beside] if beside else []))


BASELINE_NAMES = {
    "team": "team, untrained (played as the baselines are)",
    "single": "single agent, untrained, 1 call per turn",
    "best_of_k": "single agent, untrained, best-of-{m} majority vote",
    "self_refine": "single agent, untrained, self-refine x{m}",
}


def baselines_summary(store: str | Path, metrics: Sequence[tuple[str, str, str]] | None = None) -> tuple[pl.DataFrame, str] | None:
    """The team beside its budget-matched baselines, one row each (`who`, `calls` per held-out
    problem, `success`, `team_reward`, `note`): the rows of the store's `baselines` tables (round
    -1's baselines, then the trained team played as they are), the team's evaluation (its first round-table metric at the start and its last complete round) and
    the trained single agent's run (`<store>-single`, its last complete round) when there is one.
    Returns the rows and a line saying where the team's calls were counted; None when the store
    has no `baselines` table."""
    table = read_baselines(store)
    if table is None:
        return None
    rows: list[dict] = []
    k = float(table["team_calls"][0])
    for (round_, baseline), part in table.group_by("round", "baseline", maintain_order=True):
        value = {r["metric"]: r["value"] for r in part.iter_rows(named=True)}
        m = int(part["calls_per_call"][0])
        who = BASELINE_NAMES.get(baseline, baseline).format(m=m) if round_ == BASE_ROUND else f"{baseline}, round {round_} (played as the baselines are)"
        rows.append({"who": who, "calls": value.get("calls"), "success": value.get("success"), "team_reward": value.get("team_reward"), "note": part["note"][0]})
    metrics = metrics if metrics is not None else table_metrics_of(store)[0]
    rows += _evaluated(store, metrics, k, "team")
    team_rows = train_rows(store)
    for arm, label in ARMS.items():
        sibling = arm_store(store, arm)
        if not (is_store(sibling) and complete_rounds(sibling)):
            continue
        rows += _evaluated(sibling, table_metrics_of(sibling)[0], None, "trained single agent" if arm == "single" else label, team_rows, skip_start=True)
        for result in played_arms(sibling, arm):
            rows.append({"who": result.label, "calls": result.calls, "success": result.success, "team_reward": None,
                         "note": f"played from its round {result.round} on the team's held-out problems and draws; store {sibling}"})
    frame = pl.DataFrame(rows, schema={"who": pl.String, "calls": pl.Float64, "success": pl.Float64, "team_reward": pl.Float64, "note": pl.String})
    return frame, f"the team's calls per held-out problem: {k:.2f} ({table['calls_source'][0]})"


def _evaluated(store, metrics, calls: float | None, label: str, team_rows: dict[int, int] | None = None, skip_start: bool = False) -> list[dict]:
    """Rows for the first metric of `metrics` the store's evaluation holds: at the start (round
    -1, unless `skip_start`) and at its last complete round, with the rows it trained; with
    `team_rows` (the team's rows per round, `train_rows`), its rows and the team's round by round."""
    done = complete_rounds(Path(store))
    ev = st.Tables(store).scan("evaluation").collect() if st.Tables(store).has_any("evaluation") else None
    if ev is None:
        return []
    rows = []
    for agent, metric, column in metrics:
        picked = ev.filter((pl.col("agent_id") == agent) & (pl.col("metric") == metric))
        if picked.is_empty():
            continue
        for r in ([] if skip_start else [BASE_ROUND]) + done[-1:]:
            at = picked.filter(pl.col("round") == r)
            if at.is_empty():
                continue
            note = f"evaluation `{column}` ({agent} {metric})"
            if r != BASE_ROUND:
                note += _rows_note(store, done, team_rows)
                note += f"; store {store}" if skip_start else ""
            who = f"{label}, {'start' if r == BASE_ROUND else f'round {r}'}"
            # an agent's own metric (math: the Solver's one-call accuracy) is not at the team's calls
            rows.append({"who": who, "calls": calls if agent == "team" else None, "success": float(at["value"][0]), "team_reward": None, "note": note})
        break
    return rows


def _rows_note(store, done: Sequence[int], team_rows: dict[int, int] | None) -> str:
    """"; N training rows", or with `team_rows` the rows of each round beside the team's."""
    mine = {r: n for r, n in train_rows(store).items() if r in done}
    if not mine:
        return ""
    if team_rows is None:
        return f"; {sum(mine.values())} training rows"
    each = ", ".join(f"{r}: {n}/{team_rows[r] if r in team_rows else '-'}" for r, n in mine.items())
    return f"; training rows per round (its/the team's): {each}; in all {sum(mine.values())}/{sum(team_rows.get(r, 0) for r in mine)}"


def baselines_markdown(store: str | Path, name: str | None = None, metrics: Sequence[tuple[str, str, str]] | None = None) -> list[str]:
    """The lines `maxit report --markdown` prints under a store's round table: the team beside its
    budget-matched baselines (`baselines_summary`) as a markdown table; none when the store has no
    `baselines` table (`maxit baselines --store S` computes it)."""
    summary = baselines_summary(store, metrics)
    if summary is None:
        return []
    frame, where = summary

    def fmt(v, percent: bool) -> str:
        return "" if v is None or v != v else (f"{100 * v:.1f}" if percent else f"{v:.2f}")

    lines = [f"baselines (the starting model as a single agent at the team's budget; {where}; success in percent):", "",
             "| | calls/problem | success | team_reward | note |", "|---|---:|---:|---:|---|"]
    for r in frame.iter_rows(named=True):
        lines.append(f"| {r['who']} | {fmt(r['calls'], False)} | {fmt(r['success'], True)} | {fmt(r['team_reward'], False)} | {r['note'] or ''} |")
    return lines + [""] + verdict_lines(store, name)
