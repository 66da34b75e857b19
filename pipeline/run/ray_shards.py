"""Rollout shards on Ray (`maxit run --shards S --executor ray [--ray-address ADDR]`).

Each shard's sampling is one Ray task with its own engine and the resources a shard asks for
(`shard_resources`: the GPUs of one engine where the cluster has GPUs, an even share of its CPUs
otherwise). The task does what a shard's Dagster step does (`sample_shard`): it samples its share
of the round's problems with per-request seeds and writes its part of the `steps` table through
the store's table owner; the rollouts asset then merges the parts once, so the rows depend on
neither the executor nor the shard count.

With no address the run starts a local Ray instance for itself (`ray_session`), every server of
it on 127.0.0.1, and stops it when the run ends; with one, the run joins that cluster (its
workers need maxit installed and the store reachable) and leaves it running. A worker that dies
is retried (`max_retries`); a shard that still fails, or whose code raised, stops the round with
an error naming the shard (`ShardFailed`).

Ray is imported only here, inside functions: a run on the default executor never loads it."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Mapping, Sequence

import polars as pl

from pipeline.config import RunConfig
from pipeline.engines.pool import EnginePool
from pipeline.errors import ConfigError, MaxitError
from pipeline.rollout.sampling import shard_of
from pipeline.run.context import RoundContext
from pipeline.run.rounds import sample_round

__all__ = ["ShardJob", "ShardFailed", "RaySession", "check_ray", "ray_session", "shard_resources", "sample_shard", "run_shards", "MAX_RETRIES"]

MAX_RETRIES = 2
"""Times Ray starts a shard again whose worker process died (a Python error is not retried: the
same rows would raise it again)."""

LOCAL_ENV = {
    # Ray reads it at import: the node's IP is then 127.0.0.1, so every server binds loopback
    # (without it `_node_ip_address="127.0.0.1"` is replaced by the machine's routable address)
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "RAY_AUTH_MODE": "disabled",  # a private instance: no token file written to the user's home
    "RAY_USAGE_STATS_ENABLED": "0",
}
"""Environment of a local Ray instance, set (a user's own values win) before Ray is imported."""


class ShardFailed(MaxitError):
    """A rollout shard failed on Ray; the message names the shard and its error."""


@dataclass(frozen=True)
class ShardJob:
    """What a Ray task needs to sample one shard, without Dagster: the store's location (a folder
    or URL every worker reaches), the run's config, the engine and its options, the round, the
    shard and the checkpoints (policy id -> folder) the round samples with."""

    store: str
    config: RunConfig
    engine: str
    engine_options: Mapping[str, object]
    round: int
    shard: int
    shards: int
    checkpoints: Mapping[str, str]


def sample_shard(ctx: RoundContext, round_: int, shard: int, shards: int, checkpoints: Mapping[str, Path]) -> dict:
    """Sample shard `shard` of `shards` of round `round_`'s problems with `ctx`'s engines and write
    its part of the `steps` table: its problems, rows, process, host, start and end times, and
    the engine seconds it spent (which travel with the result to the round's timings)."""
    started = time.time()
    problems = ctx.tables.read(round_, "problems")
    mine = problems.filter(pl.col("uid").map_elements(lambda u: shard_of(u, shards), return_dtype=pl.Int64) == shard)
    before = ctx.substage_seconds()
    rows = ctx.tables.write(round_, "steps", sample_round(ctx, round_, mine, checkpoints), part=shard).rows if mine.height else 0
    ctx.tables.publish(round_)  # a URL store: the part goes up for the merge, maybe on another machine
    spent = {k: v - before[k] for k, v in ctx.substage_seconds().items() if v > before[k]}
    return {"shard": shard, "problems": mine.height, "rows": rows, "pid": os.getpid(), "host": socket.gethostname(),
            "substages": spent, "summary": None, "started": started, "finished": time.time()}


def shard_task(job: ShardJob) -> dict:
    """The body of a shard's Ray task: a round context of its own, an engine of its own (closed
    at the end, so a reused worker holds no engine between rounds), `sample_shard`."""
    ctx = RoundContext(job.store, job.config)
    ctx.engines = EnginePool(job.engine, job.engine_options)
    try:
        ctx.tables.pull()
        return sample_shard(ctx, job.round, job.shard, job.shards, {pid: Path(p) for pid, p in job.checkpoints.items()})
    finally:
        ctx.engines.close()


# -- checks -------------------------------------------------------------------------------------
def check_ray(executor: str, address: str | None, store: str) -> None:
    """`--executor ray`'s inputs before anything is written, each a one-line `ConfigError` naming
    its flag: Ray installed, a store the workers can reach, an address a cluster answers at."""
    if executor != "ray":
        return
    import importlib.util

    if importlib.util.find_spec("ray") is None:
        raise ConfigError("--executor ray: Ray is not installed in this environment (pip install 'ray[default]'), or use --executor dagster")
    if str(store).startswith("memory://"):
        raise ConfigError(f"--store {store}: the memory filesystem is one process's, and --executor ray samples in Ray's worker processes; "
                          "use a folder or a store every worker can reach")
    if address is not None:
        check_address(address)


def check_address(address: str, timeout: float = 5.0) -> None:
    """A Ray cluster answers at `address` ("HOST:PORT", "ray://HOST:PORT" or "auto"): Ray itself
    retries an unreachable address for minutes, so the run checks it first."""
    address = address.strip()
    if address == "auto":
        if not os.environ.get("RAY_ADDRESS") and not Path(tempfile.gettempdir(), "ray", "ray_current_cluster").exists():
            raise ConfigError("--ray-address auto: no Ray cluster runs on this machine (none recorded by `ray start`, RAY_ADDRESS unset)")
        return
    hostport = address.removeprefix("ray://")
    host, sep, port = hostport.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ConfigError(f"--ray-address {address}: not HOST:PORT (a Ray head's GCS address, e.g. 10.0.0.5:6379), ray://HOST:PORT or auto")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            pass
    except OSError as e:
        raise ConfigError(f"--ray-address {address}: no Ray cluster answers there ({e.strerror or e})") from None


# -- the Ray instance ---------------------------------------------------------------------------
@dataclass(frozen=True)
class RaySession:
    """The Ray cluster a run's shards go to: its resources (`ray.cluster_resources()`) and, for a
    local instance the run started, the folder of its sockets and logs (None for a cluster joined)."""

    resources: Mapping[str, float]
    local_dir: str | None = None


@contextlib.contextmanager
def ray_session(address: str | None = None) -> Iterator[RaySession]:
    """Ray connected for the block. In a process already connected (a run's driver, whose rounds
    share one instance) nothing changes. Otherwise: with an `address`, the cluster there, left
    running; with none, a local instance of this machine's cores, every server on 127.0.0.1,
    started here and stopped (its processes and its folder gone) at the end of the block."""
    if address is None:
        for name, value in LOCAL_ENV.items():
            os.environ.setdefault(name, value)
        os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # loopback only, whatever the environment says
    import ray

    if ray.is_initialized():
        yield RaySession(ray.cluster_resources())
        return
    if address is None:
        from ray._private import ray_constants

        ray_constants.ENABLE_RAY_CLUSTER = False  # what LOCAL_ENV's first variable does, for a Ray imported before it was set
    if address is not None:
        ray.init(address=address, logging_level="ERROR", log_to_driver=True)
        try:
            yield RaySession(ray.cluster_resources())
        finally:
            ray.shutdown()
        return
    # Ray's sockets live in it and a Unix socket path is at most 107 bytes: a short name in /tmp
    local_dir = tempfile.mkdtemp(prefix="maxit-ray-", dir="/tmp")
    _start_local(ray, local_dir)  # a failed start keeps the folder: its logs say why
    try:
        yield RaySession(ray.cluster_resources(), local_dir)
    finally:
        ray.shutdown()
        _kill_processes_of(local_dir)  # a worker still stopping, say
        shutil.rmtree(local_dir, ignore_errors=True)


def _start_local(ray, local_dir: str, attempts: int = 3) -> None:
    """A local Ray instance in `local_dir`, loopback only. Its node gives its agents a fixed time to
    start, which a busy machine can exceed: the start is tried `attempts` times (what a failed one
    started is stopped), then refused in one line."""
    for attempt in range(attempts):
        try:
            with _minimal_agents(ray):
                ray.init(address="local", num_cpus=os.cpu_count() or 1, include_dashboard=False, object_store_memory=128 * 1024**2,
                         _temp_dir=local_dir, logging_level="ERROR", log_to_driver=True)
        except Exception as e:  # Ray raises a bare Exception for a node that did not come up
            ray.shutdown()
            _kill_processes_of(local_dir)  # a node that failed to start is not stopped by ray.shutdown
            print(f"local Ray instance, attempt {attempt + 1} of {attempts}: {e}", file=sys.stderr)
            error = e
            continue
        node_ip = ray.nodes()[0]["NodeManagerAddress"]
        if node_ip != "127.0.0.1":  # Ray was imported before LOCAL_ENV was set
            ray.shutdown()
            raise MaxitError(f"--executor ray: the local Ray instance listens on {node_ip}, not only on 127.0.0.1: "
                             "set RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 before Ray is imported")
        return
    raise MaxitError(f"--executor ray: the local Ray instance did not start in {attempts} attempts ({error}); its logs: {local_dir}")


@contextlib.contextmanager
def _minimal_agents(ray) -> Iterator[None]:
    """Start the node's dashboard agent and head in Ray's minimal mode, as if `ray[default]`'s
    dashboard packages were absent: the agent then reports its ports at once instead of after
    loading its HTTP and metrics modules, which on a busy machine outlasts the raylet's fixed
    wait for them, and a private instance serves no dashboard. Ray decides it in this one call."""
    utils = ray._private.utils
    original = getattr(utils, "get_dashboard_dependency_error", None)
    if original is not None:
        utils.get_dashboard_dependency_error = lambda: ImportError("maxit's local Ray instance: no dashboard")
    try:
        yield
    finally:
        if original is not None:
            utils.get_dashboard_dependency_error = original


def _kill_processes_of(local_dir: str) -> list[int]:
    """Kill, by process id, the processes whose command line names `local_dir`: the servers and
    workers of the local instance this process started there, and only those. Returns their ids."""
    import signal

    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            with contextlib.suppress(OSError):
                if local_dir.encode() in (entry / "cmdline").read_bytes():
                    pids.append(int(entry.name))
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return pids


def shard_resources(cluster: Mapping[str, float], shards: int, engine_gpus: int = 1) -> dict:
    """Ray resources of one shard's task on a cluster with `cluster`'s resources: where there are
    GPUs, the `engine_gpus` of one engine (its tensor- times data-parallel size) and one CPU;
    otherwise an even share of the CPUs (Ray sets the task's OMP_NUM_THREADS to it). A request
    the cluster can never meet would wait for ever, so it is refused."""
    gpus = float(cluster.get("GPU", 0))
    if gpus >= 1:
        if engine_gpus > gpus:
            raise ConfigError(f"--tensor-parallel-size x --data-parallel-size = {engine_gpus} GPUs per shard, but the Ray cluster has {gpus:g}")
        return {"num_cpus": 1, "num_gpus": engine_gpus}
    return {"num_cpus": max(1, int(cluster.get("CPU", 1)) // max(1, shards)), "num_gpus": 0}


def run_shards(jobs: Sequence, resources: Mapping, task: Callable = shard_task, max_retries: int = MAX_RETRIES) -> list:
    """`task(job)` for every job as a Ray task with `resources`, all at once; their results in
    job order. A worker that dies is started again up to `max_retries` times; the first shard
    that still fails raises `ShardFailed` naming it (each job has a `shard`) and its error, and
    the other shards are cancelled. Ray must be connected (`ray_session`)."""
    import ray
    from ray.exceptions import RayError

    remote = ray.remote(task).options(max_retries=max_retries, retry_exceptions=False, **resources)
    pending = {remote.remote(job): job for job in jobs}
    results = {}
    while pending:
        done, _ = ray.wait(list(pending), num_returns=1)
        job = pending.pop(done[0])
        try:
            results[job.shard] = ray.get(done[0])
        except RayError as e:  # the task raised, its worker died, or it was lost
            for ref in pending:
                ray.cancel(ref, force=True)
            print(f"shard {job.shard} on Ray:\n{e}", file=sys.stderr)  # the worker's trace, for the run's log
            raise ShardFailed(f"shard {job.shard} of {len(jobs)} failed on Ray: {_cause(e, max_retries)}") from None
    return [results[job.shard] for job in jobs]


def _cause(error, max_retries: int) -> str:
    """One line for a shard's Ray error: the exception its code raised, or how its worker died."""
    from ray.exceptions import RayTaskError, WorkerCrashedError

    if isinstance(error, WorkerCrashedError):
        return f"its worker process died ({max_retries + 1} attempts)"
    if isinstance(error, RayTaskError) and error.cause is not None:
        error = error.cause
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__
