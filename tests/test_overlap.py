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


# -- every process of a run dies with it (`pipeline.store.lifeline`) ------------------------------


from procs import kill_marked as _kill_marked, marked as _marked, wait_until as _wait_until  # noqa: E402


def test_a_grandchild_holding_the_lifeline_dies_with_the_run_process_alone(tmp_path):
    """A stand-in run (a Python process that names itself the run) starts a child that starts a
    grandchild; each holds the lifeline. kill -9 of the run alone (not its group) ends both
    within seconds, and so does kill -9 of the middle one alone for the grandchild."""
    import os
    import signal
    import subprocess
    import sys
    import uuid

    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    grandchild = "from pipeline.store.lifeline import hold_lifeline; hold_lifeline('rank'); import time; time.sleep(120)"
    child = ("import subprocess, sys, time; from pipeline.store.lifeline import hold_lifeline; hold_lifeline('lane'); "
             f"subprocess.Popen([sys.executable, '-c', {grandchild!r}]); time.sleep(120)")
    for victim in ("run", "lane"):
        store = tmp_path / victim
        run = ("import os, subprocess, sys, time; from pipeline.store.lifeline import run_lifeline\n"
               f"with run_lifeline({str(store)!r}):\n    subprocess.Popen([sys.executable, '-c', {child!r}]); time.sleep(120)")
        mark = f"MAXIT_TEST_MARK={uuid.uuid4().hex}"
        env = {**os.environ, "PYTHONPATH": str(root), mark.split("=")[0]: mark.split("=")[1]}
        proc = subprocess.Popen([sys.executable, "-c", run], env=env, cwd=root, start_new_session=True)
        try:
            assert _wait_until(lambda: len(_marked(mark)) == 3 and len(list((store / ".maxit-trainers").glob("*.json"))) == 2, 60), _marked(mark)
            if victim == "run":
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
                assert _wait_until(lambda: not _marked(mark), 5), f"left after kill -9 of the run alone: {_marked(mark)}"
            else:
                lane = next(pid for pid, cmd in _marked(mark) if "hold_lifeline('lane')" in cmd)
                os.kill(lane, signal.SIGKILL)
                assert _wait_until(lambda: [pid for pid, _ in _marked(mark)] == [proc.pid], 5), _marked(mark)
        finally:
            _kill_marked(mark)
            os.killpg(proc.pid, signal.SIGKILL) if proc.poll() is None else None
            proc.wait()


def test_a_run_stops_what_an_earlier_run_of_its_store_left_running(tmp_path):
    """`stop_orphans`: a recorded process whose run is gone is killed and named; one whose run
    lives is left alone; the records of ended processes are removed."""
    import json
    import os
    import socket
    import subprocess

    from pipeline.store.lifeline import TRAINERS_DIR, process_start, stop_orphans

    folder = tmp_path / TRAINERS_DIR
    folder.mkdir()
    gone = subprocess.Popen(["true"])
    gone.wait()
    orphan, kept = subprocess.Popen(["sleep", "120"]), subprocess.Popen(["sleep", "120"])
    try:
        def record(pid, run_pid, run_start):
            (folder / f"{pid}.json").write_text(json.dumps({
                "pid": pid, "start": process_start(pid), "host": socket.gethostname(), "role": "trainer rank 1",
                "run_pid": run_pid, "run_start": run_start, "run_id": "r1", "command": "python -m pipeline.learn.trainer", "since": "then"}))

        record(orphan.pid, gone.pid, None)  # its run is gone
        record(kept.pid, os.getpid(), process_start(os.getpid()))  # its run (this process) lives
        record(gone.pid, gone.pid, None)  # ended
        said = []
        assert stop_orphans(tmp_path, said.append) == [orphan.pid]
        assert orphan.wait(timeout=5) == -9
        assert kept.poll() is None
        assert len(said) == 1 and f"pid {orphan.pid}" in said[0] and "trainer rank 1" in said[0] and "earlier run" in said[0]
        assert sorted(p.name for p in folder.glob("*.json")) == [f"{kept.pid}.json"]
    finally:
        for p in (orphan, kept):
            p.kill()
            p.wait()


@pytest.mark.slow  # a round trained by two processes, then the resumed run: minutes on two cores
@pytest.mark.timeout(1800)
def test_kill_9_of_the_run_alone_while_two_processes_train_leaves_no_process(tmp_path, default_model_dir):
    import os
    import signal
    import subprocess
    import uuid

    from pipeline.store import table_path

    store = tmp_path / "store"
    mark = f"MAXIT_TEST_MARK={uuid.uuid4().hex}"
    env = {**os.environ, "DAGSTER_HOME": str(tmp_path / "dagster_home"), "MAXIT_TEST_MARK": mark.split("=")[1]}
    cmd = [*_run_cmd(store, default_model_dir, 2), "--train-processes", "2"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        # round 0 trains in two torchrun ranks (round 1 samples meanwhile)
        ranks = lambda: [pid for pid, c in _marked(mark) if "pipeline.learn.trainer" in c and "torch.distributed.run" not in c]  # noqa: E731
        assert _wait_until(lambda: len(ranks()) >= 2 or proc.poll() is not None, 900) and proc.poll() is None, "no round trained in two processes"
        os.kill(proc.pid, signal.SIGKILL)  # the run's process alone, as an out-of-memory kill does
        proc.wait()
        assert _wait_until(lambda: not _marked(mark), 10), f"left running after kill -9 of maxit run: {_marked(mark)}"
    finally:
        _kill_marked(mark)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert not table_path(store, 0, "evaluation").exists()
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    for r in (-1, 0, 1):
        assert table_path(store, r, "evaluation").exists()
    assert not _marked(mark)


def test_the_row_staleness_filter_counts_from_the_checkpoint_the_round_trains_from(tmp_path, monkeypatch):
    """`--start-from best --max-row-staleness 0`: round 2 samples and trains from the best round
    (0), so its own rows (policy_round 0, staleness 0) are kept; a threshold counted from round
    r-1 (1) dropped them."""
    import pipeline.run.rounds as rounds
    from pipeline.run.context import RoundContext
    from pipeline.run.settings import Settings
    from pipeline.store import Tables

    tables = Tables(tmp_path)
    ctx = RoundContext(tables, Settings(workflow="tic_tac_toe", start_from="best", max_row_staleness=0).run_config())
    for r in (-1, 0, 1):
        folder = tmp_path / "ckpt" / str(r)
        folder.mkdir(parents=True)
        ctx.registry.register(r, "shared", folder)
        value = {-1: 0.2, 0: 0.9, 1: 0.5}[r]  # round 0 is the best
        rows = [{"round": r, "policy_id": "shared", "agent_id": "team", "split": "heldout", "metric": m, "value": value, "n": 800}
                for m in ("success", "win_vs_scripted", "win_vs_base")]
        tables.write(r, "evaluation", pl.DataFrame(rows).cast({"round": pl.Int32}))
    assert ctx.checkpoints.trained_rounds(2) == {"shared": 0}
    assert ctx.checkpoints.staleness_plan(2, ctx.checkpoints.start_checkpoints(2)) == ({"shared": 0}, {"shared": 0})

    seen = {}
    monkeypatch.setattr(rounds, "load_tokenizer", lambda path: None)
    monkeypatch.setattr(rounds, "_stage", lambda ctx, r, stage, compute, table=None: compute())

    def view(rows, strategies, tokenizer, config):  # the rows the threshold kept, as the view is built of them
        seen["rows"] = rows
        return "view", None

    monkeypatch.setattr(rounds, "build_training_view", view)
    own = pl.DataFrame({"step_id": ["a", "b"], "round": [2, 2], "policy_id": ["shared"] * 2, "policy_round": [0, 0], "sample_weight": [1.0, 1.0]},
                       schema_overrides={"round": pl.Int32, "policy_round": pl.Int32})
    assert rounds.stage_training_view(ctx, 2, own) == ("view", None)
    assert seen["rows"]["step_id"].to_list() == ["a", "b"]


class Plan:
    """A fake `SamplingPlan`: the records, and what was recorded in this run."""

    def __init__(self, records=None):
        self.records, self.made = dict(records or {}), {}

    def recorded(self, r):
        return self.records.get(r)

    def record(self, r, source):
        self.records[r] = self.made[r] = source


@pytest.mark.parametrize("schedule, round2", [("exact", 0), ("bound", 1)])
def test_the_bound_samples_with_the_freshest_checkpoint_and_exact_with_round_r_minus_1_minus_k(schedule, round2):
    """K=1, three rounds, a trainer faster than the sampler: by the time round 2 samples, round 1
    is trained; "bound" samples it with round 1's checkpoint, "exact" with round 0's. Each choice
    is recorded before the round samples, and never staler than K."""
    lanes, plan = Lanes(1, train_seconds=0.01, sample_seconds=0.6), Plan()
    lanes.first = 0
    seen = {}
    real = lanes.__call__

    def run(r, stages):
        if stages == SAMPLE_STAGES:
            seen[r] = (plan.records.get(r), sorted(lanes.trained))
        real(r, stages)

    run_overlapped(0, 3, 1, run, lambda r: None, schedule=schedule, plan=plan)
    assert plan.made == {0: -1, 1: -1, 2: round2}
    assert seen[2] == (round2, [0, 1])  # recorded before sampling; round 1 was trained by then
    assert all(r - 1 - 1 <= source <= r - 1 for r, source in plan.made.items())


def test_a_resumed_run_samples_a_recorded_round_with_its_recorded_checkpoint():
    """Round 2 was recorded as sampled with round 0's checkpoint before the kill: the resumed
    run (from round 1) samples it with round 0's again under "bound", where round 1's is the
    freshest, and records nothing new for it."""
    lanes, plan = Lanes(1, train_seconds=0.01, sample_seconds=0.6), Plan({1: -1, 2: 0})
    lanes.first, lanes.trained = 1, {-1, 0}
    run_overlapped(1, 4, 1, lanes, lambda r: None, schedule="bound", plan=plan)
    assert plan.records[2] == 0 and 2 not in plan.made and 1 not in plan.made
    assert plan.made == {3: 2}  # a round without a record: the freshest trained when it started


def test_the_sampling_record_picks_the_checkpoint_and_is_checked(tmp_path):
    """`RoundCheckpoints.sample_checkpoints` samples with the recorded round's checkpoints (round
    r-1-K's where none is recorded); a broken record is an error naming its file."""
    from pipeline.errors import DataError
    from pipeline.run.checkpoints import sampling_plan_path, write_sampling_plan
    from pipeline.run.context import RoundContext
    from pipeline.run.settings import Settings
    from pipeline.store import Tables

    tables = Tables(tmp_path)
    ctx = RoundContext(tables, Settings(workflow="tic_tac_toe", max_staleness=2).run_config())
    for r in (-1, 0, 1, 2):
        folder = tmp_path / "ckpt" / str(r)
        folder.mkdir(parents=True)
        ctx.registry.register(r, "shared", folder)
    assert ctx.checkpoints.sample_checkpoints(3)["shared"].name == "0"  # 3-1-2
    write_sampling_plan(tables.root, 3, 2, "bound", 2)
    assert ctx.checkpoints.sample_checkpoints(3)["shared"].name == "2"
    assert ctx.checkpoints.staleness_plan(3, ctx.checkpoints.sample_checkpoints(3)) == ({"shared": 2}, {"shared": 0})
    sampling_plan_path(tables.root, 3).write_text('{"sampled_with_round": 3}')
    with pytest.raises(DataError, match=r"round=3/sampling.json: sampled_with_round must be a round in \[-1, 2\]"):
        ctx.checkpoints.sample_checkpoints(3)


@pytest.mark.slow  # two runs of three overlapped rounds: minutes on two cores
@pytest.mark.timeout(2400)
@pytest.mark.parametrize("schedule", ["exact", "bound"])
def test_three_overlapped_rounds_sample_with_the_recorded_checkpoint(schedule, tmp_path, default_model_dir):
    """K=1, three rounds: round 2 samples with a trained checkpoint. Under "exact" its rows carry
    policy_round 0 (round r-1-K's); under "bound" the checkpoint recorded when its sampling
    started (0 or 1, whichever was the freshest then; tests above pin which with fake lanes), and
    its rows' staleness is counted from round 1's, the one round 2 trains from."""
    import json
    import os
    import subprocess

    from pipeline.run.checkpoints import sampling_plan_path

    store = tmp_path / "store"
    env = {**os.environ, "DAGSTER_HOME": str(tmp_path / "dagster_home")}
    done = subprocess.run([*_run_cmd(store, default_model_dir, 3), "--staleness-schedule", schedule], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=2000)
    assert done.returncode == 0, done.stderr[-3000:]
    recorded = {r: json.loads(sampling_plan_path(store, r).read_text())["sampled_with_round"] for r in range(3)}
    steps = pl.read_parquet(str(store / "round=*" / "steps.parquet"), hive_partitioning=True)
    plan = {r: (p, s) for r, p, s in steps.group_by("round").agg(pl.col("policy_round").unique(), pl.col("staleness").unique()).rows()}
    assert recorded[0] == recorded[1] == -1 and plan[0] == ([-1], [0]) and plan[1] == ([-1], [1])
    if schedule == "exact":
        assert recorded[2] == 0
    assert recorded[2] in (0, 1) and plan[2] == ([recorded[2]], [1 - recorded[2]])


def test_the_sampler_and_the_trainer_are_given_their_own_devices(tmp_path, monkeypatch):
    """`--engine-devices 0,1 --trainer-devices 2,3`: the run's process (its engines, the step
    processes it starts) sees 0,1 while the run lasts; the trainer lane's process, and the ranks it
    starts, 2,3; a shared device, a trainer without processes of its own and a bad list are
    refused by flag. Checked on a CPU by the environment each process is given."""
    import json
    import os
    import subprocess

    import assets.overlapped_run as overlapped_run
    from assets.config import RunSettings
    from assets.placement import engine_devices
    from pipeline.config.scale import DEVICES_ENV, devices_env
    from pipeline.run.settings import Settings
    from pipeline.store import Tables

    with pytest.raises(ConfigError, match="--engine-devices '0,1' and --trainer-devices '1,2' share device"):
        Settings(max_staleness=1, engine_devices="0,1", trainer_devices="1,2").run_config()
    with pytest.raises(ConfigError, match="--trainer-devices '2' gives the trainer's own processes"):
        Settings(trainer_devices="2").run_config()
    with pytest.raises(ConfigError, match="--trainer-devices must list distinct device indices"):
        Settings(max_staleness=1, trainer_devices="2,2").run_config()
    with pytest.raises(ConfigError, match="--train-processes 3 needs a device each"):
        Settings(train_processes=3, trainer_devices="2,3").run_config()
    assert Settings(train_processes=2, trainer_devices="2,3").run_config().scale.trainer_devices == "2,3"
    assert devices_env(None) is None and devices_env(" 3, 1", {"A": "b"}) == {"A": "b", DEVICES_ENV: "3,1"}

    monkeypatch.setenv(DEVICES_ENV, "7")
    with engine_devices("0,1"):
        assert os.environ[DEVICES_ENV] == "0,1"
    assert os.environ[DEVICES_ENV] == "7"

    given = {}

    def fake_run(argv, cwd=None, env=None, preexec_fn=None):
        given["env"] = env
        result = argv[argv.index("--result") + 1]
        with open(result, "w") as fh:
            json.dump({"error": None}, fh)
        return subprocess.CompletedProcess(argv, 0)

    monkeypatch.setattr(subprocess, "run", fake_run)
    settings = RunSettings.from_settings(Settings(max_staleness=1, engine_devices="0,1", trainer_devices="2,3"))
    with engine_devices(settings.engine_devices):
        overlapped_run._materialize_in_process_of_its_own(Tables(tmp_path / "store"), 1, settings, "hf", ("policy",))
        assert os.environ[DEVICES_ENV] == "0,1"
    assert given["env"][DEVICES_ENV] == "2,3"


def test_a_record_staler_than_the_resumed_run_allows_is_refused_by_name(tmp_path):
    """A round recorded under --max-staleness 2 to sample with round r-3's checkpoint, resumed with
    K=1: repeating the record would break the bound, so the run stops, naming the file and the K."""
    from assets.overlap import StorePlan
    from pipeline.errors import DataError
    from pipeline.run.checkpoints import write_sampling_plan
    from pipeline.store import Tables

    tables = Tables(tmp_path)
    write_sampling_plan(tables.root, 4, 1, "exact", 2)
    assert StorePlan(tables, "exact", 2).recorded(4) == 1
    assert StorePlan(tables, "bound", 3).recorded(4) == 1
    with pytest.raises(DataError, match=r"round=4/sampling.json: .*older than --max-staleness 1 allows \(round 2 or newer\)"):
        StorePlan(tables, "exact", 1).recorded(4)
