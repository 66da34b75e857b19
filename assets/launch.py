"""`maxit run` (rounds materialized in-process) and `maxit ui` (the Dagster UI on 127.0.0.1).

Every store is one experiment with its own Dagster instance, `<store>/.dagster/` (its
dagster.yaml written from the project's `dagster.yaml`): the run, event and asset storage of a
store's rounds lives next to its tables, so two stores never share asset partitions, and
`maxit ui --store DIR` shows exactly the rounds of DIR.

By default `maxit run` prints only its own progress, one line per finished round and the round
table at the end; the engines' and libraries' output (vLLM and Dagster log lines, Python
warnings, C++ warnings written straight to the process's stderr) goes to `<store>/maxit.log`,
and `--verbose` prints it as well.

One writer per store: a run, and each materialization a UI run makes, holds the store's writer
lock (`pipeline.store.lock`); a second writer stops with an error naming the first."""

from __future__ import annotations

import contextlib
import logging
import os
import resource
import signal
import sys
import threading
import time
from pathlib import Path
from typing import IO, Iterator

import polars as pl

from pipeline.errors import MaxitError, RunInterrupted
from pipeline.run.experiment_record import EXPERIMENT_FILE, LOG_FILE, record_experiment
from pipeline.store.lifeline import preexec, run_lifeline, stop_orphans
from pipeline.run.ray_shards import check_ray, ray_session
from pipeline.reporting.report import reward_error_lines, round_line, round_summary
from pipeline.run.rounds import round_complete
from pipeline.run.timings import record_other
from pipeline.reporting.tracking import check_targets, log_round
from pipeline.store import BASE_ROUND, Tables, UrlStore, atomic_write_text, is_url
from pipeline.store.lock import StoreLocked, command_line, token_in_env
from pipeline.store.lock import acquire as acquire_writer_lock

from assets.instance import PROJECT_ROOT, dagster_home, instance_at

log = logging.getLogger("maxit")

def _peak_rss_mb() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return max(own, kids) / 1024.0


@contextlib.contextmanager
def console_to_log(log_path: str | Path, verbose: bool = False) -> Iterator[tuple[IO[str], IO[str]]]:
    """Send everything this process writes to its stdout and stderr (file descriptors 1 and 2:
    Python's print, warnings and logging, and C/C++ libraries writing to them directly) to
    `log_path` (appended), and, with `verbose`, to the console's stderr too. Yields
    (stdout, stderr) streams on the console for maxit's own output. Restored on exit."""
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    saved = {1: os.dup(1), 2: os.dup(2)}
    console_out = os.fdopen(os.dup(saved[1]), "w", buffering=1)
    console_err = os.fdopen(os.dup(saved[2]), "w", buffering=1)
    log_file = open(log_path, "ab", buffering=0)
    log_file.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} pid {os.getpid()}: {' '.join(sys.argv)}\n".encode())
    tee = None
    if verbose:
        read_end, write_end = os.pipe()
        target = write_end

        def copy() -> None:
            try:
                while chunk := os.read(read_end, 65536):
                    log_file.write(chunk)
                    os.write(saved[2], chunk)
            except (OSError, ValueError):  # the console or the log was closed first
                pass
            finally:
                os.close(read_end)

        tee = threading.Thread(target=copy, name="maxit-log-tee", daemon=True)
        tee.start()
    else:
        target = log_file.fileno()
    os.dup2(target, 1)
    os.dup2(target, 2)
    if verbose:
        os.close(write_end)
    try:
        yield console_out, console_err
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os.dup2(saved[1], 1)
        os.dup2(saved[2], 2)
        if tee is not None:
            tee.join(timeout=10)  # ends when no process holds the pipe's write end any more
        for fd in saved.values():
            os.close(fd)
        console_out.close()
        console_err.close()
        log_file.close()


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
    maxit's progress and one line per finished round (`pipeline.run.report.round_line`; the caller
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


@contextlib.contextmanager
def engine_devices(devices: str | None) -> Iterator[None]:
    """With `devices` ("0,1", `--engine-devices`): this process, and so its engines and every
    process it starts but the trainer's (`--trainer-devices`), sees only those accelerators
    (`CUDA_VISIBLE_DEVICES`, restored on exit). CUDA reads it once, when first used: a process
    that has used it already cannot be given other devices, which is an error here."""
    from pipeline.config.scale import DEVICES_ENV, devices_env

    if devices is None:
        yield
        return
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        raise MaxitError(f"--engine-devices {devices}: CUDA is already in use in this process; start a new one")
    before = os.environ.get(DEVICES_ENV)
    os.environ[DEVICES_ENV] = devices_env(devices)[DEVICES_ENV]
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(DEVICES_ENV, None)
        else:
            os.environ[DEVICES_ENV] = before


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
            return _run_overlapped(n_rounds, tables, settings, engine, restart, instance, quiet_dagster, out, bar, metrics, trackers, judged)
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
            _announce_round(tables, r, done, metrics, time.perf_counter() - t0, t_start, bar, out, trackers, judged)
    finally:
        bar.close()
        close_engines()
    return round_summary(tables.root, [BASE_ROUND, *done], metrics, judged)


def _announce_round(tables: Tables, r: int, done: list[int], metrics, seconds: float, t_start: float, bar, out, trackers, judged) -> None:
    """Round r is done: its line on the console (the round table is printed once, at the end) and
    its metrics to the trackers."""
    bar.set_postfix_str(f"round {r}: {seconds:.0f}s")
    summary = round_summary(tables.root, [BASE_ROUND, *done], metrics, judged)
    line = round_line(_row(summary, r), _row(summary, BASE_ROUND), metrics, seconds, time.perf_counter() - t_start, _peak_rss_mb())
    _print_lines([line, *reward_error_lines(tables.root, r, str(tables.location))], bar, out)
    if trackers:
        log_round(tables.root, r, trackers, metrics=metrics)


def _run_overlapped(n_rounds, tables: Tables, settings, engine, restart, instance, quiet_dagster, out, bar, metrics, trackers, judged) -> pl.DataFrame:
    """`_run_rounds` with rounds that overlap (`assets.overlap`): the first incomplete round and
    every later one made from scratch, round r's sampling beside round r-1's training."""
    from assets.trainer_lane import close_lanes, materialize_in_lane
    from assets.overlap import TRAIN_STAGES, StorePlan, prepare_resume, run_overlapped

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
        _announce_round(tables, r, done, metrics, time.perf_counter() - started[r], t_start, bar, out, trackers, judged)

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


@contextlib.contextmanager
def pinned_sampler(trainer_cores: str | None) -> Iterator[None]:
    """With `trainer_cores` ("1", "2-3"): this thread (the sampler lane, and the engines it starts,
    whose threads bind to the cores they may use) pinned to the other cores meanwhile; the trainer
    lane's process is pinned to `trainer_cores` (`assets.trainer_lane.pin_to_cores`)."""
    if trainer_cores is None:
        yield
        return
    from pipeline.config.scale import parse_cores

    before = os.sched_getaffinity(0)
    mine = set(parse_cores(trainer_cores, "--trainer-cores"))
    if not mine <= before or not before - mine:
        raise MaxitError(f"--trainer-cores {trainer_cores}: this process may use cores {sorted(before)}; the trainer's must be among them "
                         "and leave the sampler at least one")
    import torch

    threads = torch.get_num_threads()
    os.sched_setaffinity(0, before - mine)
    try:
        torch.set_num_threads(len(before - mine))
        yield
    finally:
        os.sched_setaffinity(0, before)
        torch.set_num_threads(threads)


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


def materialize_round(instance, tables: Tables, r: int, settings, engine: str, quiet_dagster: bool, stages: tuple[str, ...] | None = None) -> None:
    """Run round `r`'s assets and checks from scratch on `instance`, or only the assets `stages`
    (with their checks; overlapped rounds): in this process with one shard, one process per step
    with several. A failed round is a `MaxitError` naming each failed step (`round_failure`)."""
    import dagster as dg

    from assets.checks import all_checks
    from assets.definitions import ROUND_ASSETS, make_resources
    from assets.partitions import rounds as rounds_def

    if stages is None:
        tables.remove_temporary(r)  # left by a run killed mid-write
        if round_complete(tables, r):  # --restart: the round is incomplete until it finishes again,
            tables.remove(r, "evaluation")  # so a run stopped mid-way does not leave its new tables beside the old evaluation
    key = str(r)
    if not instance.has_dynamic_partition(rounds_def.name, key):
        instance.add_dynamic_partitions(rounds_def.name, [key])
    location = str(tables.location)
    run_config = {"loggers": {"console": {"config": {"log_level": "WARNING" if quiet_dagster else "INFO"}}}}
    tags = {"maxit/launched_by": "maxit run", "maxit/store": location}
    scale = settings.run_config().scale
    if scale.shards > 1 and scale.executor != "ray":
        # one process per step (each shard's rollouts with its own engine), up to `shards` at once;
        # on Ray the shards are Ray tasks, handed over by one step of the in-process run below
        job = sharded_round_job(location, engine, settings)
        selection = None if stages is None else [dg.AssetKey(s) for s in stages]
        result = dg.execute_job(job, instance=instance, run_config=run_config, tags={**tags, "dagster/partition": key}, raise_on_error=False,
                                asset_selection=selection)
    else:
        result = dg.materialize(
            [*ROUND_ASSETS, *all_checks], partition_key=key, instance=instance, resources=make_resources(location, engine, settings),
            run_config=run_config, raise_on_error=False, tags=tags, selection=None if stages is None else list(stages),
        )
    if not result.success:
        failed_checks = [
            f"{ev.asset_check_key.name}: {ev.metadata}"
            for ev in result.get_asset_check_evaluations()
            if not ev.passed and ev.severity == dg.AssetCheckSeverity.ERROR
        ]
        raise round_failure(r, result.run_id, result.all_events, failed_checks)


INTERRUPTS = ("DagsterExecutionInterruptedError", "KeyboardInterrupt")
"""Errors by which Dagster reports a step stopped from outside, not failed."""


def root_error(error):
    """The innermost error of a Dagster failure (`SerializableErrorInfo`): a step's error wraps
    the exception the stage raised in its `cause` chain."""
    while error.cause is not None:
        error = error.cause
    return error


def error_text(error) -> str:
    """`error`'s message without its module path: maxit's own errors as they read, any other as
    "ClassName: message"."""
    text = error.message.strip()
    head, sep, rest = text.partition(": ")
    message = rest if sep and head.rsplit(".", 1)[-1] == error.cls_name else text
    own = head.startswith(("pipeline.", "schemas.", "assets.")) and error.cls_name.endswith("Error")
    return message if own else f"{error.cls_name}: {message}"


def round_failure(round_: int, run_id: str, events, failed_checks=()) -> MaxitError:
    """The error `maxit run` stops with when round `round_`'s Dagster run failed: each failed
    step's name and the innermost error it raised, one line each, or `RunInterrupted` when the run
    was stopped from outside. The whole stack traces go to stderr, which a run sends to
    STORE/maxit.log."""
    causes: list[str] = []
    seen: set[str] = set()
    interrupted = False
    for e in events:
        error = getattr(e.event_specific_data, "error", None) if e.is_failure else None
        if error is None:
            continue
        print(f"{e.message}\n{error.to_string().strip()}", file=sys.stderr)
        root = root_error(error)
        interrupted |= root.cls_name in INTERRUPTS or error.cls_name in INTERRUPTS
        text = error_text(root)
        if text in seen and not e.step_key:  # the run's failure repeats its failed step's error
            continue
        seen.add(text)
        line = f"{e.step_key}: {text}" if e.step_key else text
        if line not in causes:
            causes.append(line)
    if interrupted:
        return RunInterrupted(
            f"round {round_} interrupted (run {run_id}); `maxit run` again with the same --store resumes: "
            f"complete rounds are kept and round {round_} is run again from its start"
        )
    findings = causes + [f"check {c}" for c in failed_checks] or ["no step reported an error (see the Dagster run in the UI)"]
    return MaxitError(f"round {round_} failed (run {run_id}):\n" + "\n".join(f"- {c}" for c in findings))


SHARDED_JOB = "expert_iteration_round_multiprocess"


def sharded_round_job(store: str, engine: str, settings):
    """The round job on Dagster's multiprocess executor, as a reconstructable job: every step
    (each shard's rollouts among them) runs in its own process, at most `settings.shards` at
    once. The child processes rebuild the job from this module with the same store, engine and
    settings (`build_round_job`)."""
    import dagster as dg

    values = settings.settings() if hasattr(settings, "settings") else settings
    from dataclasses import asdict

    kwargs = {"store": str(store), "engine": engine, "settings": {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(values).items()}}
    return dg.build_reconstructable_job(__name__, "build_round_job", reconstructable_kwargs=kwargs, reconstructor_working_directory=str(PROJECT_ROOT))


def build_round_job(store: str, engine: str, settings: dict, executor=None):
    """The job of one round's assets and checks with the run's resources bound, on the
    multiprocess executor (`max_concurrent` = shards) unless `executor` is given. The same
    definitions run on a cluster by passing another executor (`dagster_k8s.k8s_job_executor`,
    `dagster_celery.celery_executor`): see docs/SCALING.md."""
    import dagster as dg

    from assets.checks import all_checks
    from assets.config import RunSettings
    from assets.definitions import ROUND_ASSETS, make_resources
    from assets.partitions import rounds as rounds_def

    run_settings = RunSettings(**settings)
    if executor is None:
        executor = dg.multiprocess_executor.configured({"max_concurrent": run_settings.run_config().scale.shards})
    job = dg.define_asset_job(SHARDED_JOB, selection=dg.AssetSelection.groups("expert_iteration"), partitions_def=rounds_def)
    defs = dg.Definitions(
        assets=ROUND_ASSETS, asset_checks=all_checks, jobs=[job], resources=make_resources(store, engine, run_settings), executor=executor
    )
    return defs.resolve_job_def(SHARDED_JOB)


def _row(summary: pl.DataFrame, round_: int) -> dict | None:
    rows = summary.filter(pl.col("round") == round_)
    return rows.row(0, named=True) if rows.height else None


def _print_lines(lines: list[str], bar, file: IO[str]) -> None:
    """`lines` on the console's stdout, the progress bar (on stderr) cleared first and drawn again
    below them, so that on a terminal the two do not share a line."""
    bar.clear()
    for line in lines:
        print(line, file=file, flush=True)
    bar.refresh()


def ui(host: str = "127.0.0.1", port: int = 3000, home: str | Path | None = None, store: str | None = None, engine: str | None = None) -> int:
    """Run `dagster dev` bound to `host` on the store's instance (`dagster_home(store)`), its
    runs writing to that store, and exit cleanly on Ctrl-C or SIGTERM (dagster dev started in
    the background ignores both otherwise).

    `dagster dev` starts in the instance folder: started anywhere else it warns that a
    dagster.yaml there (the project's own, say) is not used; the code location is found by module
    and `--working-directory`, so the folder it starts in does not matter otherwise."""
    if store is not None and is_url(store):  # its working copy holds the instance; the stages write to the URL
        url = UrlStore(store)
        url.local.mkdir(parents=True, exist_ok=True)
        try:
            # reconciling deletes the working copy's tables the URL lacks: never under a live writer,
            # whose tables not yet uploaded they would be
            with acquire_writer_lock(url.local, command=command_line()):
                url.pull(reconcile=True)
        except StoreLocked as err:
            print(f"working copy not refreshed from {url.url}: {err}", flush=True)
        store_path, location = url.local, url.url
    else:
        store_path = Path(store or "runs/default").resolve()
        location = str(store_path)
    env = dict(os.environ)
    env["DAGSTER_HOME"] = str(dagster_home(store_path, home))
    env["MAXIT_STORE"] = location
    if engine:
        env["MAXIT_ENGINE"] = engine
    exe = Path(sys.executable).with_name("dagster")
    cmd = [str(exe), "dev", "--host", host, "--port", str(port), "-m", "assets.definitions", "--working-directory", str(PROJECT_ROOT)]
    print(f"Dagster UI on http://{host}:{port} (store {location}, instance {env['DAGSTER_HOME']}); Ctrl-C stops it", flush=True)
    import subprocess

    def restore_sigint():
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.setsid()

    proc = subprocess.Popen(cmd, env=env, cwd=env["DAGSTER_HOME"], preexec_fn=restore_sigint)

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
