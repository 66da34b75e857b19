"""`maxit run` (rounds materialized in-process) and `maxit ui` (the Dagster UI on 127.0.0.1).

Both use the project's Dagster instance in `.dagster_home/` (created from `dagster.yaml`), so
the runs of `maxit run` show in the UI."""

from __future__ import annotations

import logging
import os
import resource
import shutil
import signal
import sys
import time
from pathlib import Path

import polars as pl

from pipeline.errors import MaxitError
from pipeline.rounds import BASE_ROUND, round_complete
from pipeline.store import scan_table

log = logging.getLogger("maxit")

PROJECT_ROOT = Path(__file__).resolve().parents[1]


def dagster_home(path: str | Path | None = None) -> Path:
    """The instance folder: `$DAGSTER_HOME`, else `.dagster_home/` of the current folder, holding a
    copy of the project's dagster.yaml (sqlite storage inside it, telemetry off, one run at a time)."""
    home = Path(path or os.environ.get("DAGSTER_HOME") or ".dagster_home").resolve()
    home.mkdir(parents=True, exist_ok=True)
    target = home / "dagster.yaml"
    source = PROJECT_ROOT / "dagster.yaml"
    if not target.exists() and source.exists():
        shutil.copyfile(source, target)
    return home


def instance_at(home: Path):
    import dagster as dg

    return dg.DagsterInstance.from_config(str(home))


def _peak_rss_mb() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return max(own, kids) / 1024.0


def round_summary(store: Path, rounds: list[int]) -> pl.DataFrame:
    """One row per round: held-out Solver accuracy (no hints), Verifier verdict accuracy (plain and
    balanced),
    trajectory success by strategy, rollout tokens/s (from the steps table's timing column)."""
    ev = scan_table(store, "evaluation").filter(pl.col("round").is_in(rounds)).collect()
    table = (
        ev.filter(pl.col("metric").is_in(["accuracy", "accuracy_greedy", "accuracy_hint", "verdict_accuracy", "verdict_balanced_accuracy"]))
        .pivot(on="metric", index="round", values="value", aggregate_function="first")
        .sort("round")
    )
    rename = {"accuracy": "solver_acc", "accuracy_greedy": "greedy", "accuracy_hint": "with_hint", "verdict_accuracy": "verifier_acc", "verdict_balanced_accuracy": "verifier_bal_acc"}
    table = table.rename({k: v for k, v in rename.items() if k in table.columns})
    trained = [r for r in rounds if r >= 0]
    if trained:
        steps = scan_table(store, "steps").filter(pl.col("round").is_in(trained))
        success = (
            steps.filter(pl.col("agent_id") == "solver")
            .group_by("round", "strategy", "traj_uid")
            .agg(pl.col("global_reward").first())
            .group_by("round", "strategy")
            .agg(pl.col("global_reward").mean())
            .collect()
            .pivot(on="strategy", index="round", values="global_reward")
        )
        # strategies in a fixed order (a pivot orders them by first appearance)
        success = success.select("round", *sorted(c for c in success.columns if c != "round"))
        success = success.rename({c: f"success_{c}" for c in success.columns if c != "round"})
        table = table.join(success, on="round", how="left")
    return table.sort("round")


def run_rounds(
    n_rounds: int,
    store: str | Path,
    settings,
    engine: str = "auto",
    restart: bool = False,
    home: str | Path | None = None,
    quiet_dagster: bool = True,
) -> pl.DataFrame:
    """Materialize rounds 0..n_rounds-1 in-process. Complete rounds (their `evaluation` table
    exists) are kept unless `restart`; the first incomplete round is re-run from scratch."""
    import dagster as dg
    from tqdm.auto import tqdm

    from assets.checks import all_checks
    from assets.definitions import ROUND_ASSETS, make_resources
    from assets.partitions import rounds as rounds_def
    from assets.resources import close_engines

    if n_rounds < 1:
        raise MaxitError(f"--rounds must be >= 1, got {n_rounds}")
    store = Path(store)
    store.mkdir(parents=True, exist_ok=True)
    instance = instance_at(dagster_home(home))
    resources = make_resources(str(store), engine, settings)
    run_config = {"loggers": {"console": {"config": {"log_level": "WARNING" if quiet_dagster else "INFO"}}}}
    t_start = time.perf_counter()
    done: list[int] = []
    tokens_per_s: dict[int, float] = {}
    bar = tqdm(range(n_rounds), desc="rounds", unit="round", file=sys.stderr)
    try:
        for r in bar:
            if round_complete(store, r) and not restart:
                done.append(r)
                bar.set_postfix_str(f"round {r} already complete")
                continue
            key = str(r)
            for stale in store.glob(f"round={r}/.*.tmp-*"):  # left by a run killed mid-write
                shutil.rmtree(stale) if stale.is_dir() else stale.unlink()
            if not instance.has_dynamic_partition(rounds_def.name, key):
                instance.add_dynamic_partitions(rounds_def.name, [key])
            t0 = time.perf_counter()
            result = dg.materialize(
                [*ROUND_ASSETS, *all_checks],
                partition_key=key,
                instance=instance,
                resources=resources,
                run_config=run_config,
                raise_on_error=False,
                tags={"maxit/launched_by": "maxit run"},
            )
            if not result.success:
                failures = []
                for e in result.all_events:
                    if not e.is_failure:
                        continue
                    err = getattr(e.event_specific_data, "error", None)
                    failures.append(f"{e.message}\n    {err.to_string().strip()}" if err is not None else e.message)
                failed_checks = [
                    f"{ev.asset_check_key.name}: {ev.metadata}"
                    for ev in result.get_asset_check_evaluations()
                    if not ev.passed and ev.severity == dg.AssetCheckSeverity.ERROR
                ]
                raise MaxitError(f"round {r} failed (run {result.run_id}):\n  " + "\n  ".join(failures + failed_checks))
            done.append(r)
            tps = result.asset_materializations_for_node("rollouts")[0].metadata.get("tokens_per_second")
            if tps is not None:
                tokens_per_s[r] = float(tps.value)
            bar.set_postfix_str(f"round {r}: {time.perf_counter() - t0:.0f}s")
            summary = _with_speed(round_summary(store, [BASE_ROUND, *done]), tokens_per_s)
            _print_table(summary, f"after round {r} ({time.perf_counter() - t_start:.0f}s, peak memory {_peak_rss_mb():.0f} MB)")
    finally:
        bar.close()
        close_engines()
    return _with_speed(round_summary(store, [BASE_ROUND, *done]), tokens_per_s)


def _with_speed(summary: pl.DataFrame, tokens_per_s: dict[int, float]) -> pl.DataFrame:
    """Add the rollout engine's tokens/s of the rounds run in this process."""
    speed = pl.DataFrame({"round": list(tokens_per_s), "rollout_tok_s": list(tokens_per_s.values())}, schema={"round": pl.Int32, "rollout_tok_s": pl.Float64})
    return summary.join(speed, on="round", how="left")


def _print_table(df: pl.DataFrame, title: str) -> None:
    with pl.Config(tbl_rows=100, tbl_cols=20, float_precision=3, tbl_hide_dataframe_shape=True, tbl_hide_column_data_types=True, tbl_width_chars=200):
        print(f"\n{title}\n{df}", flush=True)


def ui(host: str = "127.0.0.1", port: int = 3000, home: str | Path | None = None, store: str | None = None, engine: str | None = None) -> int:
    """Run `dagster dev` bound to `host`, with the project's instance, and exit cleanly on
    Ctrl-C or SIGTERM (dagster dev started in the background ignores both otherwise)."""
    env = dict(os.environ)
    env["DAGSTER_HOME"] = str(dagster_home(home))
    if store:
        env["MAXIT_STORE"] = store
    if engine:
        env["MAXIT_ENGINE"] = engine
    exe = Path(sys.executable).with_name("dagster")
    cmd = [str(exe), "dev", "--host", host, "--port", str(port), "-m", "assets.definitions", "--working-directory", str(PROJECT_ROOT)]
    print(f"Dagster UI on http://{host}:{port} (instance {env['DAGSTER_HOME']}); Ctrl-C stops it", flush=True)
    import subprocess

    def restore_sigint():
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.setsid()

    proc = subprocess.Popen(cmd, env=env, preexec_fn=restore_sigint)

    def forward(signum, _frame):
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGINT)
            except ProcessLookupError:
                pass

    signal.signal(signal.SIGINT, forward)
    signal.signal(signal.SIGTERM, forward)
    try:
        while True:
            try:
                return proc.wait()
            except KeyboardInterrupt:
                forward(signal.SIGINT, None)
    finally:
        if proc.poll() is None:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
