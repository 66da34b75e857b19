"""An interrupted run (kill -9 in the middle of a round) resumes from the last complete round,
with no lost or duplicated rows; re-running a round replaces its tables."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import polars as pl

from pipeline.store import table_path

ROOT = Path(__file__).resolve().parents[1]


def run_cmd(store: Path, model_dir: Path, rounds: int, *extra: str) -> list[str]:
    maxit = Path(sys.executable).with_name("maxit")
    return [
        str(maxit), "run", "--rounds", str(rounds), "--store", str(store), "--engine", "hf", "--model-dir", str(model_dir),
        "--problems", "6", "--samples", "2", "--eval-problems", "8", "--eval-samples", "1", "--epochs", "1", *extra,
    ]


def test_kill_9_mid_round_then_resume(tmp_path, default_model_dir):
    store = tmp_path / "store"
    env = {**os.environ, "DAGSTER_HOME": str(tmp_path / "dagster_home")}
    proc = subprocess.Popen(run_cmd(store, default_model_dir, 2), cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 300
    try:
        # wait until round 0 is complete and round 1 has started writing
        while not table_path(store, 1, "steps").exists():
            assert proc.poll() is None, "maxit run ended before round 1 started"
            assert time.time() < deadline, "round 1 did not start within 5 minutes"
            time.sleep(0.2)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert table_path(store, 0, "evaluation").exists()
    assert not table_path(store, 1, "evaluation").exists()
    round0 = {t: table_path(store, 0, t).read_bytes() for t in ("steps", "advantages", "evaluation")}

    done = subprocess.run(run_cmd(store, default_model_dir, 2), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    # the complete round was kept as it was, the interrupted one re-run from scratch
    assert {t: table_path(store, 0, t).read_bytes() for t in round0} == round0
    steps = pl.read_parquet(str(store / "round=*" / "steps.parquet"), hive_partitioning=True)
    assert steps["step_id"].n_unique() == steps.height
    assert sorted(steps["round"].unique().to_list()) == [0, 1]
    ev = pl.read_parquet(str(store / "round=*" / "evaluation.parquet"), hive_partitioning=True)
    assert sorted(ev["round"].unique().to_list()) == [-1, 0, 1]
    assert not list(store.glob("round=*/.*.tmp-*"))  # the killed run's temp files were cleared on resume
    # re-running a complete round replaces its tables (idempotent), it does not append
    again = subprocess.run(run_cmd(store, default_model_dir, 1, "--restart"), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    steps0 = pl.read_parquet(table_path(store, 0, "steps"))
    assert steps0["step_id"].n_unique() == steps0.height
