"""`maxit run`: rounds materialized in-process on the store's own Dagster instance.

Every store is one experiment with its own Dagster instance, `<store>/.dagster/` (its
dagster.yaml written from the project's `dagster.yaml`): the run, event and asset storage of a
store's rounds lives next to its tables, so two stores never share asset partitions, and
`maxit ui --store DIR` shows exactly the rounds of DIR.

What the console shows, and where the rest goes: `assets.console`. Overlapped rounds
(`--max-staleness`): `assets.overlapped_run`.

One writer per store: a run, and each materialization a UI run makes, holds the store's writer
lock (`pipeline.store.lock`); a second writer stops with an error naming the first."""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from pathlib import Path

import polars as pl

from pipeline.errors import MaxitError, RunInterrupted
from pipeline.run.experiment_record import EXPERIMENT_FILE, LOG_FILE, record_experiment
from pipeline.run.ray_shards import check_ray, ray_session
from pipeline.reporting.report import round_summary
from pipeline.run.rounds import round_complete
from pipeline.store import BASE_ROUND
from pipeline.run.timings import record_other
from pipeline.reporting.tracking import check_targets, log_round
from pipeline.store import Tables, atomic_write_text
from pipeline.store.lifeline import run_lifeline, stop_orphans
from pipeline.store.lock import command_line, token_in_env
from pipeline.store.lock import acquire as acquire_writer_lock

from assets.console import announce_round, console_to_log
from assets.instance import dagster_home, instance_at
from assets.placement import engine_devices

log = logging.getLogger("maxit")


def run_rounds(
    n_rounds: int,
    store: str | Path,
    settings,
    engine: str = "auto",
    restart: bool = False,
    home: str | Path | None = None,
    quiet_dagster: bool = True,
    verbose: bool = False,
) -> pl.DataFrame:
    """Materialize rounds 0..n_rounds-1 in-process, on the store's own Dagster instance
    (`dagster_home(store)`, or `home`). Complete rounds (their `evaluation` table exists) are
    kept unless `restart`; the first incomplete round is re-run from scratch. The console shows
    maxit's progress and one line per finished round (`pipeline.reporting.report.round_line`; the caller
    prints the returned table); engine and library output goes to `<store>/maxit.log`
    (and to the console too with `verbose`).

    `store` may be a URL (`pipeline.store.UrlStore`): the run then works in the store's local
    working copy (tables, checkpoints being trained, the Dagster instance, maxit.log), made first
    to hold the URL's tables, and every asset uploads what it wrote as it finishes.

    The run holds the store's writer lock (`pipeline.store.lock`) from before it writes anything until
    it ends: a second writer of the store stops at once with `StoreLocked`, naming this one, and
    so does this run when another holds it. A URL store is locked in its working copy and, on S3, by
    the writer's lease at the URL (`pipeline.store.lease`), so runs on two machines exclude each
    other too. The step processes of a
    sharded round (`--shards`) share the lock through `pipeline.store.lock.TOKEN_ENV`.

    With `--executor ray` the rounds run in this process and each round's shards are Ray tasks
    (`pipeline.run.ray_shards`) on the cluster at `--ray-address`, or on a local Ray instance on
    127.0.0.1 that the run starts before its first round and stops after its last."""
    if n_rounds < 1:
        raise MaxitError(f"--rounds must be >= 1, got {n_rounds}")
    with engine_devices(settings.run_config().scale.engine_devices):
        return _run_rounds_on_devices(n_rounds, store, settings, engine, restart, home, quiet_dagster, verbose)


def _run_rounds_on_devices(n_rounds, store, settings, engine, restart, home, quiet_dagster, verbose) -> pl.DataFrame:
    scale = settings.run_config().scale
    executor, address = scale.executor, scale.ray_address
    check_ray(executor, address, str(store))  # before anything is written
    tables = Tables(store)
    tables.root.mkdir(parents=True, exist_ok=True)
    # a trainer an earlier run left running would hold the lock's shared side or, as a torchrun
    # rank, write this store's checkpoints beside this run: stopped first, and named
    stop_orphans(tables.root, lambda line: print(f"maxit run: {line}", file=sys.stderr, flush=True))
    with acquire_writer_lock(tables.root, command=command_line()) as lock, token_in_env(lock.token), run_lifeline(tables.root):
        # a URL is the store of record: the working copy is made to hold its tables (complete
        # rounds are kept, tables it never received are dropped); checkpoints come when needed
        tables.pull(reconcile=True)
        log_path = tables.root / LOG_FILE
        from pipeline.engines import vllm_available

        record_experiment(tables.root, settings.settings(), engine if engine != "auto" else ("vllm" if vllm_available() else "hf"))
        if tables.url is not None:
            _publish_experiment(tables)
        with console_to_log(log_path, verbose=verbose) as (out, err):
            try:
                # --executor ray: one Ray instance (or connection) for every round of the run, stopped at its end
                with ray_session(address) if executor == "ray" else contextlib.nullcontext():
                    return _run_rounds(n_rounds, tables, settings, engine, restart, home, quiet_dagster, out, err)
            except MaxitError as e:
                kind = RunInterrupted if isinstance(e, RunInterrupted) else MaxitError
                raise kind(f"{e}\n(engine and library output: {log_path})") from e


def _publish_experiment(tables: Tables) -> None:
    """The experiment record at the URL, naming the URL as its store (not the working copy)."""
    import json

    path = tables.root / EXPERIMENT_FILE
    record = json.loads(path.read_text())
    record["store"] = str(tables.location)
    atomic_write_text(path, json.dumps(record, indent=2, sort_keys=True) + "\n")
    tables.publish(files=(EXPERIMENT_FILE,))


def _run_rounds(n_rounds, tables: Tables, settings, engine, restart, home, quiet_dagster, out, err) -> pl.DataFrame:
    from tqdm.auto import tqdm

    from assets.jobs import materialize_round  # imported when called: a stand-in a test sets on assets.jobs is the one run
    from assets.overlapped_run import run_overlapped_rounds
    from assets.resources import close_engines
    from pipeline.run.context import build_workflow

    instance = instance_at(dagster_home(tables.root, home))
    workflow = build_workflow(settings.run_config())
    metrics, judged = workflow.table_metrics, workflow.judged()  # judged: what the regression warning weighs
    trackers = check_targets(settings.run_config().tracking.report_to)
    t_start = time.perf_counter()
    done: list[int] = []
    bar = tqdm(range(n_rounds), desc="rounds", unit="round", file=err)
    if settings.run_config().max_staleness > 0:
        try:
            return run_overlapped_rounds(n_rounds, tables, settings, engine, restart, instance, quiet_dagster, out, bar, metrics, trackers, judged)
        finally:
            bar.close()
            close_engines()
    try:
        for r in bar:
            if round_complete(tables, r) and not restart:
                done.append(r)
                if trackers:  # a resumed run logs the rounds a tracker has not seen yet (a no-op for the others)
                    log_round(tables.root, r, trackers, metrics=metrics)
                bar.set_postfix_str(f"round {r} already complete")
                continue
            t0, started = time.perf_counter(), time.time()
            materialize_round(instance, tables, r, settings, engine, quiet_dagster)
            done.append(r)
            record_other(tables, r, time.perf_counter() - t0, started)
            tables.publish(r)
            announce_round(tables, r, done, metrics, time.perf_counter() - t0, t_start, bar, out, trackers, judged)
    finally:
        bar.close()
        close_engines()
    return round_summary(tables.root, [BASE_ROUND, *done], metrics, judged)
