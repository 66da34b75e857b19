"""Overlapped rounds (`maxit run --max-staleness 1 --staleness-schedule exact`, three rounds) with
each way of scaling out, and a resumed overlapped run against an uninterrupted one.

Three rounds is the fewest in which a round samples with a trained checkpoint: under the exact
schedule at K=1, rounds 0 and 1 sample with the starting model and round 2 with round 0's
checkpoint while round 1 trains. Every run here is compared with one uninterrupted run on a local
store (`uninterrupted`, made once for the module): rollouts draw with per-request seeds, so the
shards, the executor and the store's location change no row; two training processes change the
trained weights in the last float bits, so there only the rows sampled by the starting model are
compared.

Each run takes minutes on two cores (process starts, three trainings, a trainer lane per round):
the tests are marked slow and run on purpose (`pytest -m slow tests/test_overlap_engines.py`)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import polars as pl
import pytest

from pipeline import store as st
from procs import kill_marked as _kill_marked, marked as _marked, wait_until as _wait_until

PROJECT = Path(__file__).resolve().parents[1]
MAXIT = str(Path(sys.executable).with_name("maxit"))
ROUNDS = 3
PLAN = {0: (-1, 0), 1: (-1, 1), 2: (0, 1)}
"""round -> (the round whose checkpoint sampled it, its rows' staleness) under the exact schedule,
K=1: round 2 samples with round 0's checkpoint and trains from round 1's."""
KEYS = {
    "problems": ("uid",), "steps": ("step_id",), "advantages": ("step_id",), "training_view": ("step_id",),
    "evaluation": ("policy_id", "agent_id", "split", "metric"),
}
"""The tables compared row for row, each with the columns that identify a row. None of them has a
column of wall time or of the machine (those are in `timings` and `rollout_shards`, not compared):
every column is compared, `model_version` included (a hash of the weights, not of a path)."""


def run_args(store: str, model_dir: Path, *extra: str) -> list[str]:
    return [
        MAXIT, "run", "--rounds", str(ROUNDS), "--store", str(store), "--engine", "hf", "--model-dir", str(model_dir),
        "--problems", "4", "--samples", "2", "--strategies", "iid", "tree", "--max-loop-num", "1",
        "--eval-problems", "4", "--eval-samples", "1", "--epochs", "1", "--minibatch-size", "64", "--micro-batch-size", "32",
        "--max-staleness", "1", "--staleness-schedule", "exact", *extra,
    ]


def overlapped_run(cwd: Path, args: list[str], env: dict | None = None, watch=None, timeout: float = 3600) -> str:
    """`maxit run` in a session of its own, `watch()` called while it runs; returns its output
    once it succeeded and left no process behind (every process it started carries a mark in its
    environment: ranks and Ray workers included, whatever session they moved to)."""
    mark = uuid.uuid4().hex
    env = {**os.environ, "DAGSTER_HOME": str(cwd / "dagster_home"), **(env or {}), "MAXIT_TEST_MARK": mark}
    proc = subprocess.Popen(args, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    out: list[str] = []
    import threading

    reader = threading.Thread(target=lambda: out.append(proc.stdout.read()), daemon=True)
    reader.start()
    deadline = time.time() + timeout
    try:
        while proc.poll() is None:
            assert time.time() < deadline, f"maxit run did not end within {timeout:.0f} s"
            if watch is not None:
                watch(mark)
            time.sleep(0.2)
        reader.join(timeout=60)
        text = "".join(out)
        assert proc.returncode == 0, text[-4000:]
        left = [] if _wait_until(lambda: not _marked(mark), 10) else _marked(mark)
        assert not left, f"left running after the run ended: {left}"
        return text
    finally:
        _kill_marked(mark)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _text(store: str, rel: str) -> str:
    import fsspec

    with fsspec.open(f"{store}/{rel}", "r") as fh:
        return fh.read()


def check_overlapped(store: str) -> dict:
    """The checks every overlapped run here must pass: every round complete, each row written
    once, the staleness plan of the exact schedule in the rows and in each round's sampling
    record; returns the compared tables, each sorted by its key."""
    tables = {}
    for r in (-1, *range(ROUNDS)):
        assert st.exists(st.table_path(store, r, "evaluation")), f"round {r} is not complete"
        for name, key in KEYS.items():
            if r == -1 and name != "evaluation":
                continue
            df = st.read_table(st.table_path(store, r, name))
            assert df.height > 0, (r, name)
            assert df.select(key).n_unique() == df.height, f"round {r}'s {name} holds a row twice"
            if "round" in df.columns:
                assert df["round"].unique().to_list() == [r], (r, name)
            tables[(r, name)] = df.sort(key)
    for r, (source, staleness) in PLAN.items():
        steps = tables[(r, "steps")]
        assert steps["policy_round"].unique().to_list() == [source], (r, steps["policy_round"].unique().to_list())
        assert steps["staleness"].unique().to_list() == [staleness], (r, steps["staleness"].unique().to_list())
        record = json.loads(_text(store, f"round={r}/sampling.json"))
        assert record == {"round": r, "sampled_with_round": source, "staleness_schedule": "exact", "max_staleness": 1}, record
    assert not st.exists(f"{store}/round={ROUNDS}"), "no round beyond the last"
    return tables


def assert_same_rows(got: dict, want: dict, only=None) -> None:
    keys = [k for k in want if only is None or k in only]
    assert keys and all(k in got for k in keys), sorted(set(keys) - set(got))
    for k in keys:
        assert got[k].columns == want[k].columns, k
        if not got[k].equals(want[k]):
            diff = [c for c in want[k].columns if got[k].height != want[k].height or not got[k][c].equals(want[k][c])]
            raise AssertionError(f"{k} differs from the uninterrupted run's in column(s) {diff}")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, default_model_dir) -> dict:
    """One overlapped run on a local store, never stopped: its tables."""
    cwd = tmp_path_factory.mktemp("uninterrupted")
    overlapped_run(cwd, run_args(str(cwd / "store"), default_model_dir))
    return check_overlapped(str(cwd / "store"))


# -- each way of scaling out, overlapped --------------------------------------------------------


@pytest.mark.slow  # two overlapped runs of three rounds (the module's and this one): minutes on two cores
@pytest.mark.timeout(7200)
def test_overlap_with_two_shards_on_dagster(tmp_path, default_model_dir, uninterrupted):
    """`--shards 2`: each round's sampling in two Dagster step processes (the sampler lane's
    Dagster run), training in the trainer lane's: the rows of one shard, every round."""
    store = tmp_path / "store"
    overlapped_run(tmp_path, run_args(str(store), default_model_dir, "--shards", "2"))
    got = check_overlapped(str(store))
    for r in range(ROUNDS):
        by_shard = pl.read_parquet(st.table_path(store, r, "rollout_shards")).sort("shard")
        assert by_shard["shard"].to_list() == [0, 1] and by_shard["pid"].n_unique() == 2, by_shard
        assert by_shard["rows"].sum() == got[(r, "steps")].height
    assert_same_rows(got, uninterrupted)


@pytest.mark.slow  # two overlapped runs of three rounds and a Ray instance: minutes on two cores
@pytest.mark.timeout(7200)
def test_overlap_with_shards_on_ray(tmp_path, default_model_dir, uninterrupted):
    """`--shards 2 --executor ray --ray-address` a local Ray instance this test starts on
    127.0.0.1 and stops: each round's two shards are Ray tasks in the instance's workers while
    the trainer lane trains; the rows of one shard on Dagster, every round."""
    import importlib.util

    if importlib.util.find_spec("ray") is None:
        pytest.skip("ray is not installed (pip install 'ray==2.60.0', the ray extra): --executor ray cannot run")
    from pipeline.run.ray_shards import ray_session

    store = tmp_path / "store"
    with ray_session() as session:
        import ray

        address = ray.get_runtime_context().gcs_address
        assert address.startswith("127.0.0.1:") and session.local_dir is not None
        # the instance's workers (the raylet's children; their command lines are Ray's process titles), gathered while
        # the run lasts: Ray may end an idle worker before the run ends
        workers: set[int] = set()
        overlapped_run(tmp_path, run_args(str(store), default_model_dir, "--shards", "2", "--executor", "ray", "--ray-address", address),
                       watch=lambda mark: workers.update(_raylet_children()))
    assert not ray.is_initialized() and not os.path.exists(session.local_dir)
    got = check_overlapped(str(store))
    for r in range(ROUNDS):
        by_shard = pl.read_parquet(st.table_path(store, r, "rollout_shards")).sort("shard")
        assert by_shard["shard"].to_list() == [0, 1], by_shard
        assert set(by_shard["pid"].to_list()) <= workers, (r, by_shard["pid"].to_list(), "the shards sample in the test's Ray instance's workers")
    assert_same_rows(got, uninterrupted)


def _raylet_children() -> set[int]:
    """The processes the raylet of the Ray instance this process started has started (its workers)."""
    import psutil

    out = set()
    for child in psutil.Process().children():
        try:
            if any(arg.endswith("/raylet") for arg in child.cmdline()):
                out.update(p.pid for p in child.children(recursive=True))
        except psutil.Error:
            pass
    return out


@pytest.mark.slow  # two overlapped runs of three rounds, each training in two ranks: minutes on two cores
@pytest.mark.timeout(7200)
def test_overlap_with_two_training_processes(tmp_path, default_model_dir, uninterrupted):
    """`--train-processes 2`: the trainer lane trains each round in two torchrun ranks while the
    next round samples. The rounds the starting model sampled (0 and 1) have the uninterrupted
    run's rows; round 2 samples with round 0's checkpoint as two ranks trained it."""
    store = tmp_path / "store"
    ranks: dict[int, set[int]] = {}

    def watch(mark: str) -> None:
        import re

        now = [(pid, cmd) for pid, cmd in _marked(mark) if "pipeline.learn.trainer" in cmd and "torch.distributed.run" not in cmd]
        if len(now) < 2:  # two ranks at once, or nothing to count
            return
        for pid, cmd in now:
            found = re.search(r" --round (\d+)(?: |$)", cmd)
            if found:
                ranks.setdefault(int(found.group(1)), set()).add(pid)

    overlapped_run(tmp_path, run_args(str(store), default_model_dir, "--train-processes", "2"), watch=watch)
    got = check_overlapped(str(store))
    assert sorted(ranks) == list(range(ROUNDS)) and all(len(p) >= 2 for p in ranks.values()), f"ranks seen training, by round: {ranks}"
    assert_same_rows(got, uninterrupted, only={(r, t) for r in (0, 1) for t in ("problems", "steps")})


@pytest.mark.slow  # two overlapped runs of three rounds, one on an S3 API: minutes on two cores
@pytest.mark.timeout(7200)
def test_overlap_on_an_s3_store(tmp_path, default_model_dir, uninterrupted):
    """`--store s3://bucket/run` on the loopback S3 server (tests/s3server.py): the sampler lane
    and the trainer lane (a process of its own, on the same working copy) both publish; the
    bucket ends with every round complete, its sampling records and the local run's rows."""
    from fsspec.registry import _registry
    from s3server import S3Server

    url = "s3://bucket/run"
    known = {p: _registry[p] for p in ("s3", "s3a") if p in _registry}
    with S3Server() as s3:
        s3.create_bucket("bucket")
        env = {**s3.env(), "MAXIT_CACHE_DIR": str(tmp_path / "cache")}
        overlapped_run(tmp_path, run_args(url, default_model_dir), env=env)
        with s3.environ():
            import s3fs

            s3fs.S3FileSystem.clear_instance_cache()
            try:
                got = check_overlapped(url)
                keys = s3.objects("bucket", "run/")
                assert {f"run/checkpoints/registry/round={r}/shared.json" for r in (-1, 0, 1, 2)} <= set(keys)
                assert {f"run/round={r}/sampling.json" for r in range(ROUNDS)} <= set(keys)
            finally:  # later tests expect fsspec to know no s3fs instance naming this server
                s3fs.S3FileSystem.clear_instance_cache()
                for protocol in ("s3", "s3a"):
                    _registry.pop(protocol, None)
                _registry.update(known)
    assert_same_rows(got, uninterrupted)


# -- a resumed overlapped run -------------------------------------------------------------------


def _lane_training(store: Path, r: int) -> bool:
    """Round r's trainer lane runs: a lane holds its lifeline record in the store (a process for
    round r, or the run's one lane process, `--serve`), round r's training view is written, round
    r-1's checkpoint is registered and round r's is not yet."""
    registered = lambda k: (store / "checkpoints" / "registry" / f"round={k}").exists()  # noqa: E731
    if not (store / f"round={r}" / "training_view.parquet").exists() or registered(r) or (r > 0 and not registered(r - 1)):
        return False
    for path in (store / ".maxit-trainers").glob("*.json"):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        command = record.get("command", "")
        if record.get("role") == "trainer lane" and (f"--round {r} --stages policy" in command or "--serve" in command):
            return True
    return False


def _kill_when(cwd: Path, args: list[str], ready, what: str) -> None:
    env = {**os.environ, "DAGSTER_HOME": str(cwd / "dagster_home")}
    proc = subprocess.Popen(args, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 3600  # a guard against a hang, not a measure: a loaded machine takes minutes
    try:
        while not ready():
            assert proc.poll() is None, f"maxit run ended before {what}"
            assert time.time() < deadline, f"{what} did not happen within an hour"
            time.sleep(0.1)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the run's process group, as the project's kill tests do
        proc.wait()


@pytest.mark.slow  # an uninterrupted run, two killed ones and their resume: minutes on two cores
@pytest.mark.timeout(7200)
def test_a_resumed_overlapped_run_equals_an_uninterrupted_one_row_for_row(tmp_path, default_model_dir, uninterrupted):
    """Killed (SIGKILL of its process group) while round 0 trains (round 1 sampling beside it),
    resumed, killed again while round 1 trains (round 2 sampling with round 0's checkpoint), and
    resumed to the end: its problems, steps, advantages, training views and evaluations equal the
    uninterrupted run's, row for row and column for column (`KEYS`: no column of these tables
    records wall time).

    The exact schedule, because only it makes a round's rows a function of K alone: under the
    default bound schedule a round samples with the freshest checkpoint trained when its sampling
    starts, which depends on how fast each lane ran (by design), so two runs, interrupted or not,
    may sample a round with different checkpoints."""
    from pipeline.run.rounds import round_complete
    from pipeline.store import Tables

    store = tmp_path / "store"
    args = run_args(str(store), default_model_dir)
    _kill_when(tmp_path, args, lambda: _lane_training(store, 0), "round 0's training")
    assert not (store / "checkpoints" / "registry" / "round=0").exists() and not round_complete(Tables(store), 0)
    _kill_when(tmp_path, args, lambda: _lane_training(store, 1), "round 1's training")
    # round 1 trains once round 0 is trained (round 0's evaluation may still be running)
    assert (store / "checkpoints" / "registry" / "round=0").exists() and not (store / "checkpoints" / "registry" / "round=1").exists()
    assert not round_complete(Tables(store), 1)
    overlapped_run(tmp_path, args)
    assert_same_rows(check_overlapped(str(store)), uninterrupted)
    assert not list(store.glob("round=*/.*.tmp-*"))
