"""Rollout shards on Ray (`--executor ray`): a local Ray instance on loopback, started and stopped
by the test or the run; shards that die are retried or named; the rows equal `--shards 1` on the
default executor. Ray is an extra: without it these tests skip, saying so."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import polars as pl
import pytest

from pipeline.store import table_path

PROJECT = Path(__file__).resolve().parents[1]


def _require_ray():
    import importlib.util

    if importlib.util.find_spec("ray") is None:
        pytest.skip("ray is not installed (pip install 'ray==2.60.0', the ray extra): --executor ray cannot run")


# -- checks before anything starts ----------------------------------------------------------------
@pytest.mark.parametrize(
    "flags, message",
    [
        (["--shards", "2", "--ray-address", "127.0.0.1:1"], "--ray-address 127.0.0.1:1: no Ray cluster answers there (Connection refused)"),
        (["--shards", "2", "--ray-address", "headnode"], "--ray-address headnode: not HOST:PORT"),
        (["--store", "memory://run"], "--store memory://run: the memory filesystem is one process's, and --executor ray samples in Ray's worker"),
    ],
)
def test_bad_ray_flags_are_one_line_errors(tmp_path, flags, message, capsys):
    _require_ray()
    from maxit.cli import main

    argv = ["run", "--rounds", "1", "--store", str(tmp_path / "store"), "--executor", "ray", *flags]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err and "Traceback" not in err
    assert not (tmp_path / "store").exists()


def test_shard_resources():
    from pipeline.errors import ConfigError
    from pipeline.run.ray_shards import shard_resources

    assert shard_resources({"CPU": 8.0}, 2) == {"num_cpus": 4, "num_gpus": 0}
    assert shard_resources({"CPU": 2.0}, 4) == {"num_cpus": 1, "num_gpus": 0}
    assert shard_resources({"CPU": 16.0, "GPU": 4.0}, 4, engine_gpus=2) == {"num_cpus": 1, "num_gpus": 2}
    with pytest.raises(ConfigError, match="4 GPUs per shard, but the Ray cluster has 2"):
        shard_resources({"CPU": 16.0, "GPU": 2.0}, 2, engine_gpus=4)


# -- a local instance: loopback, retries, failures named, nothing left ------------------------------
def _listeners(local_dir: str) -> set[str]:
    """The addresses the local instance's processes listen on (TCP)."""
    import psutil

    out = set()
    for proc in psutil.process_iter(["pid", "cmdline"]):
        if any(local_dir in arg for arg in proc.info["cmdline"] or ()):
            for conn in proc.net_connections("inet"):
                if conn.status == psutil.CONN_LISTEN:
                    out.add(conn.laddr.ip)
    return out


def _pids_of(local_dir: str) -> list[int]:
    import psutil

    return [p.pid for p in psutil.process_iter(["cmdline"]) if any(local_dir in arg for arg in p.info["cmdline"] or ())]


@pytest.fixture(scope="module")
def local_ray():
    """One local Ray instance for the module's tests, stopped after them (and checked gone)."""
    _require_ray()
    from pipeline.run.ray_shards import ray_session

    with ray_session() as session:
        import ray

        ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers cannot import a test module
        yield session
    assert not _pids_of(session.local_dir), "the local instance's processes outlive its session"
    assert not os.path.exists(session.local_dir)
    import ray

    assert not ray.is_initialized()


@pytest.mark.integration
def test_local_instance_listens_on_loopback_only(local_ray):
    import ray

    assert ray.nodes()[0]["NodeManagerAddress"] == "127.0.0.1"
    assert ray.get_runtime_context().gcs_address.startswith("127.0.0.1:")
    listening = _listeners(local_ray.local_dir)
    assert listening and listening <= {"127.0.0.1", "::ffff:127.0.0.1"}, listening


def _exit_first_time(job):
    """A shard whose worker process exits (os._exit) the first time it runs, then succeeds."""
    marker = Path(job.marker)
    if not marker.exists():
        marker.write_text("died once")
        os._exit(3)
    return {"shard": job.shard, "pid": os.getpid()}


def _always_exit(job):
    if job.shard == 1:
        os._exit(3)
    return {"shard": job.shard}


def _raise(job):
    if job.shard == 1:
        raise ValueError(f"no reward for shard {job.shard}")
    return {"shard": job.shard}


@pytest.mark.integration
def test_a_shard_whose_worker_dies_is_retried(local_ray, tmp_path):
    from pipeline.run.ray_shards import run_shards

    jobs = [SimpleNamespace(shard=s, marker=str(tmp_path / f"died-{s}")) for s in range(2)]
    out = run_shards(jobs, {"num_cpus": 1}, task=_exit_first_time, max_retries=1)
    assert [o["shard"] for o in out] == [0, 1]
    assert all((tmp_path / f"died-{s}").exists() for s in range(2)), "each shard's first worker died"


@pytest.mark.integration
@pytest.mark.parametrize(
    "task, retries, message",
    [
        (_always_exit, 1, r"^shard 1 of 2 failed on Ray: its worker process died \(2 attempts\)$"),
        (_raise, 2, r"^shard 1 of 2 failed on Ray: ValueError: no reward for shard 1$"),
    ],
)
def test_a_shard_that_fails_is_named(local_ray, task, retries, message):
    from pipeline.run.ray_shards import ShardFailed, run_shards

    jobs = [SimpleNamespace(shard=s) for s in range(2)]
    with pytest.raises(ShardFailed, match=message):
        run_shards(jobs, {"num_cpus": 1}, task=task, max_retries=retries)


# -- the acceptance check: `maxit run` on Ray against --shards 1 on the default executor -------------
def _session_processes(sid: int) -> list[str]:
    """Processes still in session `sid` (everything a `maxit run` started in its own session)."""
    import psutil

    out = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            if os.getsid(proc.pid) == sid:
                out.append(f"{proc.pid}: {' '.join(proc.info['cmdline'] or [])[:120]}")
        except (ProcessLookupError, PermissionError):
            pass
    return out


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.vllm
@pytest.mark.timeout(3600)
def test_maxit_run_on_ray_gives_the_rows_of_one_shard(tmp_path, default_model_dir):
    """`maxit run --rounds 1 --shards 2 --executor ray` (a local Ray instance on loopback, started
    and stopped by the run) against `--shards 1` on the default executor, same seed, on vLLM: the
    same step ids, prompts and seeds, >= 90% identical completions, two shards in two Ray worker
    processes, and nothing of the instance left running once the run has exited."""
    from conftest import require_vllm

    require_vllm()
    common = ["--model-dir", str(default_model_dir), "--engine", "vllm", "--seed", "3", "--problems", "6", "--samples", "2",
              "--strategies", "iid", "tree", "--max-loop-num", "1", "--eval-problems", "4", "--eval-samples", "1", "--epochs", "1",
              "--minibatch-size", "64", "--micro-batch-size", "32"]
    exe = str(Path(sys.executable).with_name("maxit"))
    one = subprocess.run([exe, "run", "--rounds", "1", "--store", str(tmp_path / "one"), "--shards", "1", *common],
                         cwd=PROJECT, capture_output=True, text=True)
    assert one.returncode == 0, one.stderr[-3000:]
    # in a session of its own: whatever the run starts (Ray's servers and workers) stays in it
    run = subprocess.Popen([exe, "run", "--rounds", "1", "--store", str(tmp_path / "ray"), "--shards", "2", "--executor", "ray", *common],
                           cwd=PROJECT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    _out, err = run.communicate()
    assert run.returncode == 0, err[-3000:] + (tmp_path / "ray" / "maxit.log").read_text()[-5000:]
    assert not _session_processes(run.pid), "the run's Ray instance outlived it"

    by_shard = pl.read_parquet(table_path(tmp_path / "ray", 0, "rollout_shards")).sort("shard")
    assert by_shard["shard"].to_list() == [0, 1] and by_shard["pid"].n_unique() == 2
    assert run.pid not in by_shard["pid"].to_list(), "the shards sampled in Ray's workers, not in the run's process"
    a, b = (pl.read_parquet(table_path(tmp_path / name, 0, "steps")) for name in ("one", "ray"))
    assert a["step_id"].to_list() == b["step_id"].to_list()
    assert a["prompt_ids"].to_list() == b["prompt_ids"].to_list() and a["seed"].to_list() == b["seed"].to_list()
    same = (a["completion_ids"] == b["completion_ids"]).mean()
    print(f"identical completions, --shards 1 (dagster) vs --shards 2 --executor ray on vLLM: {same:.3f} of {a.height} rows")
    assert same >= 0.9


@pytest.mark.integration
def test_rollouts_asset_on_ray_gives_the_rows_of_one_shard(local_ray, tmp_path, default_model_dir):
    """The rollouts asset with `executor` "ray" (two shards, each a Ray task in a worker of the
    module's instance, on the transformers engine) against one shard on Dagster: the same rows."""
    import dagster as dg

    from assets.config import RunSettings
    from assets.definitions import make_resources
    from assets.partitions import rounds
    from assets.problems import problems as problems_asset
    from assets.resources import close_engines
    from assets.rollouts import rollouts as rollouts_asset

    def steps(store: Path, **scale):
        settings = RunSettings(model_dir=str(default_model_dir), problems=5, samples=2, strategies=["iid", "tree"], max_loop_num=1,
                               eval_problems=4, eval_samples=1, engine="hf", **scale)
        instance = dg.DagsterInstance.ephemeral()
        instance.add_dynamic_partitions(rounds.name, ["0"])
        try:
            result = dg.materialize([problems_asset, rollouts_asset], partition_key="0", instance=instance,
                                    resources=make_resources(str(store), "hf", settings))
        finally:
            close_engines()
        assert result.success
        return pl.read_parquet(table_path(store, 0, "steps")), pl.read_parquet(table_path(store, 0, "rollout_shards"))

    one, _ = steps(tmp_path / "one", shards=1)
    two, by_shard = steps(tmp_path / "ray", shards=2, executor="ray")
    assert by_shard["shard"].to_list() == [0, 1] and by_shard["problems"].sum() == 5 and (by_shard["problems"] > 0).all()
    assert os.getpid() not in by_shard["pid"].to_list(), "the shards sampled in Ray's workers"
    assert not (tmp_path / "ray" / "round=0" / "shards").exists(), "the parts are removed once merged"
    assert one["step_id"].to_list() == two["step_id"].to_list()
    assert one.drop("model_version").equals(two.drop("model_version")), "per-request seeds: the transformers engine draws every row the same way"
