"""`maxit run --max-staleness K` on the run's side: the overlapped rounds' two lanes
(`assets.overlap` schedules them) driven from the run's process, the sampler lane in it and the
trainer lane in a process of its own (one for the run, `assets.trainer_lane`, or one per round,
`python -m assets.lane`)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import polars as pl

from pipeline.errors import MaxitError
from pipeline.reporting.report import round_summary
from pipeline.run.rounds import round_complete
from pipeline.store import BASE_ROUND
from pipeline.reporting.tracking import log_round
from pipeline.store import Tables
from pipeline.store.lifeline import preexec

from assets.console import announce_round
from assets.instance import PROJECT_ROOT, dagster_home
from assets.placement import pinned_sampler


def run_overlapped_rounds(n_rounds, tables: Tables, settings, engine, restart, instance, quiet_dagster, out, bar, metrics, trackers, judged) -> pl.DataFrame:
    """`assets.run_rounds`' rounds when they overlap (`assets.overlap`): the first incomplete round and
    every later one made from scratch, round r's sampling beside round r-1's training."""
    from assets.jobs import materialize_round  # imported when called: a stand-in a test sets on assets.jobs is the one run
    from assets.overlap import TRAIN_STAGES, StorePlan, prepare_resume, run_overlapped
    from assets.trainer_lane import close_lanes, materialize_in_lane

    first = 0 if restart else next((r for r in range(n_rounds) if not round_complete(tables, r)), n_rounds)
    done = list(range(first))
    for r in done:
        bar.update(1)
    prepare_resume(tables, range(first, n_rounds), restart)
    t_start = time.perf_counter()
    started: dict[int, float] = {}

    def run(r: int, stages: tuple[str, ...]) -> None:
        started.setdefault(r, time.perf_counter())
        if stages == TRAIN_STAGES:  # the trainer lane: one process for the run where it can keep the model (`assets.trainer_lane`)
            materialize_in_lane(tables, r, settings, engine, stages, per_round=_materialize_in_process_of_its_own)
        else:
            materialize_round(instance, tables, r, settings, engine, quiet_dagster, stages=stages)
        tables.publish(r)

    def finished(r: int) -> None:
        done.append(r)
        bar.update(1)
        # from its sampling to its evaluation, overlapping its neighbours
        announce_round(tables, r, done, metrics, time.perf_counter() - started[r], t_start, bar, out, trackers, judged)

    if trackers:  # a resumed run logs the rounds a tracker has not seen yet (a no-op for the others)
        for r in done:
            log_round(tables.root, r, trackers, metrics=metrics)
    config = settings.run_config()
    with pinned_sampler(config.scale.trainer_cores):
        k, schedule = config.max_staleness, config.staleness_schedule
        try:
            run_overlapped(first, n_rounds, k, run, finished, schedule=schedule, plan=StorePlan(tables, schedule, k))
        finally:
            close_lanes()
    return round_summary(tables.root, [BASE_ROUND, *done], metrics, judged)


def _materialize_in_process_of_its_own(tables: Tables, r: int, settings, engine: str, stages: tuple[str, ...]) -> None:
    """`materialize_round(..., stages=stages)` run by `python -m assets.lane`, which shares this
    run's writer lock and dies with it (`pipeline.store.lifeline`); its failure raised here as the
    `MaxitError` it reported."""
    import json
    import subprocess
    import tempfile
    from dataclasses import asdict

    from assets.trainer_lane import pin_to_cores
    from pipeline.config.scale import devices_env, parse_cores

    values = settings.settings() if hasattr(settings, "settings") else settings
    with tempfile.TemporaryDirectory(prefix="maxit-lane-") as tmp:
        settings_file, result = Path(tmp) / "settings.json", Path(tmp) / "result.json"
        settings_file.write_text(json.dumps({k: list(v) if isinstance(v, tuple) else v for k, v in asdict(values).items()}), encoding="utf-8")
        argv = [sys.executable, "-m", "assets.lane", "--store", str(tables.location), "--engine", engine, "--settings", str(settings_file),
                "--round", str(r), "--stages", *stages, "--home", str(dagster_home(tables.root)), "--result", str(result)]
        scale = settings.run_config().scale
        cores = scale.trainer_cores
        env = devices_env(scale.trainer_devices) or dict(os.environ)  # --trainer-devices: the lane and its ranks
        if cores is not None:
            env["OMP_NUM_THREADS"] = str(len(parse_cores(cores, "--trainer-cores")))
        done = subprocess.run(argv, cwd=PROJECT_ROOT, env=env, preexec_fn=preexec(None if cores is None else lambda: pin_to_cores(cores)))
        reason = json.loads(result.read_text(encoding="utf-8"))["error"] if result.is_file() else f"exit code {done.returncode}"
    if reason is not None or done.returncode != 0:
        raise MaxitError(reason or f"round {r}: {' '.join(stages)} stopped with exit code {done.returncode}")
