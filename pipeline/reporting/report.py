"""The round table of a store, read back from its tables: `round_summary` (one row per round:
the workflow's held-out metrics, trajectory success per strategy, training counts, rows whose
workflow code raised, rollout speed, seconds per stage), the console's line per finished round
(`round_line`, with `reward_error_lines` when the workflow's code raised), the table `maxit run`
prints at its end (`console_table`: what fits 120 characters). The whole table as markdown, with
the team's baselines and arms beside it, is `pipeline.reporting.markdown`."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Collection, Mapping, Sequence

import polars as pl

from pipeline import store as st
from pipeline.run import LINE_WIDTH
from pipeline.reporting.regression import round_regressions
from pipeline.run.experiment_record import EXPERIMENT_FILE, read_experiment, stored_settings
from pipeline.run.timings import OLD_STAGE_LABELS, STAGES, TIMING_ROWS, seconds_column

__all__ = [
    "trajectory_success",
    "round_summary",
    "round_line",
    "reward_error_lines",
    "console_table",
    "table_metrics_of",
    "workflow_metrics_of",
    "percent_columns",
    "STAGE_COLUMNS",
    "TRAIN_COLUMNS",
    "REGRESSED_COLUMN",
]

STAGE_COLUMNS = {row: seconds_column(row) for row in TIMING_ROWS}
"""Column of the round table holding each timings row's seconds: `s_<stage>` (the substages'
columns, s_sandbox, s_engine_start and s_engine_swap, are parts of s_rollouts and s_evaluation)."""

TRAIN_COLUMNS = {"rows": "train_rows", "steps": "train_steps"}
"""Columns of the round table holding a round's training rows and optimizer steps (summed over
its policies, from the metrics its policy registry entries keep)."""

ERRORS_COLUMN = "reward_errors"
"""Column of the round table counting the round's `steps` rows with a `reward_error`: calls whose
workflow code (or task reward) raised, hung or returned nonsense."""

REGRESSED_COLUMN = "regressed"
"""Column of the round table naming the round's held-out metrics that fell from their best by more
than two standard errors (`pipeline.reporting.regression.round_regressions`); present when a round has one."""


def trajectory_success(steps: pl.LazyFrame) -> pl.LazyFrame:
    """One row per trajectory (round, strategy, traj_uid, global_reward): its team reward at the
    end, the global reward of the first row of its last turn (every row of that turn carries the
    team reward at the end; where the environment gives one per side, a competitive game's, that
    row is the first agent's, the side the contract reads: `Env.team_reward`). A tree counts once,
    as the path its selected candidates took: the team reward right after its last selected step
    (its `traj_uid` is the problem's `uid`). Rows are taken in the table's order, which is step
    order."""
    tree = pl.col("strategy") == "tree"
    last_turn = pl.col("global_reward").filter(pl.col("turn") == pl.col("turn").max()).first()
    ordinary = steps.filter(~tree).group_by("round", "strategy", "traj_uid").agg(last_turn.alias("global_reward"))
    trees = (
        steps.filter(tree & pl.col("selected"))
        .group_by("round", "strategy", "uid")
        .agg(pl.col("global_reward").last())
        .rename({"uid": "traj_uid"})
    )
    return pl.concat([ordinary, trees.select(ordinary.collect_schema().names())])


def round_summary(store: str | Path, rounds: Sequence[int], metrics: Sequence[tuple[str, str, str]] | None = None,
                  judged: Collection[tuple[str, str]] | None = None) -> pl.DataFrame:
    """One row per round: the workflow's held-out metrics (`metrics`: (agent_id, metric, column)
    triples, by default the math workflow's: Solver accuracy, Verifier verdict accuracies), the
    metrics that fell from their best over `rounds` by more than two standard errors (the
    `regressed` column, when a round has one; `judged`: the workflow's higher-is-better pairs,
    `round_regressions`), trajectory success by strategy, training rows and optimizer steps, the rows with a
    `reward_error`, rollout tokens/s (completion tokens over the rollouts stage's seconds) and the
    seconds of every stage (the `timings` table; a store written before the stages had one name
    each is read with its old labels mapped)."""
    tables = st.Tables(store)
    rounds = list(rounds)
    if metrics is None:
        from pipeline.workflows.math import MathWorkflow

        metrics = MathWorkflow.table_metrics
    evaluation = tables.scan("evaluation").filter(pl.col("round").is_in(rounds)).collect()
    table = _heldout(evaluation, metrics)
    regressed = round_regressions(evaluation, metrics, judged=judged)
    if regressed:
        column = pl.DataFrame({"round": list(regressed), REGRESSED_COLUMN: list(regressed.values())}, schema={"round": pl.Int32, REGRESSED_COLUMN: pl.String})
        table = table.join(column, on="round", how="left")
    trained = [r for r in rounds if r >= 0]
    if trained:
        steps = tables.scan("steps").filter(pl.col("round").is_in(trained))
        table = table.join(_success(steps), on="round", how="left").join(_reward_errors(steps), on="round", how="left")
        counts = _training_counts(tables.root, trained)
        if counts is not None:
            table = table.join(counts, on="round", how="left")
        if tables.has_any("timings"):
            table = table.join(_seconds(tables, steps, trained), on="round", how="left")
    return table.sort("round")


def _heldout(ev: pl.DataFrame, metrics) -> pl.DataFrame:
    """round and one column per metric of `metrics` the evaluation rows `ev` hold."""
    columns = {(agent, metric): column for agent, metric, column in metrics}
    picked = ev.with_columns(pl.struct("agent_id", "metric").map_elements(lambda k: columns.get((k["agent_id"], k["metric"])), return_dtype=pl.String).alias("column"))
    picked = picked.filter(pl.col("column").is_not_null())
    if picked.height:
        table = picked.pivot(on="column", index="round", values="value", aggregate_function="first")
    else:
        table = pl.DataFrame({"round": sorted(set(ev["round"].to_list()))}, schema={"round": pl.Int32})
    return table.select("round", *[c for c in columns.values() if c in table.columns]).sort("round")


def _success(steps: pl.LazyFrame) -> pl.DataFrame:
    """round and success_<strategy>: the mean team reward of the round's trajectories."""
    success = trajectory_success(steps).group_by("round", "strategy").agg(pl.col("global_reward").mean()).collect()
    success = success.pivot(on="strategy", index="round", values="global_reward")
    # strategies in a fixed order (a pivot orders them by first appearance)
    success = success.select("round", *sorted(c for c in success.columns if c != "round"))
    return success.rename({c: f"success_{c}" for c in success.columns if c != "round"})


def _reward_errors(steps: pl.LazyFrame) -> pl.DataFrame:
    """round and the number of its rows with a `reward_error`."""
    return steps.group_by("round").agg(pl.col("reward_error").is_not_null().sum().cast(pl.Int64).alias(ERRORS_COLUMN)).collect()


def _seconds(tables: st.Tables, steps: pl.LazyFrame, rounds: Sequence[int]) -> pl.DataFrame:
    """round, rollout_tok_s and s_<stage> for each timings row the rounds recorded."""
    timings = (
        tables.scan("timings").filter(pl.col("round").is_in(rounds)).select("round", "stage", "seconds")
        .with_columns(pl.col("stage").replace(OLD_STAGE_LABELS)).collect()
    )
    tokens = steps.group_by("round").agg(pl.col("completion_ids").list.len().sum().alias("tokens")).collect()
    speed = timings.filter(pl.col("stage") == "rollouts").join(tokens, on="round").select("round", (pl.col("tokens") / pl.col("seconds")).alias("rollout_tok_s"))
    seconds = (
        timings.filter(pl.col("stage").is_in(list(STAGE_COLUMNS)))
        .with_columns(pl.col("stage").replace_strict(STAGE_COLUMNS), pl.col("seconds").round(0).cast(pl.Int64))
        .pivot(on="stage", index="round", values="seconds", aggregate_function="first")
    )
    seconds = seconds.select("round", *[c for c in STAGE_COLUMNS.values() if c in seconds.columns])
    return speed.join(seconds, on="round", how="full", coalesce=True)


def _training_counts(store: Path, rounds: Sequence[int]) -> pl.DataFrame | None:
    """round, train_rows, train_steps: the training metrics the policy registry keeps, summed
    over the round's policies; None when no entry of these rounds has them (a store trained
    before they were kept)."""
    from pipeline.store.registry import PolicyRegistry

    rows = [
        {"round": rec.round, **{column: rec.metrics.get(key) for key, column in TRAIN_COLUMNS.items()}}
        for rec in PolicyRegistry(store).records()
        if rec.round in rounds and any(key in rec.metrics for key in TRAIN_COLUMNS)
    ]
    if not rows:
        return None
    frame = pl.DataFrame(rows, schema={"round": pl.Int32, **{c: pl.Float64 for c in TRAIN_COLUMNS.values()}})
    return frame.group_by("round").agg(pl.col(c).sum().cast(pl.Int64) for c in TRAIN_COLUMNS.values())


def _is_fraction(value: float) -> bool:
    return 0.0 <= value <= 1.0


def _value(value: float | None, percent: bool) -> str:
    if value is None or value != value:  # NaN: a metric with no sample
        return "-"
    return f"{100 * value:.1f}%" if percent else f"{value:.3f}"


def round_line(
    row: Mapping[str, object],
    start: Mapping[str, object] | None,
    metrics: Sequence[tuple[str, str, str]],
    seconds: float | None = None,
    total_seconds: float | None = None,
    peak_mb: float | None = None,
    width: int = LINE_WIDTH,
) -> str:
    """The console's line for one finished round: `row` is the round's row of `round_summary`,
    `start` round -1's (the starting model), `metrics` the workflow's `table_metrics`. It shows
    the workflow's first held-out metric and its change since the start, its next metrics, the
    rows and optimizer steps trained, the round's seconds (and the run's so far) and the peak
    memory, e.g. `round 3 | solver_acc 81.8% (+37.5 since start) | greedy 94.5% | 1647 rows/14
    steps | 148s, 712s in all | peak 2210 MB`; a round whose workflow code raised says how many
    rows carry a `reward_error` (always shown; `reward_error_lines` gives the first error and the
    query that lists them), and a round whose held-out metrics fell from their best by more than
    two standard errors names them at the end (`under best by > 2 se: solver_acc`, always shown;
    the figures are in its `regressed` column). At most `width` characters: what does not fit is left out, the
    workflow's third and later metrics first, then the training counts, the memory, the seconds
    and the second metric."""
    shown = [column for _agent, _metric, column in metrics if column in row]
    # (drop rank, text): the highest rank is left out first; 0 is always shown
    segments: list[tuple[int, str]] = [(0, f"round {row['round']}")]
    if not shown:
        segments.append((0, "no held-out metric of the workflow"))
    for i, column in enumerate(shown):
        value = row[column]
        percent = value is None or value != value or _is_fraction(float(value))
        text = f"{column} {_value(value, percent)}"
        if i == 0:
            first = start.get(column) if start is not None else None
            if value is not None and value == value and first is not None and first == first:
                change = float(value) - float(first)
                text += f" ({100 * change:+.1f} since start)" if percent and _is_fraction(float(first)) else f" ({change:+.3f} since start)"
        segments.append((0 if i == 0 else 1 if i == 1 else 100 + i, text))
    errors = row.get(ERRORS_COLUMN)
    if errors:
        segments.insert(1, (0, f"{errors} row{'' if errors == 1 else 's'} with a reward_error"))
    rows_trained, steps_trained = (row.get(c) for c in TRAIN_COLUMNS.values())
    if rows_trained is not None:
        steps_text = f"/{steps_trained} step{'' if steps_trained == 1 else 's'}" if steps_trained is not None else " trained"
        segments.append((4, f"{rows_trained} rows{steps_text}"))
    if seconds is not None:
        segments.append((2, f"{seconds:.0f}s" + (f", {total_seconds:.0f}s in all" if total_seconds is not None else "")))
    if peak_mb is not None:
        segments.append((3, f"peak {peak_mb:.0f} MB"))
    if row.get(REGRESSED_COLUMN):  # the metrics' names; their figures are in the column
        names = [part.split(" ")[0] for part in str(row[REGRESSED_COLUMN]).split("; ")]
        segments.append((0, f"under best by > 2 se: {', '.join(names)}"))
    line = " | ".join(text for _rank, text in segments)
    while len(line) > width and any(rank for rank, _ in segments):
        del segments[max(range(len(segments)), key=lambda k: segments[k][0])]
        line = " | ".join(text for _rank, text in segments)
    return line if len(line) <= width else line[: width - 1] + "…"


def reward_error_lines(store: str | Path, round_: int, shown_store: str | None = None, width: int = LINE_WIDTH) -> list[str]:
    """The console's lines under the round line of a round whose workflow code raised: how many of
    its `steps` rows carry a `reward_error`, the first of them (in step order), and the query that
    lists them all (`maxit sql`, on `shown_store`, default the store's path). Empty when no row
    does. Each line is at most `width` characters (a long command is split with a backslash)."""
    steps = st.Tables(store).read(round_, "steps").select("step_id", "reward_error")
    errors = steps.filter(pl.col("reward_error").is_not_null())
    if errors.height == 0:
        return []
    first = " ".join(str(errors["reward_error"][0]).split())
    head = f"  round {round_}: {errors.height} of {steps.height} rows carry a reward_error (the workflow's code raised); the first, "
    lines = textwrap.wrap(f"{errors['step_id'][0]}: {first}", width - 4, initial_indent=head, subsequent_indent="    ", max_lines=3, placeholder=" …")
    query = f"SELECT step_id, agent_id, reward_error FROM steps WHERE round = {round_} AND reward_error IS NOT NULL"
    command = f"  list them: maxit sql --store {shown_store or store} \\"
    one_line = command[:-2] + f' "{query}"'
    return lines + ([one_line] if len(one_line) <= width else [command, f'    "{query}"'])


def table_metrics_of(store: str | Path) -> tuple[tuple[tuple[str, str, str], ...], str | None]:
    """The round-table metrics of a store: its workflow's `table_metrics` (the workflow rebuilt
    from the settings `experiment.json` records), or, when it cannot be rebuilt here (no record, a
    user's workflow module not importable here), one column per held-out metric its evaluation
    table holds (named `metric` for the team, `agent_metric` for an agent). Returns the triples
    and, in the second case, why."""
    metrics, _judged, reason = workflow_metrics_of(store)
    return metrics, reason


def workflow_metrics_of(store: str | Path):
    """(`table_metrics_of`'s triples, the workflow's judged pairs (`Workflow.judged()`; None when
    it cannot be rebuilt), why it cannot be rebuilt or None)."""
    from pipeline.errors import MaxitError, one_line

    record = read_experiment(store)
    reason: str | None
    if record is None or "settings" not in record:
        reason = f"no {EXPERIMENT_FILE}"
    else:
        from pipeline.run.context import build_workflow

        try:
            workflow = build_workflow(stored_settings(record).run_config())
            return tuple(workflow.table_metrics), workflow.judged(), None
        except (MaxitError, TypeError, ValueError, ImportError, OSError) as err:
            reason = f"its workflow cannot be rebuilt here: {one_line(err)}"
    pairs = st.Tables(store).scan("evaluation").select("agent_id", "metric").unique(maintain_order=True).collect().iter_rows()
    return tuple((agent, metric, metric if agent == "team" else f"{agent}_{metric}") for agent, metric in pairs), None, reason


def console_table(table: pl.DataFrame, metrics: Sequence[tuple[str, str, str]], width: int = LINE_WIDTH) -> str:
    """The round table as `maxit run` prints it at its end: the numbers a user watches, as many as
    fit `width` characters, in this order: the round, the rows with a reward_error (when any has
    one: the workflow's code raised), the workflow's held-out metrics, the rows trained, the
    round's seconds (`seconds`: its stages and the rest of its wall time), the success per
    strategy, the optimizer steps and the rollout speed. Fractions are shown in percent; `maxit
    report --markdown` has every column."""
    stage_columns = [seconds_column(s) for s in (*STAGES, "other") if seconds_column(s) in table.columns]
    if stage_columns:
        table = table.with_columns(pl.sum_horizontal(stage_columns).alias("seconds").cast(pl.Int64))
        table = table.with_columns(pl.when(pl.all_horizontal(pl.col(stage_columns).is_null())).then(None).otherwise(pl.col("seconds")).alias("seconds"))
    metric_columns = [c for _a, _m, c in metrics if c in table.columns]
    errors = ERRORS_COLUMN in table.columns and bool((table[ERRORS_COLUMN].fill_null(0) > 0).any())
    wanted = ["round", *([ERRORS_COLUMN] if errors else []), *metric_columns, TRAIN_COLUMNS["rows"], "seconds"]
    wanted += sorted(c for c in table.columns if c.startswith("success_")) + [TRAIN_COLUMNS["steps"], "rollout_tok_s"]
    percent = percent_columns(table, metric_columns)

    def cell(column: str, value) -> str:
        if value is None or (isinstance(value, float) and value != value):
            return "-"
        if column in percent:
            return f"{100 * value:.1f}%"
        if isinstance(value, float):
            return f"{value:.0f}" if column == "rollout_tok_s" else f"{value:.3f}"
        return str(value)

    cells_of = {c: [cell(c, v) for v in table[c].to_list()] for c in wanted if c in table.columns}
    size_of = {c: max(len(c), *(len(x) for x in cells)) if cells else len(c) for c, cells in cells_of.items()}
    # the rows trained and the seconds keep their room ahead of any metric that would crowd them out
    reserve = sum(size_of[c] + 2 for c in (TRAIN_COLUMNS["rows"], "seconds") if c in size_of)
    shown: list[tuple[str, list[str], int]] = []
    used = 0
    for column, cells in cells_of.items():
        size = size_of[column]
        if used + size + (2 if shown else 0) + (reserve if column in metric_columns else 0) > width:
            continue
        shown.append((column, cells, size))
        used += size + (2 if len(shown) > 1 else 0)
    lines = ["  ".join(name.rjust(size) for name, _cells, size in shown)]
    lines += ["  ".join(cells[i].rjust(size) for _name, cells, size in shown) for i in range(table.height)]
    return "\n".join(lines)


def percent_columns(table: pl.DataFrame, metric_columns: Sequence[str]) -> set[str]:
    """The held-out metric and success columns whose values are all fractions (shown in percent)."""
    candidates = [c for c in table.columns if c in metric_columns or c.startswith("success_")]
    return {c for c in candidates if table[c].drop_nulls().drop_nans().is_between(0.0, 1.0).all()}
