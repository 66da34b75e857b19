"""What stores hold, read back: the experiment record of a store, the list of experiments under
some folders (`maxit runs`), the round table (`round_summary`: what `maxit run` prints at the
end, one `round_line` per round as it goes, and `maxit report --markdown`), and a
self-contained HTML report comparing stores (`maxit report --out`).

A store is one experiment: its tables (`round=<r>/*.parquet`), checkpoints, policy registry,
Dagster instance (`.dagster/`), console log (`maxit.log`) and `experiment.json`, which records
the settings `maxit run` last ran it with.

The report is one HTML file with plotly.js inlined (it opens offline): held-out accuracy or team
success per round (each such metric the evaluation table has), per-agent held-out metrics (the
Verifier's balanced verdict accuracy, or each agent's mean reward), trajectory success per strategy, importance-ratio diagnostics, rollout tokens/s and seconds per
stage. Every figure draws each store in its own colour. plotly is imported only here, when a
report is built.
"""

from __future__ import annotations

import datetime as _dt
import html
import json
from dataclasses import fields
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import polars as pl

from pipeline import store as st
from pipeline.errors import ConfigError, DataError
from pipeline.store.registry import BASE_ROUND

__all__ = [
    "EXPERIMENT_FILE",
    "LOG_FILE",
    "record_experiment",
    "settings_changes",
    "read_experiment",
    "stored_settings",
    "is_store",
    "find_stores",
    "experiments_table",
    "store_metrics",
    "build_report",
    "trajectory_success",
    "round_summary",
    "round_line",
    "table_metrics_of",
    "markdown_round_table",
    "STAGE_COLUMNS",
    "LINE_WIDTH",
]

EXPERIMENT_FILE = "experiment.json"
"""The store's experiment record: settings, engine, when it was created and last run."""

LOG_FILE = "maxit.log"
"""The store's log of engine and library output (warnings, vLLM and Dagster log lines)."""

HEADLINE_METRICS = ("accuracy", "accuracy_greedy", "accuracy_hint", "success", "success_greedy")
"""The held-out numbers drawn first when the evaluation table has them: the math workflows'
answer accuracy (sampled at the run's temperature, greedy, with the problem's hint) and any
workflow's team success (sampled, greedy)."""

AGENT_METRICS = ("verdict_balanced_accuracy", "reward")
"""Per-agent held-out numbers drawn second: a checking agent's balanced verdict accuracy (the
math Verifier's), else every agent's mean local reward (`evaluate_workflow`)."""

STAGE_ORDER = ("problems", "rollouts", "advantages", "view", "training", "evaluation", "other")

# one colour per store (plotly's default qualitative palette, repeated past ten stores)
PALETTE = ("#636EFA", "#EF553B", "#00CC96", "#AB63FA", "#FFA15A", "#19D3F3", "#FF6692", "#B6E880", "#FF97FF", "#FECB52")
DASHES = ("solid", "dash", "dot", "dashdot", "longdash", "longdashdot")


# -- the experiment record --------------------------------------------------------------------


def _now() -> str:
    return _dt.datetime.now().astimezone().isoformat(timespec="seconds")


def record_experiment(store: str | Path, settings, engine: str) -> dict:
    """Write `<store>/experiment.json` with `settings` (a `pipeline.run.settings.Settings`), the
    values in effect of the settings left to the loss's preset (`effective`: a preset may change
    between versions) and the engine; the creation time of the first record is kept. Returns the
    record. When the settings or the values in effect differ from those recorded before, the
    record keeps the earlier ones under `previous_settings` and `previous_effective` (the store's
    earlier rounds were made with them)."""
    from pipeline.run.settings import Settings

    if not isinstance(settings, Settings):
        raise ConfigError(f"record_experiment: settings must be pipeline.run.settings.Settings, got {type(settings).__name__}")
    root = Path(store)
    old = read_experiment(root) or {}
    values, effective = st.jsonable(settings), st.jsonable(settings.preset_values())
    record = {
        "store": str(root.resolve()),
        "created": old.get("created", _now()),
        "updated": _now(),
        "engine": engine,
        "settings": values,
        "effective": effective,
    }
    # a record from before `effective` was kept cannot show a preset change: judged by its settings
    changed = old.get("settings") not in (None, values) or old.get("effective", effective) != effective
    for key in ("settings", "effective"):
        if changed and key in old:
            record[f"previous_{key}"] = old[key]
        elif not changed and f"previous_{key}" in old:
            record[f"previous_{key}"] = old[f"previous_{key}"]
    root.mkdir(parents=True, exist_ok=True)
    st.atomic_write_text(root / EXPERIMENT_FILE, json.dumps(record, indent=2, sort_keys=True) + "\n")
    return record


def read_experiment(store: str | Path) -> dict | None:
    """The store's experiment record, or None when it has none (a store made before records, or
    by hand)."""
    path = Path(store) / EXPERIMENT_FILE
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise DataError(f"{path}: not valid JSON ({err})") from None


def stored_settings(record: Mapping) -> "Settings":
    """The `Settings` an experiment record (`read_experiment`) holds; settings this maxit does not
    know (a record from another version) are left out."""
    from pipeline.run.settings import Settings

    known = {f.name for f in fields(Settings)}
    return Settings(**{k: v for k, v in record["settings"].items() if k in known})


def settings_changes(store: str | Path, settings) -> list[str]:
    """What a run of `settings` (a `pipeline.run.settings.Settings`) changes against the settings the
    store last ran with (its experiment record), when it holds complete rounds: `--flag new (was
    old)` per setting that differs (a boolean by the flag that sets it: `--separate-policies`,
    `--no-x`), then one line per value the presets give differently (`effective`). Empty for a
    new store, a store without a record, or the same settings. A setting a record of another
    version does not hold, or this version does not know, is left out; so is the cache of the
    starting model's evaluation, which changes no round's rows."""
    from pipeline.run.settings import Settings, setting_flag

    root = Path(store)
    record = read_experiment(root) if root.is_dir() else None
    if not record or "settings" not in record or not _complete_rounds(root):
        return []
    old, new = record["settings"], st.jsonable(settings)

    def shown(value) -> str:  # None: left to the preset or the default
        if value is None:
            return "unset"
        return " ".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)

    out = []
    for f in fields(Settings):
        if f.name == "base_eval_cache" or f.name not in old or f.name not in new or old[f.name] == new[f.name]:
            continue
        negative = f.metadata.get("negative_flag")
        if isinstance(new[f.name], bool) or isinstance(old[f.name], bool):
            # a switch: on, off, or unset (None: left to the preset); shared_policy False is
            # --separate-policies on
            flag = negative[0] if negative else setting_flag(f.name)

            def state(value) -> str:
                return "unset" if value is None else ("on" if bool(value) != bool(negative) else "off")

            out.append(f"{flag} {state(new[f.name])} (was {state(old[f.name])})")
        else:
            out.append(f"{setting_flag(f.name)} {shown(new[f.name])} (was {shown(old[f.name])})")
    effective_old, effective_new = record.get("effective"), st.jsonable(settings.preset_values())
    if isinstance(effective_old, dict):
        out += [f"the preset's {k} {shown(v)} (was {shown(effective_old[k])})"
                for k, v in effective_new.items() if k in effective_old and effective_old[k] != v and old.get(k) == new.get(k)]
    return out


def is_store(path: Path) -> bool:
    """A folder is a store when it has an experiment record or a round folder."""
    return path.is_dir() and ((path / EXPERIMENT_FILE).is_file() or any(path.glob("round=*")))


def find_stores(roots: Iterable[str | Path], max_depth: int = 3) -> list[Path]:
    """Stores under `roots` (each root itself, or folders up to `max_depth` levels below it),
    sorted by path; a store's own sub-folders are not searched."""
    found: list[Path] = []

    def walk(path: Path, depth: int) -> None:
        if is_store(path):
            found.append(path)
            return
        if depth >= max_depth or not path.is_dir():
            return
        for child in sorted(p for p in path.iterdir() if p.is_dir() and not p.name.startswith(".")):
            walk(child, depth + 1)

    for root in roots:
        walk(Path(root), 0)
    return sorted(set(found))


def _changed_settings(values: Mapping) -> str:
    """The settings that differ from `Settings()`'s defaults, as "name=value" pairs."""
    from pipeline.run.settings import Settings

    defaults = st.jsonable(Settings())
    changed = [f"{f.name}={values[f.name]}" for f in fields(Settings) if f.name in values and values[f.name] != defaults.get(f.name)]
    unknown = sorted(set(values) - set(defaults))  # settings of an older or newer maxit
    changed += [f"{k}={values[k]}" for k in unknown]
    return " ".join(changed) or "(defaults)"


def _complete_rounds(store: Path) -> list[int]:
    return sorted(
        int(p.parent.name.split("=", 1)[1])
        for p in store.glob("round=*/evaluation.parquet")
        if p.parent.name.split("=", 1)[1].lstrip("-").isdigit() and int(p.parent.name.split("=", 1)[1]) >= 0
    )


def experiments_table(roots: Sequence[str | Path]) -> pl.DataFrame:
    """One row per store under `roots`: its complete rounds, the last one's held-out accuracy
    (math: the Solver's; other workflows: team success) and balanced verdict accuracy, when it last ran, and its settings (those that
    differ from the defaults)."""
    rows = []
    for store in find_stores(roots):
        rec = read_experiment(store) or {}
        done = _complete_rounds(store)
        last = done[-1] if done else None
        acc = bal = None
        if last is not None:
            ev = pl.read_parquet(st.table_path(store, last, "evaluation"))
            get = lambda m: ev.filter(pl.col("metric") == m)["value"]  # noqa: E731
            acc = next((float(get(m)[0]) for m in ("accuracy", "success") if get(m).len()), None)
            bal = float(get("verdict_balanced_accuracy")[0]) if get("verdict_balanced_accuracy").len() else None
        rows.append(
            {
                "store": str(store),
                "rounds": len(done),
                "last_round": last,
                "heldout": acc,
                "verifier_bal_acc": bal,
                "updated": rec.get("updated", ""),
                "engine": rec.get("engine", ""),
                "settings": _changed_settings(rec["settings"]) if "settings" in rec else "(no experiment.json)",
            }
        )
    schema = {"store": pl.String, "rounds": pl.Int64, "last_round": pl.Int64, "heldout": pl.Float64, "verifier_bal_acc": pl.Float64,
              "updated": pl.String, "engine": pl.String, "settings": pl.String}
    return pl.DataFrame(rows, schema=schema)


# -- the metrics of a store -------------------------------------------------------------------


def trajectory_success(steps: pl.LazyFrame) -> pl.LazyFrame:
    """One row per trajectory (round, strategy, traj_uid, global_reward): its team reward at the
    end, the global reward of its last row. A tree counts once, as the path its selected
    candidates took: the team reward right after its last selected step (its `traj_uid` is the
    problem's `uid`). Rows are taken in the table's order, which is step order."""
    tree = pl.col("strategy") == "tree"
    ordinary = steps.filter(~tree).group_by("round", "strategy", "traj_uid").agg(pl.col("global_reward").last())
    trees = (
        steps.filter(tree & pl.col("selected"))
        .group_by("round", "strategy", "uid")
        .agg(pl.col("global_reward").last())
        .rename({"uid": "traj_uid"})
    )
    return pl.concat([ordinary, trees.select(ordinary.collect_schema().names())])


def _scan(store: Path, table: str) -> pl.LazyFrame | None:
    if not any(store.glob(f"round=*/{table}.parquet")):
        return None
    return st.scan_table(store, table)


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
        timings.filter(pl.col("round") >= 0).select("round", "stage", "seconds").sort("round").collect()
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


# -- the round table --------------------------------------------------------------------------

STAGE_COLUMNS = {"problems": "s_prob", "rollouts": "s_roll", "advantages": "s_adv", "view": "s_view", "training": "s_train", "evaluation": "s_eval", "other": "s_other",
                 "sandbox": "s_sandbox", "engine_start": "s_engine", "engine_swap": "s_swap"}  # the last three: inside s_roll and s_eval
"""Column of the round table holding each stage's seconds (the store's `timings` table)."""

TRAIN_COLUMNS = {"rows": "train_rows", "steps": "train_steps"}
"""Columns of the round table holding a round's training rows and optimizer steps (summed over
its policies, from the metrics its policy registry entries keep)."""

LINE_WIDTH = 120
"""The widest console line `round_line` writes."""


def round_summary(store: str | Path, rounds: Sequence[int], metrics: Sequence[tuple[str, str, str]] | None = None) -> pl.DataFrame:
    """One row per round: the workflow's held-out metrics (`metrics`: (agent_id, metric, column)
    triples, by default the math workflow's: Solver accuracy, Verifier verdict accuracies),
    trajectory success by strategy, training rows and optimizer steps, rollout tokens/s
    (completion tokens over the rollouts stage's seconds) and the seconds of every stage (the
    `timings` table)."""
    store = Path(store)
    rounds = list(rounds)
    if metrics is None:
        from pipeline.workflows.math import MathWorkflow

        metrics = MathWorkflow.table_metrics
    columns = {(agent, metric): column for agent, metric, column in metrics}
    ev = st.scan_table(store, "evaluation").filter(pl.col("round").is_in(rounds)).collect()
    picked = ev.with_columns(pl.struct("agent_id", "metric").map_elements(lambda k: columns.get((k["agent_id"], k["metric"])), return_dtype=pl.String).alias("column"))
    picked = picked.filter(pl.col("column").is_not_null())
    table = picked.pivot(on="column", index="round", values="value", aggregate_function="first") if picked.height else pl.DataFrame({"round": sorted(set(ev["round"].to_list()))}, schema={"round": pl.Int32})
    table = table.select("round", *[c for c in columns.values() if c in table.columns]).sort("round")
    trained = [r for r in rounds if r >= 0]
    if trained:
        steps = st.scan_table(store, "steps").filter(pl.col("round").is_in(trained))
        success = (
            trajectory_success(steps)
            .group_by("round", "strategy")
            .agg(pl.col("global_reward").mean())
            .collect()
            .pivot(on="strategy", index="round", values="global_reward")
        )
        # strategies in a fixed order (a pivot orders them by first appearance)
        success = success.select("round", *sorted(c for c in success.columns if c != "round"))
        success = success.rename({c: f"success_{c}" for c in success.columns if c != "round"})
        table = table.join(success, on="round", how="left")
        counts = _training_counts(store, trained)
        if counts is not None:
            table = table.join(counts, on="round", how="left")
        if any(store.glob("round=*/timings.parquet")):
            timings = st.scan_table(store, "timings").filter(pl.col("round").is_in(trained)).select("round", "stage", "seconds").collect()
            tokens = steps.group_by("round").agg(pl.col("completion_ids").list.len().sum().alias("tokens")).collect()
            speed = (
                timings.filter(pl.col("stage") == "rollouts")
                .join(tokens, on="round")
                .select("round", (pl.col("tokens") / pl.col("seconds")).alias("rollout_tok_s"))
            )
            seconds = (
                timings.filter(pl.col("stage").is_in(list(STAGE_COLUMNS)))
                .with_columns(pl.col("stage").replace_strict(STAGE_COLUMNS), pl.col("seconds").round(0).cast(pl.Int64))
                .pivot(on="stage", index="round", values="seconds", aggregate_function="first")
            )
            seconds = seconds.select("round", *[c for c in STAGE_COLUMNS.values() if c in seconds.columns])
            table = table.join(speed, on="round", how="left").join(seconds, on="round", how="left")
    return table.sort("round")


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
    steps | 148s, 712s in all | peak 2210 MB`. At most `width` characters: what does not fit is
    left out, the workflow's third and later metrics first, then the training counts, the
    memory, the seconds and the second metric."""
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
    rows_trained, steps_trained = (row.get(c) for c in TRAIN_COLUMNS.values())
    if rows_trained is not None:
        steps_text = f"/{steps_trained} step{'' if steps_trained == 1 else 's'}" if steps_trained is not None else " trained"
        segments.append((4, f"{rows_trained} rows{steps_text}"))
    if seconds is not None:
        segments.append((2, f"{seconds:.0f}s" + (f", {total_seconds:.0f}s in all" if total_seconds is not None else "")))
    if peak_mb is not None:
        segments.append((3, f"peak {peak_mb:.0f} MB"))
    line = " | ".join(text for _rank, text in segments)
    while len(line) > width and any(rank for rank, _ in segments):
        del segments[max(range(len(segments)), key=lambda k: segments[k][0])]
        line = " | ".join(text for _rank, text in segments)
    return line if len(line) <= width else line[: width - 1] + "…"


def table_metrics_of(store: str | Path) -> tuple[tuple[tuple[str, str, str], ...], str | None]:
    """The round-table metrics of a store: its workflow's `table_metrics` (the workflow rebuilt
    from the settings `experiment.json` records), or, when it cannot be rebuilt here (no record, a
    user's workflow module not importable here), one column per held-out metric its evaluation
    table holds (named `metric` for the team, `agent_metric` for an agent). Returns the triples
    and, in the second case, why."""
    from pipeline.errors import MaxitError, one_line

    record = read_experiment(store)
    reason: str | None
    if record is None or "settings" not in record:
        reason = f"no {EXPERIMENT_FILE}"
    else:
        from pipeline.run.rounds import build_workflow

        try:
            workflow = build_workflow(stored_settings(record).run_config())
            return tuple(workflow.table_metrics), None
        except (MaxitError, TypeError, ValueError, ImportError, OSError) as err:
            reason = f"its workflow cannot be rebuilt here: {one_line(err)}"
    pairs = st.scan_table(store, "evaluation").select("agent_id", "metric").unique(maintain_order=True).collect().iter_rows()
    return tuple((agent, metric, metric if agent == "team" else f"{agent}_{metric}") for agent, metric in pairs), reason


def _percent_columns(table: pl.DataFrame, metric_columns: Sequence[str]) -> set[str]:
    """The held-out metric and success columns whose values are all fractions (shown in percent)."""
    candidates = [c for c in table.columns if c in metric_columns or c.startswith("success_")]
    return {c for c in candidates if table[c].drop_nulls().drop_nans().is_between(0.0, 1.0).all()}


def markdown_round_table(store: str | Path, label: str | None = None) -> str:
    """The round table of a store (`round_summary` of its complete rounds and round -1) as a
    markdown table, after a one-line header naming the store (`label`, else its path), its
    workflow, algorithm and seed. Fractions are shown in percent, one decimal; round -1 is the
    starting model. Raises `DataError` when the store has no complete round."""
    root = Path(store)
    name = label or str(store)
    if not is_store(root):
        raise ConfigError(f"store {name}: not a store (no round folders, no {EXPERIMENT_FILE})")
    done = _complete_rounds(root)
    if not done:
        raise DataError(f"store {name}: no completed round (no round=R/evaluation.parquet with R >= 0)")
    metrics, reason = table_metrics_of(root)
    rounds = ([BASE_ROUND] if st.table_path(root, BASE_ROUND, "evaluation").exists() else []) + done
    table = round_summary(root, rounds, metrics)
    settings = (read_experiment(root) or {}).get("settings", {})
    described = ", ".join(f"{key} {settings.get(key, 'not recorded')}" for key in ("workflow", "algorithm", "seed"))
    header = f"store {name}: {described}; {len(done)} complete round(s); fractions in percent, s_* in seconds"
    if reason:
        header += f" (every held-out metric shown: {reason})"
    percent = _percent_columns(table, [c for _a, _m, c in metrics])

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
    return "\n".join(lines)


# -- the HTML report --------------------------------------------------------------------------


def _labels(stores: Sequence[Path]) -> list[str]:
    """Short, distinct names of the stores: their folder names, or their paths where two share
    a name."""
    names = [s.name or str(s) for s in stores]
    return [str(s) if names.count(n) > 1 else n for s, n in zip(stores, names)]


def _figures(data: Sequence[tuple[str, str, dict[str, pl.DataFrame]]]) -> list[tuple[str, object]]:
    """(title, plotly figure) of every section, the stores drawn in their colours."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    figs: list[tuple[str, object]] = []
    layout = dict(template="plotly_white", height=420, legend=dict(orientation="h", y=-0.2), margin=dict(t=50, l=60, r=20, b=40))

    # headline: one colour per store, one dash per metric
    fig = go.Figure()
    for label, colour, m in data:
        ev = m["evaluation"]
        for j, metric in enumerate(HEADLINE_METRICS):
            s = ev.filter(pl.col("metric") == metric).sort("round")
            if s.height:
                fig.add_trace(go.Scatter(x=s["round"].to_list(), y=s["value"].to_list(), mode="lines+markers", name=f"{label} · {metric}",
                                         line=dict(color=colour, dash=DASHES[j % len(DASHES)]), legendgroup=label))
    fig.update_layout(title="Held-out accuracy / team success per round (round -1: the starting model)", xaxis_title="round", yaxis_title="fraction right", **layout)
    figs.append(("heldout", fig))

    # per agent: a checker's balanced verdict accuracy (plain verdict accuracy where a store has
    # no balanced one), else each agent's mean local reward
    fig = go.Figure()
    for label, colour, m in data:
        ev = m["evaluation"]
        present = set(ev["metric"].to_list())
        metric = next((x for x in AGENT_METRICS if x in present), "verdict_accuracy")
        for j, agent in enumerate(sorted(set(ev.filter(pl.col("metric") == metric)["agent_id"].to_list()))):
            s = ev.filter(pl.col("metric") == metric, pl.col("agent_id") == agent).sort("round")
            fig.add_trace(go.Scatter(x=s["round"].to_list(), y=s["value"].to_list(), mode="lines+markers", name=f"{label} · {agent} · {metric}",
                                     line=dict(color=colour, dash=DASHES[j % len(DASHES)]), legendgroup=label))
    fig.update_layout(title="Per-agent held-out metrics per round (balanced verdict accuracy, or mean reward)", xaxis_title="round", yaxis_title="value", **layout)
    figs.append(("agents", fig))

    # success per strategy: one panel per strategy
    strategies = sorted({s for _, _, m in data for s in m["success"]["strategy"].to_list()})
    if strategies:
        fig = make_subplots(rows=1, cols=len(strategies), subplot_titles=strategies, shared_yaxes=True)
        for label, colour, m in data:
            for i, strategy in enumerate(strategies, 1):
                s = m["success"].filter(pl.col("strategy") == strategy)
                if s.height:
                    fig.add_trace(go.Scatter(x=s["round"].to_list(), y=s["success"].to_list(), mode="lines+markers", name=label, line=dict(color=colour),
                                             legendgroup=label, showlegend=i == 1), row=1, col=i)
        fig.update_layout(title="Trajectory success per strategy per round (mean team reward of the round's trajectories)", **layout)
        figs.append(("success_by_strategy", fig))

    # ratio diagnostics: one panel per statistic, one dash per policy
    stats = ("mean_log_ratio", "first_step_log_ratio", "clip_fraction", "ess_fraction", "kl")
    if any(m["ratio"].height for _, _, m in data):
        fig = make_subplots(rows=1, cols=len(stats), subplot_titles=stats)
        for label, colour, m in data:
            r = m["ratio"]
            for j, pid in enumerate(sorted(set(r["policy_id"].to_list())) if r.height else []):
                s = r.filter(pl.col("policy_id") == pid)
                for i, stat in enumerate(stats, 1):
                    fig.add_trace(go.Scatter(x=s["round"].to_list(), y=s[stat].to_list(), mode="lines+markers", name=f"{label} · {pid}",
                                             line=dict(color=colour, dash=DASHES[j % len(DASHES)]), legendgroup=f"{label}/{pid}", showlegend=i == 1),
                                  row=1, col=i)
        fig.update_layout(title="Importance-ratio diagnostics of training (all agents and strategies of a policy)", **layout)
        figs.append(("ratio_diagnostics", fig))

    # rollout speed
    if any(m["speed"].height for _, _, m in data):
        fig = go.Figure()
        for label, colour, m in data:
            s = m["speed"]
            if s.height:
                fig.add_trace(go.Scatter(x=s["round"].to_list(), y=s["tokens_per_s"].to_list(), mode="lines+markers", name=label, line=dict(color=colour)))
        fig.update_layout(title="Rollout tokens/s per round (completion tokens / seconds of the rollouts stage)", xaxis_title="round", yaxis_title="tokens/s", **layout)
        figs.append(("rollout_speed", fig))

    # seconds per stage: one panel per store, stacked by stage
    timed = [(label, m) for label, _, m in data if m["timings"].height]
    if timed:
        fig = make_subplots(rows=1, cols=len(timed), subplot_titles=[label for label, _ in timed], shared_yaxes=True)
        stage_colours = dict(zip(STAGE_ORDER, PALETTE[::-1]))
        for i, (label, m) in enumerate(timed, 1):
            t = m["timings"]
            for stage in STAGE_ORDER:
                s = t.filter(pl.col("stage") == stage).sort("round")
                if s.height:
                    fig.add_trace(go.Bar(x=s["round"].to_list(), y=s["seconds"].to_list(), name=stage, marker_color=stage_colours[stage],
                                         legendgroup=stage, showlegend=i == 1), row=1, col=i)
        fig.update_layout(barmode="stack", title="Seconds per stage per round", **layout)
        figs.append(("time_per_stage", fig))
    return figs


def _settings_table(labels: Sequence[str], stores: Sequence[Path]) -> str:
    rows = []
    for label, colour, store in zip(labels, PALETTE * (len(stores) // len(PALETTE) + 1), stores):
        rec = read_experiment(store) or {}
        settings = _changed_settings(rec["settings"]) if "settings" in rec else "(no experiment.json)"
        done = _complete_rounds(store)
        rows.append(
            f"<tr><td><span style='color:{colour}'>&#9632;</span> {html.escape(label)}</td><td>{html.escape(str(store))}</td>"
            f"<td>{len(done)}</td><td>{html.escape(rec.get('engine', ''))}</td><td>{html.escape(settings)}</td></tr>"
        )
    head = "<tr><th>store</th><th>path</th><th>complete rounds</th><th>engine</th><th>settings (non-default)</th></tr>"
    return f"<table>{head}{''.join(rows)}</table>"


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
        f"<h1>{html.escape(title)}</h1><p>Generated {html.escape(_now())}.</p>{_settings_table(labels, paths)}{''.join(parts)}</body></html>\n"
    )
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    st.atomic_write_text(out, page)
    return out
