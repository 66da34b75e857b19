"""Rounds that overlap (`--max-staleness K`): the schedule of the two lanes, the staleness plan
of the rows, and the version threshold."""

from __future__ import annotations

import threading
import time

import polars as pl
import pytest

from assets.overlap import EVALUATE_STAGES, SAMPLE_STAGES, TRAIN_STAGES, run_overlapped
from pipeline.config import RunConfig
from pipeline.errors import ConfigError
from pipeline.learn.staleness import apply_version_threshold, row_staleness


class Lanes:
    """A fake `run` that records what ran when, checking the overlap's rules as it goes."""

    def __init__(self, k: int, train_seconds: float = 0.05, sample_seconds: float = 0.01):
        self.k, self.train_seconds, self.sample_seconds = k, train_seconds, sample_seconds
        self.lock = threading.Lock()
        self.events: list[tuple[str, int, str]] = []
        self.sampled, self.trained, self.evaluated = set(), set(), set()
        self.training_now = 0
        self.overlapped = False

    def __call__(self, r: int, stages: tuple[str, ...]) -> None:
        with self.lock:
            self.events.append(("start", r, stages[0]))
            if stages == SAMPLE_STAGES:
                # round r samples with round r-1-K's checkpoint: it must be registered
                assert max(-1, r - 1 - self.k) == -1 or (r - 1 - self.k) in self.trained
                assert r - 1 in self.sampled or r == self.first
            elif stages == TRAIN_STAGES:
                assert r in self.sampled and (r - 1 in self.trained or r == self.first)
                assert self.training_now == 0, "two trainers at once"
                self.training_now += 1
            else:
                assert stages == EVALUATE_STAGES and r in self.trained and threading.current_thread() is threading.main_thread()
            if self.training_now and stages != TRAIN_STAGES:
                self.overlapped = True
        time.sleep(self.train_seconds if stages == TRAIN_STAGES else self.sample_seconds)
        with self.lock:
            {SAMPLE_STAGES: self.sampled, TRAIN_STAGES: self.trained, EVALUATE_STAGES: self.evaluated}[stages].add(r)
            if stages == TRAIN_STAGES:
                self.training_now -= 1
            self.events.append(("end", r, stages[0]))


@pytest.mark.parametrize("k", [1, 2])
def test_sampling_runs_beside_training_and_never_ahead_of_its_checkpoint(k):
    lanes, finished = Lanes(k), []
    lanes.first = 0
    run_overlapped(0, 5, k, lanes, finished.append)
    assert finished == [0, 1, 2, 3, 4]  # each round evaluated once, in order
    assert lanes.sampled == lanes.trained == lanes.evaluated == set(range(5))
    assert lanes.overlapped  # some sampling or evaluation ran while a trainer did
    starts = [(r, s) for kind, r, s in lanes.events if kind == "start"]
    assert len(starts) == 15 and len(set(starts)) == 15  # every stage group once


def test_a_resumed_run_starts_at_its_first_incomplete_round():
    lanes, finished = Lanes(1), []
    lanes.first = 3
    lanes.trained = {0, 1, 2}
    run_overlapped(3, 5, 1, lanes, finished.append)
    assert finished == [3, 4]
    assert not any(r < 3 for _, r, _ in lanes.events)


def test_a_failing_trainer_stops_the_run_after_its_round():
    calls = []

    def run(r, stages):
        calls.append((r, stages[0]))
        if stages == TRAIN_STAGES and r == 1:
            raise RuntimeError("trainer died")

    with pytest.raises(RuntimeError, match="trainer died"):
        run_overlapped(0, 4, 1, run, lambda r: None)
    assert ("evaluation", 1) not in [(s, r) for r, s in calls]
    assert (1, "policy") in calls and (2, "policy") not in calls


def test_staleness_settings_are_checked():
    assert RunConfig(max_staleness=2).max_staleness == 2
    for bad in ({"max_staleness": -1}, {"max_staleness": 1.5}, {"max_row_staleness": -2}, {"stale_row_weight": 2.0}):
        with pytest.raises(ConfigError, match=next(iter(bad))):
            RunConfig(**bad)
    with pytest.raises(ConfigError, match="start_from 'best'"):
        RunConfig(max_staleness=1, start_from="best")
    from pipeline.config.scale import ScaleConfig, parse_cores

    assert parse_cores("0-2,5", "x") == [0, 1, 2, 5]
    with pytest.raises(ConfigError, match="trainer_cores"):
        ScaleConfig(trainer_cores="1-a")
    with pytest.raises(ConfigError, match="needs RunConfig.max_staleness > 0"):
        RunConfig(scale=ScaleConfig(trainer_cores="1"))
    assert RunConfig(max_staleness=1, scale=ScaleConfig(trainer_cores="1")).scale.trainer_cores == "1"


def _rows() -> pl.DataFrame:
    return pl.DataFrame({
        "step_id": ["a", "b", "c", "d"], "round": [4, 4, 2, 1], "policy_round": [2, 3, 0, None],
        "sample_weight": [1.0, 0.5, 2.0, 1.0],
    }, schema_overrides={"round": pl.Int32, "policy_round": pl.Int32})


def test_row_staleness_counts_rounds_since_the_sampling_checkpoint():
    # trained from round 3's checkpoint: a (sampled by round 2) is 1 stale, b 0, c 3; d has no
    # policy_round (a store from before the column: synchronous, sampled by round 0) -> 3
    assert _rows().select(row_staleness(3))["literal"].to_list() == [1, 0, 3, 3]


def test_the_version_threshold_drops_or_down_weights_stale_rows():
    rows = _rows()
    assert apply_version_threshold(rows, 3, None, 0.0).equals(rows)
    assert apply_version_threshold(rows, 3, 1, 0.0)["step_id"].to_list() == ["a", "b"]
    weighted = apply_version_threshold(rows, 3, 1, 0.25)
    assert weighted["sample_weight"].to_list() == [1.0, 0.5, 0.5, 0.25]
    assert apply_version_threshold(rows, 3, 3, 0.0).height == 4


def _run_cmd(store, model_dir, rounds: int) -> list[str]:
    import sys
    from pathlib import Path

    maxit = Path(sys.executable).with_name("maxit")
    return [
        str(maxit), "run", "--rounds", str(rounds), "--store", str(store), "--engine", "hf", "--model-dir", str(model_dir),
        "--problems", "4", "--samples", "2", "--eval-problems", "4", "--eval-samples", "1", "--epochs", "1", "--max-staleness", "1",
    ]


def _kill_when(cmd, env, cwd, ready, what: str) -> None:
    import os
    import signal
    import subprocess

    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 600
    try:
        while not ready():
            assert proc.poll() is None, f"maxit run ended before {what}"
            assert time.time() < deadline, f"{what} did not happen within 10 minutes"
            time.sleep(0.1)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.mark.slow  # three runs of two rounds, two cut short: minutes on two cores
@pytest.mark.timeout(1800)
def test_kill_9_twice_in_overlapped_rounds_then_resume(tmp_path, default_model_dir):
    import os
    import subprocess

    from pipeline.store import table_path

    store = tmp_path / "store"
    env = {**os.environ, "DAGSTER_HOME": str(tmp_path / "dagster_home")}
    cmd = _run_cmd(store, default_model_dir, 2)
    # 1. round 1 has sampled (ahead, with the starting model) before round 0 is evaluated
    _kill_when(cmd, env, tmp_path, lambda: table_path(store, 1, "steps").exists(), "round 1's rollouts")
    assert not table_path(store, 1, "evaluation").exists()  # round 1 was cut short
    # 2. the rerun, killed once round 1's policy is trained
    _kill_when(cmd, env, tmp_path, lambda: table_path(store, 1, "ratio_diagnostics").exists(), "round 1's training")
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    for r in range(2):  # every round complete, each table written once: no duplicated rows
        assert table_path(store, r, "evaluation").exists()
        for table in ("problems", "steps", "advantages", "training_view"):
            df = pl.read_parquet(table_path(store, r, table))
            key = "uid" if table == "problems" else "step_id"
            assert df[key].n_unique() == df.height, (r, table)
            assert set(df["round"].unique().to_list()) == {r}
    steps = pl.read_parquet(str(store / "round=*" / "steps.parquet"), hive_partitioning=True)
    plan = steps.group_by("round").agg(pl.col("policy_round").unique(), pl.col("staleness").unique()).sort("round")
    assert plan.rows() == [(0, [-1], [0]), (1, [-1], [1])]
    ev = pl.read_parquet(str(store / "round=*" / "evaluation.parquet"), hive_partitioning=True)
    assert sorted(ev["round"].unique().to_list()) == [-1, 0, 1]
    assert ev.group_by("round", "agent_id", "metric").len()["len"].max() == 1
    assert not list(store.glob("round=*/.*.tmp-*"))
    registered = sorted(p.parent.name for p in (store / "checkpoints" / "registry").glob("round=*/*.json"))
    assert registered == ["round=-1", "round=0", "round=1"]
